"""verl's rejection sampling against the engine (`off_policy_correction.rejection_sampling`, verl's `rollout_rs`): a
token or a whole sequence leaves the loss when its divergence from the engine's distribution passes a bound.

The divergences are taken per token of the log ratio d = log(pi_old / pi_rollout), clamped to [-20, 20]: k1 = -d,
k2 = d^2 / 2, k3 = exp(d) - 1 - d. A mode names the level and the divergence: token_kN judges each token, seq_sum_kN
the sum over the row's tokens, seq_mean_kN their mean, seq_max_kN their largest. k1 keeps a value inside
[log low, log high] (the bounds are ratios); k2 and k3 keep a value at most `high`. Every mode must pass.
"""

from __future__ import annotations

import math

import torch
from rlc.core.algorithms import REJECTION_MODES

_MAX_LOG_RATIO = 20.0


def bounds(modes: list[str], high: list[float], low: list[float] | None) -> list[tuple[str, float | None, float]]:
    """(mode, low, high) for each distinct mode in order. `high` is one bound shared by all modes or one per mode;
    `low` one shared by the k1 modes or one per k1 mode, and a k1 mode without one takes 1 / its high."""
    distinct = list(dict.fromkeys(modes))
    for mode in distinct:
        if mode not in REJECTION_MODES:
            raise ValueError(f"unknown rejection_sampling mode {mode!r}; expected one of {', '.join(REJECTION_MODES)}")
    if len(high) not in (1, len(distinct)):
        raise ValueError(f"rejection_threshold_high has {len(high)} values; give 1 or one per mode ({len(distinct)})")
    highs = high * len(distinct) if len(high) == 1 else list(high)
    k1 = [mode for mode in distinct if mode.endswith("k1")]
    if low and len(low) not in (1, len(k1)):
        raise ValueError(f"rejection_threshold_low has {len(low)} values; give 1 or one per k1 mode ({len(k1)})")
    low_of = dict(zip(k1, low * len(k1) if low and len(low) == 1 else (low or []), strict=False))
    return [
        (mode, low_of.get(mode, 1.0 / hi) if mode.endswith("k1") else None, hi)
        for mode, hi in zip(distinct, highs, strict=True)
    ]


def _divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    d = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return {"k1": -d, "k2": 0.5 * d**2, "k3": d.exp() - 1.0 - d}


def _row_statistic(level: str, token: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    if level == "max":
        values = token.masked_fill(~present, float("-inf")).max(dim=-1).values
        return torch.where(torch.isinf(values), torch.zeros_like(values), values)  # a row without tokens: 0
    total = torch.where(present, token, 0.0).sum(dim=-1)
    return total if level == "sum" else total / present.sum(dim=-1).clamp(min=1)


@torch.no_grad()
def rejection_keep(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    modes: list[str],
    high: list[float],
    low: list[float] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`(keep, metrics)`: which of `mask`'s tokens every mode keeps (bool), and each mode's share of rejected tokens
    and rows."""
    present = mask.bool()
    divergence = _divergences(log_ratio)
    keep = present.clone()
    rows = max(int(present.any(dim=-1).sum()), 1)
    metrics: dict[str, torch.Tensor] = {}
    for mode, lo, hi in bounds(modes, high, low):
        level, kind = mode.rsplit("_", 1)
        stat = divergence[kind] if level == "token" else _row_statistic(level.split("_")[1], divergence[kind], present)
        if kind == "k1":
            assert lo is not None
            passed = (stat >= math.log(lo)) & (stat <= math.log(hi))
        else:
            passed = stat <= hi
        passed = passed if level == "token" else passed[:, None].expand_as(present)
        rejected = present & ~passed
        metrics[f"rejection_{mode}_token_fraction"] = (rejected.sum() / present.sum().clamp(min=1)).float()
        metrics[f"rejection_{mode}_seq_fraction"] = (rejected.any(dim=-1).sum() / rows).float()
        keep = keep & passed
    metrics["rejection_token_fraction"] = ((present & ~keep).sum() / present.sum().clamp(min=1)).float()
    return keep, metrics
