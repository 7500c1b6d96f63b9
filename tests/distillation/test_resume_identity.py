"""The teachers' identity is part of the resume check: the same path may hold another model by then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dapo.config import build_config, load_config
from dapo.distillation.local_teacher import folder_fingerprint
from dapo.training.errors import TrainingError
from dapo.training.loop import train
from dapo.training.run_state import check_resume_teachers
from tests.cli.cli_helpers import FAST
from tests.distillation.helpers import STUDENT, distill_overrides, perturbed_teacher


def test_another_teacher_at_the_same_path_stops_the_resume_unless_allowed(tmp_path: Path) -> None:
    folder = Path(perturbed_teacher(tmp_path / "teacher", seed=1))
    first = {"teacher_model": f"local {folder} sha256:{folder_fingerprint(folder)}"}
    perturbed_teacher(folder, seed=2)  # retrained in place: same path, same size, other weights
    now = {"teacher_model": f"local {folder} sha256:{folder_fingerprint(folder)}"}
    assert first != now
    cfg = build_config(None, [])
    with pytest.raises(TrainingError, match="(?s)other distillation teachers.*teacher_model: local"):
        check_resume_teachers(first, now, cfg)
    check_resume_teachers(first, first, cfg)  # the same teacher resumes
    check_resume_teachers(first, now, build_config(None, ["trainer.resume_with_changes=true"]))
    with pytest.raises(TrainingError, match="teacher_model: <none>"):  # a run trained without a teacher
        check_resume_teachers({}, now, cfg)
    assert folder_fingerprint(Path(STUDENT)) == folder_fingerprint(Path(STUDENT))


# ------------------------------------------------------------------------------------------ through real runs
def _run(root: Path, teacher: str, steps: int, *more: str) -> int:
    """A `dapo train` of the tiny model in ``root/run`` with ``teacher``, to ``steps``; the steps this call ran."""
    cfg = load_config(
        None,
        [
            *FAST,
            f"trainer.total_training_steps={steps}",
            "trainer.test_freq=0",
            "trainer.progress=false",
            *distill_overrides(teacher),
            *more,
            f"trainer.default_local_dir={root}",
            "trainer.experiment_name=run",
        ],
    )
    return train(cfg).steps_run


def _step0(root: Path) -> dict:
    records = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if r["step"] == 0)


def test_resuming_with_another_teacher_is_refused(tmp_path: Path) -> None:
    """A run's checkpoint resumes only with the teacher it was trained with: another path is a changed
    hyper-parameter; the same path holding other weights (the config is then the same) is the teacher identity's
    refusal. Both continue with trainer.resume_with_changes=true."""
    first = perturbed_teacher(tmp_path / "teacher-a", seed=1)
    assert _run(tmp_path, first, 2) == 2
    other = perturbed_teacher(tmp_path / "teacher-b", seed=2)
    with pytest.raises(TrainingError, match=r"teacher_model\.model_path: '.*teacher-a' -> '.*teacher-b'"):
        _run(tmp_path, other, 3)
    perturbed_teacher(Path(first), seed=3)  # the first path, retrained in place
    with pytest.raises(TrainingError, match="(?s)other distillation teachers.*teacher_model: local .*teacher-a"):
        _run(tmp_path, first, 3)
    assert _run(tmp_path, first, 3, "trainer.resume_with_changes=true") == 1  # resumed: the one step left
    assert _run(tmp_path, first, 4) == 1  # the checkpoint now records the retrained teacher: it resumes plainly


def test_validation_logs_the_teachers_accuracy_beside_the_students(tmp_path: Path) -> None:
    """At step 0 each local teacher validates on the student's prompts with the student's seed: the student as its
    own teacher scores exactly the student's accuracy there, and another teacher is logged beside it."""
    assert _run(tmp_path / "self", STUDENT, 1) == 1
    step0 = _step0(tmp_path / "self")
    key = next(k for k in step0 if k.startswith("val/acc/mean@") and k.count("/") == 2)
    assert step0[f"distill/teacher/teacher_model/{key}"] == step0[key]
    assert _run(tmp_path / "other", perturbed_teacher(tmp_path / "teacher", seed=1), 1) == 1
    step0 = _step0(tmp_path / "other")
    assert 0.0 <= step0[f"distill/teacher/teacher_model/{key}"] <= 1.0 and 0.0 <= step0[key] <= 1.0
