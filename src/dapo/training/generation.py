"""Algorithm 1, lines 3-9: sample prompts, generate G responses each, score them, keep informative groups (Eq. 11),
and repeat until the batch is full.

Across data-parallel ranks (``dapo.distributed.data_parallel``) every rank draws the same prompts, generates and
scores its share, and the scored groups are gathered, so that everything after generation (Eq. 11, the buffer, the
sampler's pass-rate record, the metrics) runs identically on every rank. Validation is shared the same way.

Sampling is rank-invariant: each prompt's samples are drawn with a seed of its own, a function of (run seed, step,
round, the prompt's index in the whole generation batch) only (:func:`prompt_seeds`), and the Hugging Face engine
draws sample j of a prompt from a stream keyed by that seed and j alone (``SamplingParams.prompt_seeds``). So N ranks
generate exactly the responses one process generates from the same seed, up to float rounding of the logits in
differently shaped batches (tests/distributed/test_rank_invariance.py), and a resumed run draws the same seeds again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable

import torch

from dapo.config import DapoConfig
from dapo.core.dynamic_sampling import filter_informative_groups
from dapo.data.prompts import PromptItem
from dapo.distributed.data_parallel import engine_index, gather_in_rank_order, generation_share, is_engine_leader
from dapo.distributed.world import World
from dapo.evaluation.validation import summarize_validation, validation_groups
from dapo.infra.timing import PhaseTimer
from dapo.reward.batch import RewardScorer
from dapo.reward.scored_groups import ScoredGroup, group_index_of, score_rollout
from dapo.rollout.base import RolloutEngine, SamplingParams
from dapo.rollout.factory import engine_capabilities
from dapo.training.run_state import RunState
from dapo.training.staleness import oldest_token_version
from dapo.training.tool_use import tool_metrics

log = logging.getLogger(__name__)

FAILURE_METRICS = {"timeout": "reward/timeouts", "worker_crash": "reward/worker_crashes", "error": "reward/errors"}


def derive_seed(*parts: object, bits: int = 31) -> int:
    """A stable ``bits``-bit seed from (run seed, step, round, ...): rollouts reproduce exactly across resumes.

    31 bits by default (any torch or vLLM seed); per-prompt seeds take 63, so that the prompts of a batch practically
    never share one."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << bits) - 1)


def engine_tensor_parallel(cfg: DapoConfig) -> int:
    """Ranks per rollout engine: the tensor-parallel size of an engine that has tensor parallelism (vLLM); one rank
    each for the others (the Transformers engine)."""
    tensor_parallel = engine_capabilities(cfg.rollout.name).tensor_parallel
    return cfg.rollout.tensor_model_parallel_size if tensor_parallel else 1


def rank_seed(seed: int, world: World, tensor_parallel: int = 1) -> int:
    """``seed`` for this rank's engine: itself alone, else one per engine, so that engines that cannot take per-prompt
    seeds (vLLM) do not draw the same random numbers for their different shares, while the ranks of one
    tensor-parallel engine draw the same ones (they must sample identically)."""
    if not world.distributed:
        return seed
    return derive_seed(seed, "rank", engine_index(world, tensor_parallel)[0])


def prompt_seeds(seed: int, share: slice) -> tuple[int, ...]:
    """The seeds of the prompts at positions ``share`` of a batch sampled with ``seed``: a function of the position
    in the whole batch, not of the rank that generates it, so every split of the batch samples alike."""
    return tuple(derive_seed(seed, "prompt", i, bits=63) for i in range(share.start, share.stop))


def rollout_params(cfg: DapoConfig, step: int, rnd: int) -> SamplingParams:
    """Training sampling for round ``rnd`` of ``step``; every round has its own seed, so a resumed run samples the
    same (:func:`share_params` turns it into per-prompt seeds for a rank's share)."""
    r = cfg.rollout
    return SamplingParams(
        n=r.n,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=cfg.data.max_response_length,
        seed=derive_seed(cfg.trainer.seed, "rollout", step, rnd),
    )


def share_params(params: SamplingParams, share: slice, world: World, tensor_parallel: int = 1) -> SamplingParams:
    """``params`` (seeded for the whole batch) for this rank's ``share`` of the batch: the prompts' own seeds, and a
    call seed of the engine's own for engines that ignore them."""
    assert params.seed is not None, "training and validation sampling is always seeded"
    return dataclasses.replace(
        params, seed=rank_seed(params.seed, world, tensor_parallel), prompt_seeds=prompt_seeds(params.seed, share)
    )


def generate_round(
    engine: RolloutEngine,
    prompts: list[PromptItem],
    tokenizer,
    cfg: DapoConfig,
    params: SamplingParams,
    timer: PhaseTimer,
    scorer: RewardScorer | None,
    world: World,
) -> list[ScoredGroup]:
    """The scored groups of ``prompts``, in prompt order, on every rank; each rank generates and scores its share
    (``params`` are those of the whole batch)."""
    tp = engine_tensor_parallel(cfg)
    where = generation_share(len(prompts), world, tp)
    share = prompts[where]
    groups: list[ScoredGroup] = []
    generated = None
    if share:  # more engines than prompts: a rank may have none, and still joins the gather
        with timer("gen"):
            rollout = engine.generate([p.input_ids for p in share], share_params(params, where, world, tp))
        if tp > 1:  # checked among the ranks of each engine in the gather
            generated = rollout.response_ids
        if is_engine_leader(world, tp):  # a tensor-parallel engine's other ranks hold the same rollout
            with timer("reward"):
                groups = score_rollout(share, rollout, tokenizer, cfg, scorer)
    if not world.distributed:
        return groups
    with timer("gather"):  # also where a rank waits for the slowest one's generation
        return gather_in_rank_order(groups, world, tp, generated=generated)


def validate_across_ranks(
    engine: RolloutEngine, prompts: list[PromptItem], tokenizer, cfg: DapoConfig, *, seed: int, world: World
) -> dict[str, float]:
    """Validation with the prompts shared among engines; the summary of all groups, identical on every rank and
    (per-prompt seeds, as in training) equal to one process's."""
    tp = engine_tensor_parallel(cfg)
    where = generation_share(len(prompts), world, tp)
    seeds = dict(seed=rank_seed(seed, world, tp), prompt_seeds=prompt_seeds(seed, where))
    share = prompts[where]
    groups = validation_groups(engine, share, tokenizer, cfg, **seeds) if share else []
    if world.distributed:
        generated = [r for g in groups for r in g.response_ids] if tp > 1 else None
        groups = gather_in_rank_order(groups, world, tp, generated=generated)
    return summarize_validation(groups, cfg.rollout.val_kwargs.n)


def generate_and_filter(
    engine: RolloutEngine,
    state: RunState,
    tokenizer,
    cfg: DapoConfig,
    step: int,
    timer: PhaseTimer,
    scorer: RewardScorer | None = None,
    world: World = World(),
    on_round: Callable[[list[ScoredGroup]], None] | None = None,
    oldest_version: int | None = None,
) -> tuple[list[ScoredGroup], dict[str, float]]:
    """Generation rounds of gen_batch_size prompts until train_batch_size informative groups are held.

    ``scorer`` (kept for the run) applies the reward failure policy; its failed calls of this step are reported as
    ``reward/timeouts``, ``reward/worker_crashes`` and ``reward/errors``.

    Compute spent without gradient is measured in ``train/wasted_tokens``: the response tokens of groups Eq. 11 dropped
    plus those of surplus groups discarded (not carried over), against ``train/generated_tokens``; both also as run
    totals (``*_total``, kept in the checkpoint). Every drawn prompt's pass rate goes to the sampler's record (a no-op
    unless ``algorithm.filter_groups.skip_solved_prompts.enable``), and the prompts it skipped as solved are counted in
    ``train/num_skipped_solved_prompts``. ``on_round`` sees every round's groups, kept or not (the FLOP count of
    ``dapo.training.perf_metrics``). With several ranks (``world``) each generates its share of every round and
    all of them return the same groups and metrics (reward failures summed over ranks).

    ``oldest_version`` (an asynchronous batch, ``dapo.training.producers``): the oldest weight version a token of
    this batch may have. Groups carried over from the previous batch (``carry_over_surplus``) whose oldest token is
    older are dropped before the rounds, which refill the batch: ``async/stale_dropped_groups``, their tokens wasted."""
    buffer = state.buffer
    stale: list[ScoredGroup] = []
    if oldest_version is not None:
        stale = buffer.drop_held(
            lambda g: oldest_token_version(g, default=oldest_version) < oldest_version,
            tokens_of=lambda g: g.num_response_tokens,
        )
    failures_before = dict(scorer.counts) if scorer is not None else {}
    skipped_before = state.sampler.num_skipped_solved
    generated_acc: list[float] = []
    generated_tokens = 0
    generated_groups: list[ScoredGroup] = []  # for the tool/* metrics of multi-turn rollouts
    rnd = 0
    while buffer.should_generate_more():
        draws = state.sampler.next_draws(cfg.data.effective_gen_batch_size)
        prompts = [d.item for d in draws]
        groups = generate_round(engine, prompts, tokenizer, cfg, rollout_params(cfg, step, rnd), timer, scorer, world)
        if on_round is not None:
            on_round(groups)
        acc = torch.tensor([float(a) for g in groups for a in g.acc])
        decision = filter_informative_groups(acc, group_index_of(groups))  # Eq. 11, on raw accuracy
        state.sampler.record_pass_rates(draws, decision.pass_rate.tolist())  # groups come in prompt order
        keep = decision.keep.tolist() if cfg.filters_groups else [True] * len(groups)
        buffer.add_round(
            [g for g, k in zip(groups, keep) if k],
            num_groups_generated=len(groups),
            num_all_correct=decision.num_all_correct,
            num_all_wrong=decision.num_all_wrong,
            wasted_tokens=sum(g.num_response_tokens for g, k in zip(groups, keep) if not k),
        )
        generated_acc.extend(acc.tolist())
        generated_groups.extend(g for g in groups if g.tool_categories is not None)
        generated_tokens += sum(g.num_response_tokens for g in groups)
        rnd += 1
        if rnd % 10 == 0:  # unlimited rounds (max_num_gen_batches <= 0) must still show that they are running
            log.info(
                "step %d: %d generation rounds so far, %d of %d groups kept",
                step,
                rnd,
                buffer.num_groups,
                cfg.data.train_batch_size,
            )
    kept, report = buffer.pop_batch(tokens_of=lambda g: g.num_response_tokens)
    state.generated_tokens_total += generated_tokens
    state.wasted_tokens_total += report.wasted_tokens
    if report.partial:
        log.warning(
            "step %d: dynamic sampling gave up after %d rounds; training on %d of %d groups",
            step,
            report.num_gen_batches,
            len(kept),
            cfg.data.train_batch_size,
        )
    failures = {
        FAILURE_METRICS[kind]: float(n - failures_before[kind])
        for kind, n in (scorer.counts.items() if scorer is not None else ())
    }
    if world.distributed and failures:  # each rank's scorer saw only its share
        summed = world.all_reduce_sum(torch.tensor(list(failures.values()), dtype=torch.float64)).tolist()
        failures = dict(zip(failures, summed))
    return kept, {
        **failures,
        "train/num_gen_batches": float(report.num_gen_batches),
        "train/kept_group_ratio": float(report.kept_group_ratio),
        "train/wasted_tokens": float(report.wasted_tokens),
        "train/wasted_tokens_total": float(state.wasted_tokens_total),
        "train/generated_tokens": float(generated_tokens),
        "train/generated_tokens_total": float(state.generated_tokens_total),
        "train/num_discarded_surplus_groups": float(report.num_groups_discarded),
        "train/num_skipped_solved_prompts": float(state.sampler.num_skipped_solved - skipped_before),
        "train/num_skipped_solved_prompts_total": float(state.sampler.num_skipped_solved),
        "train/num_all_correct_groups": float(report.num_all_correct),
        "train/num_all_wrong_groups": float(report.num_all_wrong),
        "train/partial_batch": float(report.partial),
        "rollout/acc/mean": sum(generated_acc) / max(1, len(generated_acc)),
        "rollout/num_tokens": float(generated_tokens),
        **tool_metrics(generated_groups),
        # several rollout ranks (dapo.rollout.fleet): the samples each engine generated while this batch was made
        **getattr(engine, "take_engine_counts", dict)(),
        **({} if oldest_version is None else {"async/stale_dropped_groups": float(len(stale))}),
    }
