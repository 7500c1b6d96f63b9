"""`dapo train` as real data-parallel processes under torchrun (gloo on CPU): two "nodes" meet through a c10d
rendezvous and train, and a failure on one rank ends the job instead of hanging it. Also the arguments and record
readers of the other launches (their runners are in tests/harness/runners.py): a run whose rank 0 alone writes its
record and whose checkpoints move between world sizes and strategies is in test_sharded_checkpoint.py; a rank that
dies, named by the survivor, in test_kill_resume_torchrun.py."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dapo.distributed.data_parallel import gather_in_rank_order, generation_share
from dapo.distributed.world import World
from tests.cli.cli_helpers import FAST
from tests.harness.ports import free_port
from tests.harness.runners import start_torchrun_warm, torchrun_warm

# Short responses (and an L_cache below them) and two validation prompts per rank keep each launch at a few seconds
# past the imports.
SMALL = [
    *FAST,
    "data.max_response_length=16",
    "reward_model.overlong_buffer.len=4",
    "data.synth.num_val=4",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    "trainer.save_freq=1",
    "trainer.logger=[jsonl]",
]


def metric_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_lines(stdout: str) -> list[str]:
    return [line.split(" |")[0] for line in stdout.splitlines() if line.startswith("step ")]


def test_generation_shares_tile_the_batch_in_order() -> None:
    for n in range(0, 9):
        for size in (1, 2, 3, 5):
            shares = [generation_share(n, World(rank=r, world_size=size)) for r in range(size)]
            assert [i for s in shares for i in range(n)[s]] == list(range(n))
            assert max(s.stop - s.start for s in shares) - min(s.stop - s.start for s in shares) <= 1
    assert gather_in_rank_order((1, 2), World()) == [1, 2]


def test_the_ranks_of_a_tensor_parallel_engine_share_one_slice() -> None:
    # 6 ranks, engines of 2 consecutive ranks: 3 engines tile 7 prompts as 3 / 2 / 2, both ranks of an engine alike.
    shares = [generation_share(7, World(rank=r, world_size=6), 2) for r in range(6)]
    assert shares == [slice(0, 3), slice(0, 3), slice(3, 5), slice(3, 5), slice(5, 7), slice(5, 7)]
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size \(4\) must divide the number of ranks \(6\)"):
        generation_share(7, World(rank=0, world_size=6), 4)


@pytest.mark.slow
def test_two_nodes_meet_through_c10d_and_train_together(tmp_path: Path) -> None:
    """Two launches of one rank each (two "nodes") meet through a c10d rendezvous. Each is torch's elastic agent with
    torchrun's flags, forked warm (``start_torchrun_warm``); torchrun's own CLI and exec per rank run in
    test_data_parallel.py and test_vllm_torchrun.py."""
    rdzv = ["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=dapo-test"]
    nodes = [
        start_torchrun_warm(
            [*SMALL, "trainer.total_training_steps=1"], tmp_path, nproc=1, rdzv=[*rdzv, f"--node-rank={node}"]
        )
        for node in (0, 1)
    ]
    with ThreadPoolExecutor(2) as pool:  # both read at once: neither node's pipes can fill while the other is waited
        outs = list(pool.map(lambda node: node.communicate(240), nodes))
    for node, (_, err) in zip(nodes, outs):
        assert node.poll() == 0, err[-4000:]
    # c10d assigns ranks itself: whichever launch holds rank 0 reports, the other stays quiet.
    assert sorted(step_lines(out) for out, _ in outs) == [[], ["step 1/1"]]
    assert metric_steps(tmp_path / "tiny-synth") == [1]
    record = json.loads((tmp_path / "tiny-synth" / "metrics.jsonl").read_text())
    assert record["timing_s/gather"] > 0 and record["actor/num_optimizer_steps"] == 2.0


@pytest.mark.slow
def test_a_failure_on_one_rank_ends_the_job(tmp_path: Path) -> None:
    fn = tmp_path / "rank1_liar.py"  # the scorer breaks its contract on rank 1 only: rank 0 waits in the gather
    fn.write_text(
        "import os\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1e39 if os.environ.get('RANK') == '1' else -1.0\n"
    )
    t0 = time.monotonic()
    proc = torchrun_warm(
        [*SMALL, "trainer.total_training_steps=1", f"custom_reward_function.path={fn}", "reward_model.num_workers=0"],
        tmp_path,
        timeout=180,
    )
    assert proc.returncode != 0
    assert "rank 1: " in proc.stderr and "beyond float32 range" in proc.stderr, proc.stderr[-4000:]
    assert time.monotonic() - t0 < 120  # torchrun stopped rank 0; no collective timeout was waited out
    assert not (tmp_path / "tiny-synth" / "checkpoints").exists()
