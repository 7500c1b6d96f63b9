"""The policy losses a config may name: ``dapo.core``'s registry (``dapo.core.policy_loss.POLICY_LOSSES``), whose
entries say which config keys each loss reads and which paper values it takes, so that the schema's validation and
the objective's explanations read them there instead of spelling the names again.

The registry is imported when a config is validated, not when ``dapo.config`` is: every CLI command imports
``dapo.config`` before it may load torch (``tests/cli/test_openmp.py``), and the losses are torch code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dapo.core.policy_loss import PolicyLoss


def registered_policy_losses() -> Mapping[str, PolicyLoss]:
    """Every registered loss by its ``actor.policy_loss.loss_mode`` (the losses of ``dapo.core`` and any registered
    since)."""
    import dapo.core  # noqa: F401  (imports every loss of dapo/core, which registers it)
    from dapo.core.policy_loss import POLICY_LOSSES

    return POLICY_LOSSES


def registered_policy_loss(name: str) -> PolicyLoss:
    """The entry of ``name``; ``ValueError`` listing the registered names otherwise (pydantic reports it under the
    key)."""
    from dapo.core.policy_loss import unknown_policy_loss

    losses = registered_policy_losses()
    if name not in losses:
        raise ValueError(unknown_policy_loss(name))
    return losses[name]


def knob_parameter(knob: str) -> str:
    """The ``PolicyLossParams`` field a knob arrives in: the last part of its key (``policy_loss.clip_cov_ratio`` ->
    ``clip_cov_ratio``)."""
    return knob.rsplit(".", 1)[-1]


def knob_parameters() -> frozenset[str]:
    """The fields of ``PolicyLossParams`` a knob can arrive in (every one but the random source)."""
    from dapo.core.policy_loss import PolicyLossParams

    return frozenset(f.name for f in dataclasses.fields(PolicyLossParams)) - {"generator"}


def knob_value(actor: object, knob: str) -> object:
    """The value of a knob, a key of ``actor`` (the ``ActorConfig``; not imported here: the schema imports this) (``clip_ratio_low``, ``policy_loss.clip_cov_ratio``)."""
    node: object = actor
    for part in knob.split("."):
        node = getattr(node, part)
    return node
