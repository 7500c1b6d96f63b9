"""GRPO outcome advantage (Eq. 9), token broadcast and the estimator registry."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core import (
    ADV_ESTIMATORS,
    broadcast_advantage,
    compute_grpo_outcome_advantage,
    get_adv_estimator,
    register_adv_estimator,
)

# Group 7: rewards (1, -1, 1): mean 1/3, deviations (2/3, -4/3, 2/3), unbiased var (4/9+16/9+4/9)/2 = 4/3, std 2/sqrt(3)
#   -> advantages (1/sqrt(3), -2/sqrt(3), 1/sqrt(3)).
# Group 3: rewards (1, -1): mean 0, unbiased var (1+1)/1 = 2, std sqrt(2) -> (1/sqrt(2), -1/sqrt(2)).
# Group 9: a single response -> 0.
# SCORES[i] belongs to GROUPS[i]: positions 0, 1, 3 are group 7; positions 2, 4 group 3; position 5 group 9.
SCORES = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 5.0], dtype=torch.float64)
GROUPS = torch.tensor([7, 7, 3, 7, 3, 9])


def test_hand_computed_two_groups_and_a_singleton() -> None:
    adv = compute_grpo_outcome_advantage(SCORES, GROUPS, eps=0.0)
    s3, s2 = math.sqrt(3.0), math.sqrt(2.0)
    expected = torch.tensor([1 / s3, -2 / s3, 1 / s2, 1 / s3, -1 / s2, 0.0], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)
    assert adv[5].item() == 0.0


def test_eps_is_added_to_the_std() -> None:
    adv = compute_grpo_outcome_advantage(SCORES, GROUPS, eps=0.5)
    # group 7, first sample: (2/3) / (2/sqrt(3) + 0.5)
    assert adv[0].item() == pytest.approx((2 / 3) / (2 / math.sqrt(3) + 0.5))


def test_dr_grpo_only_subtracts_the_mean() -> None:
    adv = compute_grpo_outcome_advantage(SCORES, GROUPS, norm_adv_by_std=False)
    expected = torch.tensor([2 / 3, -4 / 3, 1.0, 2 / 3, -1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(adv, expected)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_zero_variance_group_gets_exactly_zero_advantage(norm: bool, eps: float) -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point, so a mean-based test would leave tiny nonzero deviations here.
    scores = torch.tensor([0.1, 0.1, 0.1, -1.0, -1.0], dtype=torch.float64)
    adv = compute_grpo_outcome_advantage(scores, torch.tensor([0, 0, 0, 1, 1]), norm_adv_by_std=norm, eps=eps)
    assert torch.equal(adv, torch.zeros(5, dtype=torch.float64))


def test_integer_scores_are_accepted_as_float32() -> None:
    adv = compute_grpo_outcome_advantage(torch.tensor([1, -1]), torch.tensor([0, 0]), eps=0.0)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2)]))


def test_empty_batch() -> None:
    adv = compute_grpo_outcome_advantage(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert adv.shape == (0,)


@pytest.mark.parametrize(
    ("scores", "group_index", "error", "match"),
    [
        (torch.zeros(3), torch.zeros(2, dtype=torch.long), ValueError, "same length"),
        (torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long), ValueError, "1-D"),
        (torch.zeros(2), torch.zeros(2), TypeError, "integer"),
        (torch.tensor([1.0, float("nan")]), torch.zeros(2, dtype=torch.long), ValueError, r"positions \[1\]"),
    ],
)
def test_bad_input_is_named(scores: torch.Tensor, group_index: torch.Tensor, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        compute_grpo_outcome_advantage(scores, group_index)


def reference_advantage(scores: torch.Tensor, group_index: torch.Tensor, norm: bool) -> torch.Tensor:
    """Plain loop over groups with torch.std (unbiased): an independent statement of Eq. 9."""
    out = torch.zeros_like(scores)
    for g in group_index.unique():
        members = group_index == g
        r = scores[members]
        if bool((r == r[0]).all()):  # constant group, size 1 included: no signal
            continue
        out[members] = (r - r.mean()) / r.std() if norm else r - r.mean()
    return out


batches = st.integers(1, 24).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 3.0]), min_size=n, max_size=n),
        st.lists(st.integers(-5, 1000), min_size=n, max_size=n).map(lambda ids: [i % 7 * 97 - 5 for i in ids]),
    )
)


@settings(max_examples=60, deadline=None)
@given(batches, st.booleans())
def test_matches_loop_reference_and_has_zero_mean_unit_std_per_group(
    batch: tuple[list[float], list[int]], norm: bool
) -> None:
    scores = torch.tensor(batch[0], dtype=torch.float64)
    group_index = torch.tensor(batch[1])
    adv = compute_grpo_outcome_advantage(scores, group_index, norm_adv_by_std=norm, eps=0.0)
    torch.testing.assert_close(adv, reference_advantage(scores, group_index, norm))
    for g in group_index.unique():
        a = adv[group_index == g]
        assert abs(a.mean().item()) < 1e-9
        if norm and a.numel() > 1 and scores[group_index == g].std() > 0:
            assert a.std().item() == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(batches, st.randoms(use_true_random=False))
def test_result_follows_the_samples_under_any_permutation(batch: tuple[list[float], list[int]], rnd) -> None:
    scores = torch.tensor(batch[0], dtype=torch.float64)
    group_index = torch.tensor(batch[1])
    perm = list(range(len(scores)))
    rnd.shuffle(perm)
    perm_t = torch.tensor(perm)
    adv = compute_grpo_outcome_advantage(scores, group_index)
    adv_perm = compute_grpo_outcome_advantage(scores[perm_t], group_index[perm_t])
    torch.testing.assert_close(adv_perm, adv[perm_t])


def test_broadcast_advantage_puts_zero_on_padding() -> None:
    adv = torch.tensor([0.5, -2.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = torch.tensor([[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0]])
    assert torch.equal(broadcast_advantage(adv, mask), expected)
    assert torch.equal(broadcast_advantage(adv, mask.bool()), expected)


def test_broadcast_advantage_rejects_mismatched_batch() -> None:
    with pytest.raises(ValueError, match=r"adv\(3,\) and response_mask\(2, 4\)"):
        broadcast_advantage(torch.zeros(3), torch.ones(2, 4))


def test_registry_returns_grpo_and_names_the_allowed_estimators() -> None:
    assert get_adv_estimator("grpo") is compute_grpo_outcome_advantage
    with pytest.raises(KeyError, match=r"'ppo'.*grpo"):
        get_adv_estimator("ppo")


def test_register_rejects_a_second_function_for_a_name() -> None:
    def my_estimator(scores, group_index, *, norm_adv_by_std=True, eps=1e-6):  # type: ignore[no-untyped-def]
        return torch.zeros_like(scores)

    try:
        assert register_adv_estimator("test-only-zero")(my_estimator) is my_estimator
        assert get_adv_estimator("test-only-zero") is my_estimator
        register_adv_estimator("test-only-zero")(my_estimator)  # the same function again is fine
        with pytest.raises(ValueError, match="already registered"):
            register_adv_estimator("grpo")(my_estimator)
    finally:
        ADV_ESTIMATORS.pop("test-only-zero", None)


# ---------------------------------------------------------------- the other estimators (verl's names), by hand
# Group 0: rewards (3, 1, 1), lengths (1, 2, 3); group 1: rewards (5, 5, 0), lengths (1, 1, 2); group 2: (2,) alone.
EST_SCORES = torch.tensor([3.0, 1.0, 1.0, 5.0, 5.0, 0.0, 2.0], dtype=torch.float64)
EST_GROUPS = torch.tensor([0, 0, 0, 1, 1, 1, 2])
EST_LENGTHS = torch.tensor([1, 2, 3, 1, 1, 2, 4])


def estimate(name: str, **kwargs: object) -> torch.Tensor:
    return get_adv_estimator(name)(EST_SCORES, EST_GROUPS, token_counts=EST_LENGTHS, **kwargs)


def test_registry_holds_verl_estimator_names() -> None:
    assert {"grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk"} <= set(ADV_ESTIMATORS)
    from dapo.config import AlgorithmConfig

    assert set(AlgorithmConfig.model_fields["adv_estimator"].annotation.__args__) == set(ADV_ESTIMATORS)


def test_rloo_hand_computed() -> None:
    # A_i = R_i - mean of the others: group 0: 3 - 1 = 2, 1 - (3+1)/2 = -1, -1; group 1: 5 - 2.5 = 2.5 (twice),
    # 0 - 5 = -5; the lone response has no other: 0.
    torch.testing.assert_close(
        estimate("rloo"), torch.tensor([2.0, -1.0, -1.0, 2.5, 2.5, -5.0, 0.0], dtype=torch.float64)
    )


def test_reinforce_plus_plus_hand_computed() -> None:
    # Token-weighted over 14 tokens: mean = (3*1 + 1*2 + 1*3 + 5 + 5 + 0*2 + 2*4) / 14 = 26/14;
    # unbiased token variance = sum_i L_i (R_i - mean)^2 / 13.
    mean = 26 / 14
    rewards, lengths = [3, 1, 1, 5, 5, 0, 2], [1, 2, 3, 1, 1, 2, 4]
    var = sum(n * (r - mean) ** 2 for r, n in zip(rewards, lengths)) / 13
    want = [(r - mean) / math.sqrt(var + 1e-8) for r in rewards]
    torch.testing.assert_close(estimate("reinforce_plus_plus"), torch.tensor(want, dtype=torch.float64))


def test_reinforce_plus_plus_baseline_hand_computed() -> None:
    # Group-centred first: (4/3, -2/3, -2/3), (5/3, 5/3, -10/3), (0); then whitened over the 14 tokens.
    centred = [4 / 3, -2 / 3, -2 / 3, 5 / 3, 5 / 3, -10 / 3, 0.0]
    lengths = [1, 2, 3, 1, 1, 2, 4]
    mean = sum(c * n for c, n in zip(centred, lengths)) / 14
    var = sum(n * (c - mean) ** 2 for c, n in zip(centred, lengths)) / 13
    want = [(c - mean) / math.sqrt(var + 1e-8) for c in centred]
    torch.testing.assert_close(estimate("reinforce_plus_plus_baseline"), torch.tensor(want, dtype=torch.float64))


def test_grpo_passk_hand_computed() -> None:
    scores = torch.tensor([3.0, 1.0, 1.0, 5.0, 5.0, 0.0, 1.0, 4.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    # Group 0: best 3, second 1, margin 2, std(3, 1, 1) = sqrt(4/3) -> 2 / sqrt(4/3) = sqrt(3) on the first response.
    # Group 1: tie at 5 -> margin 0. Group 2: best is the second response, margin 3, std sqrt(4.5).
    adv = get_adv_estimator("grpo_passk")(scores, groups, eps=0.0)
    want = torch.tensor([math.sqrt(3), 0, 0, 0, 0, 0, 0, 3 / math.sqrt(4.5)], dtype=torch.float64)
    torch.testing.assert_close(adv, want)
    unnormalised = get_adv_estimator("grpo_passk")(scores, groups, norm_adv_by_std=False)
    torch.testing.assert_close(unnormalised, torch.tensor([2.0, 0, 0, 0, 0, 0, 0, 3.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="at least 2 responses"):
        get_adv_estimator("grpo_passk")(EST_SCORES, EST_GROUPS)


def test_reinforce_plus_plus_needs_lengths() -> None:
    with pytest.raises(ValueError, match="token_counts"):
        get_adv_estimator("reinforce_plus_plus")(EST_SCORES, EST_GROUPS)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8))
def test_rloo_is_grpo_without_std_rescaled_by_g_over_g_minus_1(rewards: list[float]) -> None:
    scores = torch.tensor(rewards, dtype=torch.float64)
    groups = torch.zeros(len(rewards), dtype=torch.long)
    g = len(rewards)
    dr_grpo = compute_grpo_outcome_advantage(scores, groups, norm_adv_by_std=False)
    torch.testing.assert_close(get_adv_estimator("rloo")(scores, groups), dr_grpo * g / (g - 1))
