"""verl's PF-PPO (`trainer.algorithm.pf_ppo`): the scored batch is drawn again, with replacement, each row with a
weight from its reward, so the update trains more on the rows the reweighting favours.

The weight of a row from its summed reward r: pow = |r| ** weight_pow; max_min = 1 for the batch's largest and
smallest r, else 0; max_random = 0.4 for the largest r, else 0.1. Every weight gets 1e-8 so that no row is
impossible, and the batch's size of rows is drawn from them.
"""

from __future__ import annotations

import torch
from rlc.core.algorithms import PF_PPO_REWEIGHTS


@torch.no_grad()
def pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float = 2.0) -> torch.Tensor:
    """The (unnormalised) drawing weight of each row, from its summed reward `scores`."""
    if reweight_method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif reweight_method == "max_min":
        weights = torch.where((scores == scores.max()) | (scores == scores.min()), 1.0, 0.0)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1)
    else:
        raise ValueError(f"unknown reweight_method {reweight_method!r}; expected one of {', '.join(PF_PPO_REWEIGHTS)}")
    return (weights + 1e-8).clamp(min=1e-8)


@torch.no_grad()
def pf_ppo_rows(
    scores: torch.Tensor, reweight_method: str, weight_pow: float = 2.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Row indices of the resampled batch: as many draws as rows, with replacement, by `pf_ppo_weights`."""
    weights = pf_ppo_weights(scores, reweight_method, weight_pow)
    return torch.multinomial(weights, scores.shape[0], replacement=True, generator=generator)
