"""The teachers' identity is part of the resume check: the same path may hold another model by then."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo.config import build_config
from dapo.distillation.local_teacher import folder_fingerprint
from dapo.training.errors import TrainingError
from dapo.training.run_state import check_resume_teachers
from tests.distillation.helpers import STUDENT, perturbed_teacher


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
