"""Off-policy correction (`trainer.algorithm.off_policy_correction`): the rollout engine's log-probs
differ from the trainer's, so the policy loss is reweighted by truncated importance sampling (TIS)
and rows or tokens that drifted too far are masked out.

Every rule reads the importance ratio pi_old / pi_rollout = exp(old - rollout), computed in float32
or wider from a log ratio clamped to [-20, 20] (SkyRL's `safe_exp_delta`). Positions outside `mask`
are absent: they count as a log ratio of 0 and never reach a result, even when they hold inf or NaN.
"""

from __future__ import annotations

import torch
from rlc.core.algorithms import OFF_POLICY_OPTIONS
from rlc.core.runtime_facts import corrects_off_policy
from rlc.runtime.algorithms.rejection import rejection_keep

# Clamp of log ratios before exp, shared with the PPO ratio in losses.py.
_MAX_LOG_RATIO = 20.0

TIS_RATIO_TYPES = ("token", "sequence")
SEQUENCE_MASK_METRICS = ("geometric", "product")

_OPTIONS = OFF_POLICY_OPTIONS


def options_from_config(opc) -> dict:
    """Keyword arguments of `off_policy_correction` from a `trainer.algorithm.off_policy_correction` section."""
    return {name: getattr(opc, name) for name in _OPTIONS}


def _exp(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()


def _share(flags: torch.Tensor, count) -> torch.Tensor:
    """Number of True flags over `count` (at least 1), as a 0-d float32 tensor."""
    return (flags.sum().to(torch.float32) / max(float(count), 1.0)).detach()


def _ratio_stats(ratio: torch.Tensor, valid: torch.Tensor) -> dict[str, torch.Tensor]:
    """Mean, unbiased std, max and min of the ratio over the valid tokens (0 when there are none)."""
    count = valid.sum()
    if count == 0:
        zero = torch.zeros((), dtype=torch.float32, device=ratio.device)
        return {"is_ratio_mean": zero, "is_ratio_std": zero, "is_ratio_max": zero, "is_ratio_min": zero}
    values = ratio[valid]
    mean = values.mean()
    std = (((values - mean) ** 2).sum() / (count - 1).clamp(min=1)).sqrt()
    # SkyRL takes std/max/min over every position with padding as 0; here padding is left out.
    stats = {"is_ratio_mean": mean, "is_ratio_std": std, "is_ratio_max": values.max(), "is_ratio_min": values.min()}
    return {name: value.to(torch.float32) for name, value in stats.items()}


def _truncate(ratio: torch.Tensor, low: float | None, high: float) -> torch.Tensor:
    """TIS caps the ratio at `high`; IcePop (a `low`) zeroes a ratio outside [low, high] instead."""
    if low is None:
        return ratio.clamp(max=high)
    return torch.where((ratio >= low) & (ratio <= high), ratio, 0.0)


def _mean_normalized(values: torch.Tensor, over: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`values` over their mean where `over` holds, and that mean; a mean of 1e-8 or less leaves them as they are."""
    mean = torch.where(over, values, 0.0).sum() / over.sum().clamp(min=1)
    if mean <= 1e-8:
        return values, torch.ones((), dtype=torch.float32)
    return values / mean, mean.to(torch.float32)


def m2po_keep(log_ratio: torch.Tensor, keep: torch.Tensor, threshold: float) -> torch.Tensor:
    """AReaL's M2PO (second-moment) filter: of the kept tokens, drop those of largest squared log ratio, one by one,
    until the mean squared log ratio of the rest is below `threshold`; at least one token stays."""
    m2 = log_ratio.square()[keep]
    n = m2.numel()
    if n == 0:
        return keep
    ordered, order = torch.sort(m2, descending=True)
    # rest_mean[i]: the mean of ordered[i:], what is left when the i largest are dropped
    rest_mean = ordered.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=ordered.dtype, device=m2.device)
    below = torch.nonzero(rest_mean < threshold)
    dropped = int(below[0]) if below.numel() else n - 1
    stays = torch.ones(n, dtype=torch.bool, device=m2.device)
    stays[order[:dropped]] = False
    out = keep.clone()
    out[keep] = stays
    return out


@torch.no_grad()
def off_policy_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    tis_ratio_type: str | None = None,
    token_tis_ratio_clip_high: float = 2.0,
    sequence_tis_ratio_clip_high: float = 5.0,
    sequence_mask_metric: str | None = None,
    geo_mask_high: float = 1.01,
    geo_mask_low: float = 0.99,
    product_mask_high: float = 2.0,
    product_mask_low: float = 0.5,
    outlier_token_is_threshold_low: float | None = None,
    outlier_token_is_threshold_high: float | None = None,
    token_mask_is_threshold_low: float | None = None,
    token_mask_is_threshold_high: float | None = None,
    tis_ratio_clip_low: float | None = None,
    tis_batch_normalize: bool = False,
    rejection_sampling: list[str] | None = None,
    rejection_threshold_high: list[float] | None = None,
    rejection_threshold_low: list[float] | None = None,
    m2po_threshold: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """`(token_weight, new_mask, metrics)`: multiply the per-token policy loss by `token_weight` and
    reduce it with `new_mask`.

    The rules run in SkyRL's order, each on the mask left by the ones before:
    1. outlier: a row holding a token ratio < outlier low or > outlier high loses all its tokens;
    2. token mask (only when both bounds are set): tokens whose ratio is outside [low, high] are dropped;
    3. TIS weight: token = min(ratio, token cap); sequence = min(exp(sum of the row's log ratios),
       sequence cap) on every token of the row; 1 outside `mask` and when `tis_ratio_type` is None. With
       `tis_ratio_clip_low` (verl's IcePop) a ratio outside [low, cap] weighs 0 and one inside is not capped;
       `tis_batch_normalize` then divides by the weights' mean over the kept tokens (sequence: over the rows);
    4. sequence mask: geometric = exp(mean log ratio of the row), product = exp(sum), a row whose value
       is < low or > high loses all its tokens;
    5. rejection sampling (verl's rollout_rs, rlc.runtime.algorithms.rejection) on the tokens kept so far;
    6. M2PO (AReaL's m2_threshold, `m2po_keep`) on the tokens kept so far.
    A value exactly on a bound is kept. Without SkyRL's masks (1, 2, 4) this is verl's
    compute_rollout_correction_and_rejection_mask. With nothing configured the weight is 1, the mask is returned
    as given and metrics are empty.
    """
    if tis_ratio_type not in (None, *TIS_RATIO_TYPES):
        raise ValueError(f"unknown tis_ratio_type {tis_ratio_type!r}; expected one of {', '.join(TIS_RATIO_TYPES)}")
    if sequence_mask_metric not in (None, *SEQUENCE_MASK_METRICS):
        raise ValueError(
            f"unknown sequence_mask_metric {sequence_mask_metric!r}; expected one of {', '.join(SEQUENCE_MASK_METRICS)}"
        )
    weight_dtype = old_log_probs.dtype
    if not corrects_off_policy(
        tis_ratio_type,
        sequence_mask_metric,
        outlier_token_is_threshold_low,
        outlier_token_is_threshold_high,
        token_mask_is_threshold_low,
        token_mask_is_threshold_high,
        rejection_sampling,
        m2po_threshold,
    ):
        return torch.ones_like(old_log_probs, dtype=weight_dtype), mask, {}

    rows = mask.shape[0]
    present = mask.bool()
    wide = torch.promote_types(old_log_probs.dtype, torch.float32)
    log_ratio = torch.where(present, old_log_probs.to(wide) - rollout_log_probs.to(wide), 0.0)
    ratio = _exp(log_ratio)
    metrics = _ratio_stats(ratio, present)
    keep = present

    if outlier_token_is_threshold_low is not None or outlier_token_is_threshold_high is not None:
        over, under = torch.zeros_like(keep), torch.zeros_like(keep)
        if outlier_token_is_threshold_high is not None:
            over = keep & (ratio > outlier_token_is_threshold_high)
        if outlier_token_is_threshold_low is not None:
            under = keep & (ratio < outlier_token_is_threshold_low)
        bad_row = (over | under).any(dim=-1)
        metrics["outlier_seq_masked_ratio"] = _share(bad_row, rows)
        metrics["outlier_seq_over_high_ratio"] = _share(over.any(dim=-1), rows)
        metrics["outlier_seq_under_low_ratio"] = _share(under.any(dim=-1), rows)
        keep = keep & ~bad_row[:, None]

    if token_mask_is_threshold_low is not None and token_mask_is_threshold_high is not None:
        outside = keep & ((ratio < token_mask_is_threshold_low) | (ratio > token_mask_is_threshold_high))
        metrics["token_mask_ratio"] = _share(outside, keep.sum())
        keep = keep & ~outside

    # Row log ratio over the tokens still kept; rows with none get 0, i.e. a ratio of 1.
    row_log_ratio = torch.where(keep, log_ratio, 0.0).sum(dim=-1)
    weight = torch.ones_like(ratio)
    if tis_ratio_type == "token":
        metrics["tis_token_clip_high_ratio"] = _share(keep & (ratio > token_tis_ratio_clip_high), keep.sum())
        token_weight = _truncate(ratio, tis_ratio_clip_low, token_tis_ratio_clip_high)
        if tis_batch_normalize:
            token_weight, metrics["tis_batch_norm_factor"] = _mean_normalized(token_weight, keep)
        weight = torch.where(present, token_weight, 1.0)
    elif tis_ratio_type == "sequence":
        row_ratio = _exp(row_log_ratio)
        metrics["tis_seq_clip_high_ratio"] = _share(row_ratio > sequence_tis_ratio_clip_high, rows)
        row_weight = _truncate(row_ratio, tis_ratio_clip_low, sequence_tis_ratio_clip_high)
        if tis_batch_normalize:
            row_weight, metrics["tis_batch_norm_factor"] = _mean_normalized(row_weight, keep.any(dim=-1))
        weight = torch.where(present, row_weight[:, None], 1.0)

    if sequence_mask_metric is not None:
        if sequence_mask_metric == "geometric":
            row_value = _exp(row_log_ratio / keep.sum(dim=-1).clamp(min=1))
            low, high = geo_mask_low, geo_mask_high
        else:
            row_value = _exp(row_log_ratio)
            low, high = product_mask_low, product_mask_high
        over, under = row_value > high, row_value < low
        prefix = "geo" if sequence_mask_metric == "geometric" else "product"
        metrics[f"{prefix}_sequence_mask_masked_ratio"] = _share(over | under, rows)
        metrics[f"{prefix}_sequence_mask_over_high_ratio"] = _share(over, rows)
        metrics[f"{prefix}_sequence_mask_under_low_ratio"] = _share(under, rows)
        keep = keep & ~(over | under)[:, None]

    if rejection_sampling:
        rejected, rejection_metrics = rejection_keep(
            log_ratio, keep, rejection_sampling, rejection_threshold_high or [], rejection_threshold_low
        )
        metrics.update(rejection_metrics)
        keep = keep & rejected

    if m2po_threshold is not None:
        kept_m2po = m2po_keep(log_ratio, keep, m2po_threshold)
        metrics["m2po_masked_ratio"] = _share(keep & ~kept_m2po, keep.sum())
        keep = kept_m2po

    new_mask = torch.where(keep, mask, torch.zeros_like(mask))
    return weight.to(weight_dtype), new_mask, metrics
