"""verl's bypass mode (`policy_loss_type: bypass`, verl's `bypass_mode` loss): the engine's log-probs are the old
ones, and off_policy_correction is applied inside the loss, per micro-batch, against the current policy's
log-probs (pi_theta / pi_rollout) rather than once per step against the old policy's.

`bypass.loss_type` picks the loss: `ppo_clip` is verl's vanilla PPO (rlc's dual_clip) on the ratio to the engine,
with no TIS weight (the ratio is the importance weight); `reinforce` is -w * A * log p with w the (detached) TIS
weight. The rejected tokens leave the loss; the loss reduction still counts the batch's tokens.
"""

from __future__ import annotations

import torch
from rlc.core.algorithms import OFF_POLICY_OPTIONS
from rlc.runtime.algorithms.losses import dual_clip_token_loss
from rlc.runtime.algorithms.off_policy import off_policy_correction

LOSS_TYPES = ("ppo_clip", "reinforce")


def bypass_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    rollout_log_probs: torch.Tensor,
    loss_type: str = "ppo_clip",
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token bypass-mode loss; the options after clip_ratio_c are off_policy_correction's. `old_log_probs` are
    not read: the engine's are the old ones."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown bypass loss_type {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}")
    correction = {name: value for name, value in locals().items() if name in OFF_POLICY_OPTIONS}
    weight, kept, metrics = off_policy_correction(log_probs.detach(), rollout_log_probs, mask, **correction)
    keep = kept.bool()
    if loss_type == "ppo_clip":
        token_loss, parts = dual_clip_token_loss(
            log_probs,
            rollout_log_probs,
            advantages,
            kept,
            eps_clip_low=eps_clip_low,
            eps_clip_high=eps_clip_high,
            clip_ratio_c=clip_ratio_c,
        )
        metrics.update(parts)
    else:
        token_loss = -advantages * torch.where(keep, log_probs, 0.0) * weight.detach()
    metrics["rejected_fraction"] = (mask.bool() & ~keep).sum().float() / mask.bool().sum().clamp(min=1)
    return torch.where(keep, token_loss, 0.0), metrics
