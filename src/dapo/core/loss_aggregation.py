"""Reduce a per-token loss matrix to the scalar that is back-propagated (token-level loss, DAPO Eq. 12).

Micro-batching contract: cut a mini-batch into micro-batches (rows), call ``aggregate_loss`` on each with the
mini-batch's global normalisers (``count_loss_normalizers`` on the whole mini-batch's mask, and one ``norm_length``)
and SUM the results: the sum equals the uncut loss, in value and in gradient, with no extra scaling by the caller.
That holds because every mode is "sum of per-token or per-sequence terms / a constant of the whole mini-batch".

A sequence counts in ``global_num_seqs`` only when it has at least one valid token, so a sample removed from the loss
(e.g. by overlong filtering) does not dilute the seq-* means; a sequence with no valid token contributes exactly 0.
"""

from torch import Tensor

from dapo.core.masked import check_same_shape, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def count_loss_normalizers(loss_mask: Tensor) -> tuple[int, int]:
    """``(number of valid tokens, number of sequences with >= 1 valid token)`` of a ``[B, T]`` mask."""
    if loss_mask.dim() != 2:
        raise ValueError(f"count_loss_normalizers: loss_mask must be [B, T], got shape {tuple(loss_mask.shape)}")
    valid = loss_mask.bool()
    return int(valid.sum()), int(valid.any(dim=1).sum())


def aggregate_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: int | None = None,
    norm_length: int | None = None,
) -> Tensor:
    """Scalar loss from a ``[B, T]`` per-token loss, normalised by mini-batch-wide counts.

    Modes (``l_{i,t}`` the loss of token t of sequence i, sums over valid tokens only):
      - ``"token-mean"`` (DAPO Eq. 12): ``sum_{i,t} l_{i,t} / global_num_tokens``; long answers weigh per token.
      - ``"seq-mean-token-mean"`` (GRPO Eq. 5): ``sum_i mean_t l_{i,t} / global_num_seqs``.
      - ``"seq-mean-token-sum"``: ``sum_i sum_t l_{i,t} / global_num_seqs``.
      - ``"seq-mean-token-sum-norm"`` (Dr. GRPO): ``sum_{i,t} l_{i,t} / (global_num_seqs * norm_length)``.

    Args:
        loss_mat: ``[B, T]`` per-token loss.
        loss_mask: ``[B, T]``, nonzero on the tokens that count.
        loss_agg_mode: one of ``LOSS_AGG_MODES``.
        global_num_tokens: valid tokens in the whole mini-batch; None means this batch's own count.
        global_num_seqs: sequences with >= 1 valid token in the whole mini-batch; None means this batch's own count.
        norm_length: Dr. GRPO's constant length, normally the max response length; None means ``T``. Pass it
            explicitly when micro-batches are padded to different ``T``.

    A normaliser of 0 (nothing valid anywhere) gives a loss of 0, never NaN.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"aggregate_loss: unknown loss_agg_mode {loss_agg_mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}"
        )
    if loss_mat.dim() != 2:
        raise ValueError(f"aggregate_loss: loss_mat must be [B, T], got shape {tuple(loss_mat.shape)}")
    check_same_shape("aggregate_loss", loss_mat=loss_mat, loss_mask=loss_mask)
    if global_num_tokens is not None and global_num_tokens < 0:
        raise ValueError(f"aggregate_loss: global_num_tokens must be >= 0, got {global_num_tokens}")
    if global_num_seqs is not None and global_num_seqs < 0:
        raise ValueError(f"aggregate_loss: global_num_seqs must be >= 0, got {global_num_seqs}")
    if norm_length is not None and norm_length <= 0:
        raise ValueError(f"aggregate_loss: norm_length must be > 0, got {norm_length}")

    valid = loss_mask.bool()
    if loss_agg_mode == "token-mean":
        return masked_sum(loss_mat, valid) / _normalizer(global_num_tokens, valid.sum(), loss_mat)

    num_seqs = _normalizer(global_num_seqs, valid.any(dim=1).sum(), loss_mat)
    seq_sums = masked_sum(loss_mat, valid, dim=1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_means = seq_sums / valid.sum(dim=1).clamp(min=1).to(loss_mat.dtype)
        return seq_means.sum() / num_seqs
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sums.sum() / num_seqs
    length = loss_mat.shape[1] if norm_length is None else norm_length
    return seq_sums.sum() / (num_seqs * length)


def _normalizer(given: float | None, own_count: Tensor, like: Tensor) -> float | Tensor:
    """The given global count, else this batch's own count; 0 becomes 1 (its numerator is then 0 too)."""
    if given is not None:
        return float(given) if given > 0 else 1.0
    return own_count.clamp(min=1).to(like.dtype)
