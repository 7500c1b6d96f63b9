"""Each bad input gets a clear message (no traceback), and the run directory is never left corrupt.

Most commands run in this process (``run_dapo_in_process``: the same click command, exit code, stderr and log lines,
an escaped exception shows as a Traceback), which spares a ~10 s interpreter start-up each. A real ``dapo`` process
still runs where the process itself is the point: the start-up failure of a missing model (the clean exit a user
sees), and the full disk (an rlimit on the child); both are forked from a warm server (``run_dapo_warm``: a separate
process with its own exit code, pipes and limits, without ~8 s of imports each).
"""

from __future__ import annotations

import json
import shutil

from dapo.infra.checkpoint import find_latest_checkpoint
from dapo.model.loading import EMBEDDED_MODEL_DIR
from tests.harness.runners import run_dapo_in_process, run_dapo_warm


def _clean_failure(proc, *needles: str) -> None:
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in:\n{proc.stderr[-3000:]}"


def test_missing_model_path(tmp_path, fast_args):
    proc = run_dapo_warm(["train", *fast_args, f"model.path={tmp_path / 'no-such-model'}"], tmp_path)
    _clean_failure(proc, "model.path", "no-such-model", "does not exist")


def test_tokenizer_without_chat_template(tmp_path, fast_args):
    model_dir = tmp_path / "model"
    shutil.copytree(EMBEDDED_MODEL_DIR, model_dir)
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = model_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    proc = run_dapo_in_process(["train", *fast_args, f"model.path={model_dir}"], tmp_path)
    _clean_failure(proc, "no chat template", str(model_dir))


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(problem: str, answer: str) -> dict:
    return {
        "data_source": "synth_arith",
        "prompt": [{"role": "user", "content": problem}],
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {},
    }


def test_prompt_longer_than_max_prompt_length_error_names_the_row(tmp_path, fast_args):
    rows = [_row("What is 2 + 3?", "5")] * 3 + [_row("What is 2 + 3? " * 200, "5")]
    data = _write_jsonl(tmp_path / "train.jsonl", rows)
    proc = run_dapo_in_process(
        [
            "train",
            *fast_args,
            f"data.train_files=[{data}]",
            f"data.val_files=[{data}]",
            "data.filter_overlong_prompts=error",
        ],
        tmp_path,
    )
    _clean_failure(proc, "row 3", "data.max_prompt_length")


def test_prompt_longer_than_max_prompt_length_dropped_with_a_count(tmp_path, fast_args):
    rows = [_row(f"What is {i} + 3?", str(i + 3)) for i in range(8)] + [_row("What is 2 + 3? " * 200, "5")]
    data = _write_jsonl(tmp_path / "train.jsonl", rows)
    proc = run_dapo_in_process(
        ["train", *fast_args, f"data.train_files=[{data}]", "trainer.total_training_steps=1"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dropped 1 prompts longer than data.max_prompt_length" in proc.stderr


def test_bad_record_names_file_row_and_field(tmp_path, fast_args):
    rows = [_row("What is 2 + 3?", "5"), {**_row("What is 1 + 1?", "2"), "reward_model": {"style": "rule"}}]
    data = _write_jsonl(tmp_path / "bad.jsonl", rows)
    proc = run_dapo_in_process(["train", *fast_args, f"data.train_files=[{data}]"], tmp_path)
    _clean_failure(proc, "bad.jsonl", "row 1", "ground_truth")


def test_every_group_filtered_stops_with_the_cause(tmp_path, fast_args):
    # Ground truths the model never produces: every group is all-wrong, so dynamic sampling can never fill a batch.
    rows = [_row(f"What is {i} + 3?", "987654321") for i in range(16)]
    data = _write_jsonl(tmp_path / "impossible.jsonl", rows)
    proc = run_dapo_in_process(
        [
            "train",
            *fast_args,
            f"data.train_files=[{data}]",
            "algorithm.filter_groups.on_exhausted=error",
            "algorithm.filter_groups.max_num_gen_batches=2",
        ],
        tmp_path,
    )
    _clean_failure(proc, "all-wrong", "max_num_gen_batches")


def test_non_finite_loss_or_weights_stop_cleanly(tmp_path, fast_args):
    # An absurd learning rate drives the weights to inf/NaN in the first update (with the default grad_clip the
    # gradient norm stays finite); the run must stop where it happens, naming step, phase and the fix, never in the
    # sampler of the next step, and the last complete checkpoint must stay loadable.
    for mini_batch in (2, 4):  # 4: one optimizer step per update, the weights stay finite but the logits overflow
        proc = run_dapo_in_process(
            [
                "train",
                *fast_args,
                "trainer.total_training_steps=4",
                "trainer.save_freq=1",
                "actor.optim.lr=1e30",
                f"actor.ppo_mini_batch_size={mini_batch}",
                f"trainer.experiment_name=nan{mini_batch}",
            ],
            tmp_path,
        )
        _clean_failure(proc, "step 1, phase update_actor", "non-finite", "actor.optim.lr")
        assert "stale" not in proc.stderr and "out of bounds" not in proc.stderr
    latest = find_latest_checkpoint(tmp_path / "nan2" / "checkpoints")
    assert latest is None or (latest / "hf" / "model.safetensors").exists()


def test_full_disk_at_checkpoint_time_keeps_the_previous_checkpoint(tmp_path, fast_args):
    first = run_dapo_in_process(
        ["train", *fast_args, "trainer.experiment_name=disk", "trainer.total_training_steps=1"], tmp_path
    )
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "disk"
    assert find_latest_checkpoint(run_dir / "checkpoints").name == "global_step_1"
    # a real write failure (EFBIG) in the child, like a full disk
    proc = run_dapo_warm(
        ["train", *fast_args, "trainer.experiment_name=disk", "trainer.total_training_steps=2"],
        tmp_path,
        fsize_limit=256 * 1024,
    )
    _clean_failure(proc, "global_step_1 is intact")
    assert find_latest_checkpoint(run_dir / "checkpoints").name == "global_step_1"
    assert not [p for p in (run_dir / "checkpoints").iterdir() if "tmp" in p.name]


def test_custom_reward_function_missing_or_raising(tmp_path, fast_args):
    proc = run_dapo_in_process(["train", *fast_args, f"custom_reward_function.path={tmp_path / 'nope.py'}"], tmp_path)
    _clean_failure(proc, "custom_reward_function", "nope.py", "not found")
    broken = tmp_path / "broken_reward.py"
    broken.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise ValueError('this scorer is broken')\n"
    )
    proc = run_dapo_in_process(["train", *fast_args, f"custom_reward_function.path={broken}"], tmp_path)
    _clean_failure(proc, "this scorer is broken", "every call to the custom reward function", "not the data")


def test_custom_reward_function_is_used(tmp_path, fast_args):
    # A real custom function that rewards every response: every group is all-correct, so with dynamic sampling
    # on and on_exhausted=error the run must stop and say so -- proof that the custom function decided the reward.
    always = tmp_path / "always_right.py"
    always.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    proc = run_dapo_in_process(
        [
            "train",
            *fast_args,
            f"custom_reward_function.path={always}",
            "algorithm.filter_groups.on_exhausted=error",
            "algorithm.filter_groups.max_num_gen_batches=1",
        ],
        tmp_path,
    )
    _clean_failure(proc, "all-correct")


def test_bad_data_wins_over_a_missing_model_so_it_is_checked_first(tmp_path, fast_args):
    rows = [_row("What is 2 + 3?", "5"), {**_row("What is 1 + 1?", "2"), "reward_model": {"style": "rule"}}]
    data = _write_jsonl(tmp_path / "bad.jsonl", rows)
    proc = run_dapo_in_process(
        ["train", *fast_args, f"data.train_files=[{data}]", f"model.path={tmp_path / 'no-such-model'}"], tmp_path
    )
    _clean_failure(proc, "bad.jsonl", "row 1", "ground_truth")
    assert "no-such-model" not in proc.stderr


def test_overlong_prompt_in_a_multi_file_data_set_names_its_file_and_row(tmp_path, fast_args):
    first = _write_jsonl(tmp_path / "a.jsonl", [_row(f"What is {i} + 3?", str(i + 3)) for i in range(4)])
    second = _write_jsonl(tmp_path / "b.jsonl", [_row("What is 2 + 3?", "5"), _row("What is 2 + 3? " * 200, "5")])
    proc = run_dapo_in_process(
        ["train", *fast_args, f"data.train_files=[{first},{second}]", "data.filter_overlong_prompts=error"], tmp_path
    )
    # row 5 of the concatenated set is row 1 of b.jsonl, line 2
    _clean_failure(proc, f"data.train_files: {second}, row 1 (line 2) has a prompt of", "data.max_prompt_length")


def test_unwritable_end_of_run_plot_is_a_warning_after_a_complete_run(tmp_path, fast_args):
    run_dir = tmp_path / "tiny-synth"
    run_dir.mkdir()
    (run_dir / "plots").write_text("a file where the plots folder goes")
    proc = run_dapo_in_process(["train", *fast_args, "trainer.total_training_steps=1"], tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        f"warning: writing the plot {run_dir / 'plots' / 'training.png'} failed: a file of that name is in"
        in proc.stderr
    )
    assert "done: 1 steps" in proc.stdout and "plots: not written" in proc.stdout
    assert find_latest_checkpoint(run_dir / "checkpoints").name == "global_step_1"


def test_lora_rank_above_the_model_width_is_refused(tmp_path, fast_args):
    # The embedded tiny model's narrowest linear layer (k_proj / v_proj) is far below 4096 wide.
    proc = run_dapo_in_process(["train", *fast_args, "actor_rollout_ref.model.lora_rank=4096"], tmp_path)
    _clean_failure(proc, "model.lora_rank=4096 exceeds", "targeted linear layers")


def test_absurd_lora_rank_is_refused_before_loading(tmp_path, fast_args):
    proc = run_dapo_in_process(["train", *fast_args, "actor_rollout_ref.model.lora_rank=1000000000"], tmp_path)
    _clean_failure(proc, "lora_rank")


def test_a_run_that_skips_every_optimizer_step_fails(tmp_path, fast_args):
    # alpha / rank = 1e30 / 8 scales the adapters' gradient to inf: every optimizer step is skipped.
    proc = run_dapo_in_process(
        [
            "train",
            *fast_args,
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_alpha=1e30",
            "trainer.max_consecutive_skipped_steps=1",
        ],
        tmp_path,
    )
    _clean_failure(proc, "consecutive optimizer steps were skipped", "trainer.max_consecutive_skipped_steps=1")
