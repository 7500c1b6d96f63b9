"""Run under torchrun with 2 ranks: the ranks of one tensor-parallel rollout engine gather their outputs once when
they agree, and refuse them, on every rank, when they do not."""

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
world.barrier()
world.close()
# Leave without C++ static destructors (see dp_update_worker.py): the checks above are done and printed.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
