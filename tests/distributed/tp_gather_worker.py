"""Run under torchrun with 2 ranks: the ranks of one tensor-parallel rollout engine gather their outputs once when
they agree, and refuse them, on every rank, when they do not.

With ``--vllm-engines`` the same launch then gives every rank a vLLM engine of its own (tensor_parallel_size=1,
joined to this process group through vLLM's ``external_launcher``, as ``dapo train`` builds it under torchrun): the
engines decode different work independently, each receives the replicated actor's updates (the weight-sync probe after
every push, < 1e-4 in fp32), and closing them leaves this process group standing for a collective afterwards."""

import os
import sys

from dapo.distributed.data_parallel import gather_in_rank_order
from dapo.distributed.world import World

world = World.from_env()
# Both ranks form one engine (tp=2): only the first rank's items are taken; its peer passes none.
items = ["g0", "g1"] if world.rank == 0 else []
assert gather_in_rank_order(items, world, 2, generated=[[1, 2], [3]]) == ["g0", "g1"]
assert gather_in_rank_order(items, world, 1, generated=None) == ["g0", "g1"]  # two engines: both parts, in order
print(f"rank {world.rank}: agreeing group gathered once", flush=True)
try:
    gather_in_rank_order(items, world, 2, generated=[[1, 2], [3 + world.rank]])
except RuntimeError as exc:
    assert "ranks 0 and 1 of one tensor-parallel rollout engine generated different outputs" in str(exc), exc
    print(f"rank {world.rank}: diverged group refused", flush=True)

if "--vllm-engines" in sys.argv:
    import torch

    from dapo.config import ModelConfig
    from dapo.model.loading import load_policy
    from dapo.rollout.base import SamplingParams
    from dapo.rollout.factory import build_rollout_engine
    from dapo.rollout.spec import EngineSpec, VLLMOptions
    from dapo.training.weight_sync import WeightSync

    torch.manual_seed(0)
    policy = load_policy(ModelConfig())
    engine = build_rollout_engine(
        EngineSpec(
            name="vllm",
            seed=1234,
            max_model_len=64,
            join_process_group=True,
            vllm=VLLMOptions(cpu_kvcache_space_gb=0.25),
        ),
        policy,
    )
    sync = WeightSync(engine, policy.model, [1, 72, 98, 17, 10, 18, 30, 45, 198, 44, 91, 198, 20], threshold=1e-4)
    gaps = [sync.push(0)["rollout/probe_logprob_diff"]]
    # One replicated update (the same on both ranks, as after an all-reduced optimizer step), of the size a step of
    # the trainer's learning rate moves the log-probs by (~1e-2): an engine that missed it fails the probe.
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    gaps.append(sync.push(1)["rollout/probe_logprob_diff"])
    assert all(gap < 1e-4 for gap in gaps), gaps
    # Independent engines: different numbers of prompts and tokens on each rank (ranks of one tensor-parallel engine
    # would have to decode the same requests in lockstep).
    prompts = [[1, 72, 98, 17, 10, 18, 30], [1, 72, 98, 20, 10, 19, 30]][: world.rank + 1]
    out = engine.generate(prompts, SamplingParams(n=2, max_tokens=4 + 4 * world.rank, seed=world.rank))
    tokens = sum(len(r) for r in out.response_ids)
    assert len(out.response_ids) == 2 * len(prompts) and tokens > 0, out.response_ids
    engine.close()
    # vLLM destroys the process group it runs in when it closes in a single process; here it must leave it standing.
    assert world.all_gather_objects(tokens)[world.rank] == tokens
    print(
        f"rank {world.rank}: own vllm engine followed every push (gaps {gaps}) and decoded {tokens} tokens", flush=True
    )

world.barrier()
world.close()
# Leave without C++ static destructors (see dp_update_worker.py): the checks above are done and printed.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
