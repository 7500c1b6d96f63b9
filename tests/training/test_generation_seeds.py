"""Seeds of the training and validation sampling: per-prompt seeds depend on a prompt's index in the whole batch only,
so every split of a batch among ranks hands the engine the same seeds for the same prompts."""

from __future__ import annotations

from dapo.config import load_config
from dapo.distributed.data_parallel import generation_share
from dapo.distributed.world import World
from dapo.training.generation import derive_seed, prompt_seeds, rollout_params, share_params


def test_prompt_seeds_are_a_function_of_the_global_index() -> None:
    whole = prompt_seeds(123, slice(0, 7))
    assert prompt_seeds(123, slice(3, 7)) == whole[3:]
    assert len(set(whole)) == 7 and all(0 <= s < 1 << 63 for s in whole)
    assert prompt_seeds(124, slice(0, 7)) != whole
    assert derive_seed(1, "x") == derive_seed(1, "x", bits=63) & 0x7FFFFFFF < 1 << 31  # 31 bits by default


def test_every_split_hands_out_the_single_process_seeds() -> None:
    params = rollout_params(load_config(), step=3, rnd=1)
    alone = share_params(params, generation_share(5, World()), World())
    assert alone.seed == params.seed  # one process: the round seed itself, as before
    for size in (2, 3):
        shares = [
            share_params(params, generation_share(5, World(rank=r, world_size=size)), World(rank=r, world_size=size))
            for r in range(size)
        ]
        assert tuple(s for p in shares for s in p.prompt_seeds) == alone.prompt_seeds
        assert len({p.seed for p in shares}) == size  # the call seeds (vLLM's) still differ by rank
    assert rollout_params(load_config(), step=3, rnd=2).seed != params.seed
