"""The registered policy losses besides vanilla (GSPO, GSPO-token, CISPO, GMPO, SAPO, Clip-Cov, KL-Cov): each against
values computed by hand from its paper's equation, and the invariants that define it."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.core import POLICY_LOSSES, PolicyLossParams, aggregate_loss, get_policy_loss
from dapo.core.sapo import sapo_gate

F64 = torch.float64


def run(
    name: str,
    log_prob: list[list[float]],
    old: list[list[float]],
    adv: list[list[float]],
    mask: list[list[int]],
    **params: float,
):
    lp = torch.tensor(log_prob, dtype=F64, requires_grad=True)
    out = get_policy_loss(name).fn(
        lp, torch.tensor(old, dtype=F64), torch.tensor(adv, dtype=F64), torch.tensor(mask), PolicyLossParams(**params)
    )
    out.loss_mat.sum().backward()
    return out, lp.grad


def test_registry_holds_verl_names_and_rejects_unknown() -> None:
    assert {"vanilla", "gspo", "gspo_token", "cispo", "geo_mean", "sapo", "clip_cov", "kl_cov"} <= set(POLICY_LOSSES)
    with pytest.raises(KeyError, match="registered losses: .*geo_mean"):
        get_policy_loss("gmpo")


def test_config_accepts_every_registered_loss() -> None:
    # The config's list of names is the registry itself (no Literal to keep in step with it).
    from dapo.config import PolicyLossConfig

    allowed = {name for name in POLICY_LOSSES if PolicyLossConfig(loss_mode=name).loss_mode == name}
    assert allowed == set(POLICY_LOSSES)


def test_gspo_hand_computed() -> None:
    # Row 0: token log-ratios log 1.21 and 0 -> s = exp(mean) = sqrt(1.21) = 1.1; A = +1; the third token is padding.
    #   eps_high 0.28: 1.1 inside [0.8, 1.28] -> loss -1.1 on both tokens; d(sum of the row's 2 losses)/d lp_t
    #   = 2 * (-A * s / |y|) = -1.1.
    # Row 1: one token, log-ratio log 0.64 -> s = 0.64 < 0.8, A = -1: max(0.64, 0.8) = 0.8 (clipped), gradient 0.
    lp = [[math.log(1.21), 0.0, 5.0], [math.log(0.64), 0.0, 0.0]]
    out, grad = run("gspo", lp, [[0.0, 0.0, 0.0]] * 2, [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], [[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-1.1, -1.1, 0.0], [0.8, 0.0, 0.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-1.1, -1.1, 0.0], [0.0, 0.0, 0.0]], dtype=F64))
    assert out.pg_clipfrac.item() == pytest.approx(1 / 3)
    # eps_high = 0.05: s = 1.1 > 1.05 -> -1.05 on each token and no gradient.
    out, grad = run("gspo", lp[:1], [[0.0] * 3], [[1.0] * 3], [[1, 1, 0]], clip_ratio_high=0.05)
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-1.05, -1.05, 0.0]], dtype=F64))
    assert torch.equal(grad, torch.zeros(1, 3, dtype=F64))


def test_gspo_with_seq_mean_token_mean_is_the_papers_objective() -> None:
    # J_GSPO = 1/G sum_i min(s_i A_i, clip(s_i) A_i); both rows inside the clip: -(1.1 * 1 + 0.9 * -2) / 2 = 0.35.
    lp = torch.tensor([[math.log(1.1), math.log(1.1)], [math.log(0.81), 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 1]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=F64)
    out = get_policy_loss("gspo").fn(lp, torch.zeros(2, 2, dtype=F64), adv, mask, PolicyLossParams())
    assert aggregate_loss(out.loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx(0.35)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(0, 4))
def test_gspo_sequence_ratio_does_not_depend_on_micro_batch_or_padding(seed: int, split: int, extra_pad: int) -> None:
    """A response is one row: the same response, with any neighbours and any padding width, gets the same loss and
    gradient, so micro-batching (which moves whole responses) cannot change GSPO's sequence ratio."""
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 7
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    lp = 0.3 * torch.randn(rows, width, generator=g, dtype=F64)
    old = lp + 0.2 * torch.randn(rows, width, generator=g, dtype=F64)
    adv = torch.randn(rows, 1, generator=g, dtype=F64).expand(rows, width).contiguous()
    params = PolicyLossParams(clip_ratio_low=0.1, clip_ratio_high=0.1)
    for name in ("gspo", "gspo_token", "geo_mean"):
        whole = lp.clone().requires_grad_(True)
        out = get_policy_loss(name).fn(whole, old, adv, mask, params)
        out.loss_mat.sum().backward()
        split_at = min(split, rows - 1)
        for part in (slice(0, split_at), slice(split_at, rows)):
            pad = torch.zeros(part.stop - part.start, extra_pad, dtype=F64)
            piece = torch.cat([lp[part], pad + 9.0], dim=1).requires_grad_(True)
            piece_mask = torch.cat([mask[part], pad.bool()], dim=1)
            sub = get_policy_loss(name).fn(
                piece, torch.cat([old[part], pad], 1), torch.cat([adv[part], pad], 1), piece_mask, params
            )
            sub.loss_mat.sum().backward()
            torch.testing.assert_close(sub.loss_mat[:, :width], out.loss_mat[part])
            torch.testing.assert_close(piece.grad[:, :width], whole.grad[part])


def test_gspo_token_equals_gspo_for_sequence_advantages() -> None:
    g = torch.Generator().manual_seed(3)
    lp = torch.randn(4, 5, generator=g, dtype=F64)
    old = lp + 0.1 * torch.randn(4, 5, generator=g, dtype=F64)
    adv = torch.randn(4, 1, generator=g, dtype=F64).expand(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    params = PolicyLossParams(clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    grads = []
    for name in ("gspo", "gspo_token"):
        x = lp.clone().requires_grad_(True)
        out = get_policy_loss(name).fn(x, old, adv, mask, params)
        aggregate_loss(out.loss_mat, mask, "seq-mean-token-mean").backward()
        grads.append((out.loss_mat.detach(), x.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_cispo_hand_computed_keeps_gradient_on_clipped_tokens() -> None:
    # Token 0: pi 0.6 / pi_old 0.4 = 1.5 > 1.28, A = +1: weight sg(1.28); loss = -1.28 * log 0.6; d/d log pi = -1.28.
    # Token 1: 0.2 / 0.4 = 0.5 < 0.8, A = -1: weight sg(0.8); loss = 0.8 * log 0.2; d/d log pi = +0.8.
    # (Vanilla's clip would give both tokens a zero gradient.) Token 2: ratio 1.1 inside, A = 2: -2.2 log 0.44.
    lp = [[math.log(0.6), math.log(0.2), math.log(0.44)]]
    old = [[math.log(0.4), math.log(0.4), math.log(0.4)]]
    out, grad = run("cispo", lp, old, [[1.0, -1.0, 2.0]], [[1, 1, 1]])
    want = [[-1.28 * math.log(0.6), 0.8 * math.log(0.2), -2 * 1.1 * math.log(0.44)]]
    torch.testing.assert_close(out.loss_mat, torch.tensor(want, dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-1.28, 0.8, -2.2]], dtype=F64))
    assert out.pg_clipfrac.item() == pytest.approx(2 / 3)
    vanilla_grad = run("vanilla", lp, old, [[1.0, -1.0, 2.0]], [[1, 1, 1]])[1]
    assert vanilla_grad[0, 0] == 0.0 and vanilla_grad[0, 1] == 0.0


@settings(max_examples=80, deadline=None)
@given(st.floats(-3, 3), st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3), st.floats(0, 0.9), st.floats(0, 2))
def test_cispo_gradient_is_never_zero_for_a_nonzero_advantage(log_ratio: float, a: float, lo: float, hi: float) -> None:
    _, grad = run("cispo", [[log_ratio - 1.0]], [[-1.0]], [[a]], [[1]], clip_ratio_low=lo, clip_ratio_high=hi)
    weight = min(max(math.exp(log_ratio), 1 - lo), 1 + hi)
    assert grad.item() == pytest.approx(-weight * a)
    assert grad.item() != 0.0


def test_gmpo_hand_computed() -> None:
    # Log-space clip [-0.4, 0.4]. Row 0, A = +1, log-ratios [0.5, -0.1, 0.2]: the pessimistic (smaller) of raw and
    # clipped -> [0.4, -0.1, 0.2], mean 1/6, ratio e^(1/6); loss -e^(1/6) on each token; token 0 took the clip
    # (no gradient), tokens 1, 2: d(3 token losses)/d lp_t = 3 * (-e^(1/6) / 3) = -e^(1/6).
    # Row 1, A = -1, log-ratios [-0.6, 0.3]: pessimistic = larger -> [-0.4, 0.3], mean -0.05; loss e^-0.05;
    # token 0 clipped, token 1 gradient 2 * (e^-0.05 / 2) = e^-0.05.
    lp = [[0.5, -0.1, 0.2], [-0.6, 0.3, 0.0]]
    out, grad = run(
        "geo_mean",
        lp,
        [[0.0] * 3] * 2,
        [[1.0] * 3, [-1.0] * 3],
        [[1, 1, 1], [1, 1, 0]],
        clip_ratio_low=0.4,
        clip_ratio_high=0.4,
    )
    up, down = math.exp(1 / 6), math.exp(-0.05)
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-up, -up, -up], [down, down, 0.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, -up, -up], [0.0, down, 0.0]], dtype=F64))
    assert out.pg_clipfrac.item() == pytest.approx(1 / 5)
    assert out.pg_clipfrac_lower.item() == pytest.approx(1 / 5)


def test_sapo_hand_computed() -> None:
    # f_tau(r) = 4/tau sigmoid(tau (r - 1)); d f / d log pi = 4 r s (1 - s), s = sigmoid(tau (r - 1)).
    # Token 0: r = 1, A = +1, tau_pos = 1: f = 2, loss -2, gradient -1 (the plain policy gradient).
    # Token 1: r = 2, A = -1, tau_neg = 1.05: loss f = 4/1.05 s(1.05), gradient 4 * 2 * s (1 - s).
    out, grad = run("sapo", [[0.0, math.log(2.0)]], [[0.0, 0.0]], [[1.0, -1.0]], [[1, 1]])
    s = 1 / (1 + math.exp(-1.05))
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-2.0, 4 / 1.05 * s]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 8 * s * (1 - s)]], dtype=F64))
    assert sapo_gate(torch.tensor(1.0), 3.0).item() == pytest.approx(2 / 3)


def test_sapo_temperatures_keep_the_inputs_dtype() -> None:
    # float64 in, float64 temperatures: on-policy (r = 1) the gate is 4/tau * 1/2 = 2/tau, so A = -1 gives the loss
    # 2 / 1.05 to float64's precision (a float32 tau_neg = 1.0499999523 is off by 4.5e-8, relative).
    out, grad = run("sapo", [[0.0, 0.0]], [[0.0, 0.0]], [[1.0, -1.0]], [[1, 1]], tau_pos=1.0, tau_neg=1.05)
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-2.0, 2 / 1.05]], dtype=F64), rtol=1e-15, atol=0.0)
    # Off-policy the temperature enters the sigmoid too: r = 2, A = -1 -> 4/1.05 * sigmoid(1.05).
    out, _ = run("sapo", [[math.log(2.0)]], [[0.0]], [[-1.0]], [[1]], tau_neg=1.05)
    want = 4 / 1.05 / (1 + math.exp(-1.05 * (math.exp(math.log(2.0)) - 1)))
    torch.testing.assert_close(out.loss_mat, torch.tensor([[want]], dtype=F64), rtol=1e-14, atol=0.0)


def test_clip_cov_detaches_the_token_in_the_covariance_band() -> None:
    # On-policy (r = 1). log pi = [0, -1, -3, -4] (mean -2), A = [1, 0, 0, -3] (mean -0.5):
    # Cov = [2 * 1.5, 1 * 0.5, -1 * 0.5, -2 * -2.5] = [3, 0.5, -0.5, 5]; band (1, 5) open -> only token 0;
    # max(1, int(2e-4 * 4)) = 1 token drawn -> token 0 is detached: loss kept (-1), gradient 0.
    lp = [[0.0, -1.0, -3.0, -4.0]]
    out, grad = run("clip_cov", lp, lp, [[1.0, 0.0, 0.0, -3.0]], [[1, 1, 1, 1]])
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-1.0, 0.0, 0.0, 3.0]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, 0.0, 3.0]], dtype=F64))
    assert out.pg_clipfrac.item() == pytest.approx(1 / 4)


def test_clip_cov_off_policy_clips_and_never_detaches_an_already_clipped_token() -> None:
    # log pi = [-1, -2, -9, -11, -2] (mean -5, deviations [4, 3, -4, -6, 3]), A = [1, 1, -1, -1, 0] (mean 0):
    # Cov = [4, 3, 4, 6, 0]; in the band (1, 5): tokens 0, 1 and 2. Ratios (pi_old set apart from pi):
    #   token 0: r = 1.5, A = +1: above 1 + 0.28, PPO's clip takes -1.28 -> no gradient; clipped, so not a candidate.
    #   token 1: r = 1.1, A = +1: inside, -1.1; the only candidate -> detached: loss kept, gradient 0 (else -1.1).
    #   token 2: r = 0.5, A = -1: below 1 - 0.2, max(0.5, 0.8) = 0.8 -> no gradient; clipped, not a candidate.
    #   token 3: r = 2.0, A = -1: max(2, 1.28) = 2, the unclipped side (the clip never helps a negative advantage
    #            upwards) -> gradient -A r = 2; Cov 6 is outside the band.
    #   token 4: A = 0: loss 0, gradient 0.
    # max(1, int(2e-4 * 5)) = 1 token drawn, whatever the seed.
    lp = [[-1.0, -2.0, -9.0, -11.0, -2.0]]
    ratios = [1.5, 1.1, 0.5, 2.0, 0.7]
    old = [[lp[0][t] - math.log(r) for t, r in enumerate(ratios)]]
    for seed in range(8):  # a draw among the clipped tokens too would miss token 1 in most of these seeds
        lp_t = torch.tensor(lp, dtype=F64, requires_grad=True)
        out = get_policy_loss("clip_cov").fn(
            lp_t,
            torch.tensor(old, dtype=F64),
            torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0]], dtype=F64),
            torch.tensor([[1, 1, 1, 1, 1]]),
            PolicyLossParams(generator=torch.Generator().manual_seed(seed)),
        )
        out.loss_mat.sum().backward()
        torch.testing.assert_close(out.loss_mat, torch.tensor([[-1.28, -1.1, 0.8, 2.0, 0.0]], dtype=F64))
        torch.testing.assert_close(lp_t.grad, torch.tensor([[0.0, 0.0, 0.0, 2.0, 0.0]], dtype=F64))
        assert out.pg_clipfrac.item() == pytest.approx(3 / 5)  # 2 clipped + 1 detached


def test_clip_cov_off_policy_clip_reads_eps_low_and_eps_high() -> None:
    # The same batch with eps_low = 0.6, eps_high = 0.6: token 0 (r = 1.5) and token 2 (r = 0.5) are now inside
    # [0.4, 1.6], unclipped, and join token 1 as candidates; the band is narrowed to (3.5, 5) so that token 0 and
    # token 2 (Cov 4) are the only ones in it and 1 of them is detached: the other keeps its gradient -A r.
    lp = [[-1.0, -2.0, -9.0, -11.0, -2.0]]
    old = [[lp[0][t] - math.log(r) for t, r in enumerate([1.5, 1.1, 0.5, 2.0, 0.7])]]
    out, grad = run(
        "clip_cov",
        lp,
        old,
        [[1.0, 1.0, -1.0, -1.0, 0.0]],
        [[1, 1, 1, 1, 1]],
        clip_ratio_low=0.6,
        clip_ratio_high=0.6,
        clip_cov_lb=3.5,
    )
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-1.5, -1.1, 0.5, 2.0, 0.0]], dtype=F64))
    assert grad[0, 1].item() == pytest.approx(-1.1) and grad[0, 3].item() == pytest.approx(2.0)
    undetached = {0: -1.5, 2: 0.5}  # -A r of tokens 0 and 2
    kept = {t: g for t, g in undetached.items() if grad[0, t].item() != 0.0}
    assert len(kept) == 1 and all(grad[0, t].item() == pytest.approx(g) for t, g in kept.items())
    assert out.pg_clipfrac.item() == pytest.approx(1 / 5)


def test_kl_cov_penalises_the_largest_covariance_token() -> None:
    # Same covariances [3, 0.5, -0.5, 5] (computed on the current log pi); top-1 = token 3, whose log-ratio is 0.1:
    # loss -A r + 1 * |log r| = 3 e^0.1 + 0.1, gradient 3 e^0.1 + 1. The others: -A r with r = 1.
    lp = [[0.0, -1.0, -3.0, -4.0]]
    old = [[0.0, -1.0, -3.0, -4.1]]
    out, grad = run("kl_cov", lp, old, [[1.0, 0.0, 0.0, -3.0]], [[1, 1, 1, 1]])
    e = math.exp(0.1)
    torch.testing.assert_close(out.loss_mat, torch.tensor([[-1.0, 0.0, 0.0, 3 * e + 0.1]], dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0, 0.0, 3 * e + 1.0]], dtype=F64))
    assert out.pg_clipfrac.item() == pytest.approx(1 / 4)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_on_policy_every_ratio_is_exactly_one(name: str) -> None:
    g = torch.Generator().manual_seed(11)
    lp = torch.randn(3, 6, generator=g) - 2.0
    mask = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    adv = torch.randn(3, 1, generator=g).expand(3, 6)
    out = get_policy_loss(name).fn(lp.clone().requires_grad_(True), lp, adv, mask, PolicyLossParams())
    assert out.ratio_mean.item() == 1.0
    assert out.ppo_kl.item() == 0.0
    assert bool(torch.isfinite(out.loss_mat).all())
    assert torch.equal(out.loss_mat[mask == 0], torch.zeros(int((mask == 0).sum())))


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_shape_mismatch_and_padding_never_leak(name: str) -> None:
    with pytest.raises(ValueError, match="same shape"):
        get_policy_loss(name).fn(
            torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2), PolicyLossParams()
        )
    lp = torch.tensor([[-1.0, 80.0]], requires_grad=True)
    out = get_policy_loss(name).fn(
        lp, torch.tensor([[-1.2, -90.0]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[1, 0]]), PolicyLossParams()
    )
    out.loss_mat.sum().backward()
    assert out.loss_mat[0, 1].item() == 0.0 and lp.grad[0, 1].item() == 0.0
    assert bool(torch.isfinite(lp.grad).all())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-2, 2), min_size=1, max_size=6),
    st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3),
    st.floats(0.05, 0.95),
    st.floats(0.05, 1.0),
)
def test_gmpo_clip_bounds_the_side_that_helps_the_advantage(
    log_ratios: list[float], a: float, lo: float, hi: float
) -> None:
    """Like PPO's clip, GMPO's pessimistic log-space clip caps the sequence ratio above at e^eps_high when A > 0 and
    below at e^-eps_low when A < 0 (the other side stays open: the objective never rewards it)."""
    n = len(log_ratios)
    out, _ = run("geo_mean", [log_ratios], [[0.0] * n], [[a] * n], [[1] * n], clip_ratio_low=lo, clip_ratio_high=hi)
    seq_ratio = out.loss_mat[0, 0].item() / -a
    geometric_mean = math.exp(sum(log_ratios) / n)
    if a > 0:
        assert seq_ratio <= min(geometric_mean, math.exp(hi)) * (1 + 1e-9)
    else:
        assert seq_ratio >= max(geometric_mean, math.exp(-lo)) * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(st.floats(-3, 3).filter(lambda a: abs(a) > 1e-3), st.floats(0.1, 5.0), st.floats(0.1, 5.0))
def test_sapo_on_policy_gradient_is_the_policy_gradient_for_any_temperature(
    a: float, tau_pos: float, tau_neg: float
) -> None:
    _, grad = run("sapo", [[-1.3]], [[-1.3]], [[a]], [[1]], tau_pos=tau_pos, tau_neg=tau_neg)
    assert grad.item() == pytest.approx(-a)  # slope of f_tau at r = 1 is 1 whatever tau
