"""Per-token KL estimators between the policy and the reference model (`kl_estimator_type`).

The estimators are Schulman's (joschu.net/blog/kl-approx) evaluated on tokens sampled from the
policy: with delta = log_probs - ref_log_probs, k1 = delta, abs = |delta|, k2 = delta^2 / 2,
k3 = exp(-delta) + delta - 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from rlc.runtime.algorithms.registry import get_kl_estimator


def k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Unbiased, can be negative per token."""
    return log_probs - ref_log_probs


def k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Half the squared log-ratio: biased, non-negative, low variance."""
    return 0.5 * (log_probs - ref_log_probs).square()


def k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Unbiased and non-negative; clamped (log-ratio to +-20, result to +-10) as SkyRL does, so one stray token
    cannot blow up the loss."""
    log_ratio = (ref_log_probs - log_probs).clamp(min=-20.0, max=20.0)
    return (log_ratio.exp() - log_ratio - 1.0).clamp(min=-10.0, max=10.0)


def abs_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Absolute log-ratio."""
    return (log_probs - ref_log_probs).abs()


def token_kl(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
    estimator: str = "k3",
) -> torch.Tensor:
    """Per-token KL by the named estimator, exactly 0 outside `mask` (even where the log-probs are inf/NaN)."""
    kl = get_kl_estimator(estimator)(log_probs, ref_log_probs)
    if mask is None:
        return kl
    return torch.where(mask.bool(), kl * mask.to(kl.dtype), 0.0)


def kl_loss(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str = "k3",
) -> torch.Tensor:
    """KL loss term (`use_kl_loss`): mean over tokens of each sequence, then over sequences (as SkyRL's worker)."""
    kl = token_kl(log_probs, ref_log_probs, mask, estimator)
    per_sequence = kl.sum(dim=-1) / mask.to(kl.dtype).sum(dim=-1).clamp(min=1)
    return per_sequence.mean()


def kl_penalized_rewards(token_rewards: torch.Tensor, kl: torch.Tensor, coef: float) -> torch.Tensor:
    """KL in reward (`use_kl_in_reward`): per-token reward minus coef * KL; a negative coef counts as 0."""
    return token_rewards - max(0.0, coef) * kl


KL_ERROR_CLIP = 0.2  # the adaptive controller's proportional error is clipped to +-this, as in SkyRL


@dataclass
class KLController:
    """The coefficient of the KL penalty in the reward (`trainer.algorithm.kl_ctrl`): fixed, or adapted each step.

    The adaptive rule is SkyRL's: error = clip(kl / kl_target - 1, -0.2, 0.2) and
    value *= 1 + error * n_rows / horizon, so one update moves the value by at most 20% of n_rows / horizon.
    """

    kind: str  # fixed | adaptive
    value: float
    target: float = 0.1
    horizon: int = 10000

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> KLController:
        """Built from the spec's `trainer.algorithm` (its kl_ctrl knobs, kl_loss_coef as the initial value)."""
        ctrl = algorithm.kl_ctrl
        return cls(ctrl.type, float(algorithm.kl_loss_coef), float(ctrl.kl_target), int(ctrl.horizon))

    @classmethod
    def from_decision(cls, control: Any) -> KLController:
        """Built from the compiled job's `rlc.core.job.KLControl` (the same knobs, settled by the compiler)."""
        return cls(control.kind, control.initial, control.target, control.horizon)

    def update(self, current_kl: float, n_rows: int) -> float:
        """Take one step's mean KL over `n_rows` rollouts; returns the new value."""
        if self.kind != "adaptive" or not math.isfinite(current_kl):
            return self.value
        if self.target > 0:
            error = current_kl / self.target - 1
        else:  # a zero target: any KL is too much
            error = KL_ERROR_CLIP if current_kl > 0 else 0.0
        error = max(-KL_ERROR_CLIP, min(KL_ERROR_CLIP, error))
        self.value *= 1 + error * n_rows / self.horizon
        return self.value
