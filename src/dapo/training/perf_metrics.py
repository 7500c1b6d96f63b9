"""Per-step efficiency metrics: model FLOPs of generation and of the actor's update, FLOP/s, MFU and tokens/s.

The FLOP model is ``dapo.infra.perf`` (formula and citations there); this module applies it to the real token counts
of a step: every group generated in every round (also the ones dynamic sampling drops, which cost generation all the
same), and for the actor the samples its update really trains (``dapo.actor.mini_batch_plan.trained_samples``:
zero-advantage and overlong-filtered samples cost nothing there) in each of ``actor.ppo_epochs`` passes, forward and
backward, plus a forward over the whole batch when pi_old is recomputed.

Metrics (verl's names where verl has one), per device: with several ranks the step's FLOPs and tokens are divided by
the world size, and the time is this rank's wall time of the phase (waits included).

    perf/flops/{rollout,actor}          model FLOPs of the step's phase, whole job
    perf/flops_per_s/{rollout,actor}    achieved, per device
    perf/mfu/{rollout,actor}            achieved / peak of one device (perf/peak_flops/{rollout,actor}), at most 1
    perf/tokens_per_s/rollout           generated response tokens per second per device
    perf/tokens_per_s/actor             trained sequence tokens (prompt + response of each trained sample, per epoch)
                                        per second of the update, per device
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from dapo.actor.mini_batch_plan import trained_samples
from dapo.config import DapoConfig
from dapo.infra.perf import PeakFlops, TransformerShape, group_forward_flops, mfu, peak_flops
from dapo.reward.scored_groups import ScoredGroup
from dapo.training.train_batch import build_train_batch


def precision_of(dtype: torch.dtype) -> str:
    """The peak table's precision for a compute dtype (fp16 runs on the same tensor cores as bf16)."""
    return "fp32" if dtype == torch.float32 else "bf16"


class StepPerf:
    """Counts a step's generated groups (:meth:`count_generated`, called once per generation round) and turns them
    and the trained batch into the step's metrics (:meth:`metrics`, which starts the next step's count)."""

    def __init__(
        self,
        shape: TransformerShape,
        cfg: DapoConfig,
        *,
        actor_peak: PeakFlops,
        rollout_peak: PeakFlops,
        num_devices: int = 1,
    ) -> None:
        self.shape = shape
        self.cfg = cfg
        self.actor_peak = actor_peak
        self.rollout_peak = rollout_peak
        self.num_devices = num_devices
        self._gen_flops = 0
        self._gen_tokens = 0

    @classmethod
    def for_run(
        cls, model: torch.nn.Module, cfg: DapoConfig, *, engine_dtype: torch.dtype, num_devices: int = 1
    ) -> StepPerf:
        """For the actor ``model`` (its config gives the shape; its device and ``actor.dtype`` the peak)."""
        device = next(model.parameters()).device
        actor_peak = peak_flops(device, cfg.actor.dtype)
        rollout_precision = precision_of(engine_dtype)
        rollout_peak = actor_peak if rollout_precision == cfg.actor.dtype else peak_flops(device, rollout_precision)
        return cls(model.config, cfg, actor_peak=actor_peak, rollout_peak=rollout_peak, num_devices=num_devices)

    def count_generated(self, groups: Sequence[ScoredGroup]) -> None:
        for g in groups:
            lengths = [len(r) for r in g.response_ids]
            self._gen_flops += group_forward_flops(self.shape, len(g.prompt.input_ids), lengths)
            self._gen_tokens += sum(lengths)

    def actor_flops(self, groups: Sequence[ScoredGroup], *, recomputed: bool) -> tuple[int, int]:
        """(model FLOPs, trained sequence tokens) of the update on ``groups``: ``ppo_epochs`` x (forward + backward =
        3 forwards) over the trained samples, plus one forward over every sample when pi_old is recomputed."""
        batch = build_train_batch(groups, self.cfg)
        trained = set(trained_samples(batch, self.cfg.actor))
        update = everything = tokens = 0
        i = 0
        for g in groups:
            prompt = len(g.prompt.input_ids)
            lengths = [len(r) for r in g.response_ids]
            kept = [n for j, n in enumerate(lengths) if i + j in trained]
            i += len(lengths)
            if kept:
                update += group_forward_flops(self.shape, prompt, kept)
                tokens += sum(prompt + n for n in kept)
            if recomputed:
                everything += group_forward_flops(self.shape, prompt, lengths)
        epochs = self.cfg.actor.ppo_epochs
        return epochs * 3 * update + everything, epochs * tokens

    def metrics(
        self, groups: Sequence[ScoredGroup], seconds: Mapping[str, float], *, recomputed: bool
    ) -> dict[str, float]:
        """The step's ``perf/*`` efficiency metrics from its trained ``groups`` and phase ``seconds`` (PhaseTimer)."""
        n = self.num_devices
        out: dict[str, float] = {}
        gen_s = seconds.get("gen", 0.0)
        if self._gen_flops and gen_s > 0:
            achieved = self._gen_flops / n / gen_s
            out.update(
                {
                    "perf/flops/rollout": float(self._gen_flops),
                    "perf/flops_per_s/rollout": achieved,
                    "perf/peak_flops/rollout": self.rollout_peak.flops_per_s,
                    "perf/mfu/rollout": mfu(achieved, self.rollout_peak),
                    "perf/tokens_per_s/rollout": self._gen_tokens / n / gen_s,
                }
            )
        self._gen_flops = self._gen_tokens = 0
        actor_s = seconds.get("old_log_prob", 0.0) + seconds.get("update_actor", 0.0)
        if groups and actor_s > 0:
            flops, tokens = self.actor_flops(groups, recomputed=recomputed)
            achieved = flops / n / actor_s
            out.update(
                {
                    "perf/flops/actor": float(flops),
                    "perf/flops_per_s/actor": achieved,
                    "perf/peak_flops/actor": self.actor_peak.flops_per_s,
                    "perf/mfu/actor": mfu(achieved, self.actor_peak),
                    "perf/tokens_per_s/actor": tokens / n / max(seconds.get("update_actor", 0.0), 1e-9),
                }
            )
        return out
