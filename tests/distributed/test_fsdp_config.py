"""``actor.strategy`` and ``actor.fsdp``: validated once, and FSDP2 refused in a single process with the reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dapo.config.schema import ActorConfig, FsdpConfig
from dapo.distributed.fsdp import check_strategy
from dapo.distributed.world import World


def test_defaults_are_the_replicated_actor() -> None:
    cfg = ActorConfig()
    assert cfg.strategy == "replicated" and cfg.fsdp == FsdpConfig()
    assert (cfg.fsdp.param_dtype, cfg.fsdp.reduce_dtype, cfg.fsdp.cpu_offload) == ("float32", "float32", False)


def test_fsdp_keys_without_fsdp2_are_an_error_naming_them() -> None:
    with pytest.raises(ValidationError, match=r"actor\.fsdp\.cpu_offload only apply with actor\.strategy=fsdp2"):
        ActorConfig(fsdp={"cpu_offload": True})
    ActorConfig(strategy="fsdp2", fsdp={"cpu_offload": True, "param_dtype": "bfloat16"})
    with pytest.raises(ValidationError):
        ActorConfig(strategy="fsdp3")


def test_fsdp2_needs_several_ranks() -> None:
    with pytest.raises(ValueError, match="needs at least 2"):
        check_strategy(ActorConfig(strategy="fsdp2"), World())
    check_strategy(ActorConfig(strategy="fsdp2"), World(rank=0, world_size=2))
    check_strategy(ActorConfig(), World())


def test_the_shared_prompt_layout_is_refused_for_a_sharded_actor_at_the_edge() -> None:
    with pytest.raises(ValidationError, match=r"actor\.layout=shared_prompt cannot run with actor\.strategy=fsdp2"):
        ActorConfig(strategy="fsdp2", layout="shared_prompt")
    assert ActorConfig(strategy="fsdp2").layout == "auto"  # auto resolves to padded there
