"""Policy-loss math: log-probs and entropy from logits, PPO clipped losses, loss reductions.

Token tensors are (batch, response_len) with `mask` marking the tokens that carry loss; masked
positions never reach the result, even when they hold inf or NaN.
"""

from __future__ import annotations

from typing import Callable

import torch

LOSS_REDUCTIONS = ("token_mean", "sequence_mean", "seq_mean_token_sum_norm")

# Log-ratios are clamped before exp so a stale token cannot overflow the ratio (SkyRL's safe_exp_delta).
_MAX_LOG_RATIO = 20.0


def scale_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Logits divided by the sampling temperature, so log-probs match what the sampler drew from."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    return logits if temperature == 1.0 else logits / temperature


def token_log_probs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each given token id under softmax(logits / temperature), in float32 or wider."""
    logits = scale_logits(logits, temperature)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return torch.log_softmax(logits, dim=-1).gather(-1, token_ids.long().unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-position entropy of softmax(logits / temperature); -inf logits (banned tokens) add nothing."""
    logits = scale_logits(logits, temperature)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    log_p = torch.log_softmax(logits, dim=-1)
    # p * log p is 0 where p is 0; clamping keeps 0 * -inf from turning into NaN.
    return -(log_p.exp() * log_p.clamp(min=torch.finfo(log_p.dtype).min)).sum(dim=-1)


def reduce_loss(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_reduction: str = "token_mean",
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Scalar loss from per-token losses.

    token_mean averages all masked tokens of the batch; sequence_mean averages each sequence's token
    mean over the batch rows; seq_mean_token_sum_norm (Dr. GRPO) averages each sequence's token sum
    divided by `max_seq_len`. Like SkyRL, the two sequence modes count every row, empty ones too.
    """
    mask = mask.to(token_loss.dtype)
    masked = torch.where(mask.bool(), token_loss * mask, 0.0)
    if loss_reduction == "token_mean":
        return masked.sum() / mask.sum().clamp(min=1)
    if loss_reduction == "sequence_mean":
        return (masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).mean()
    if loss_reduction == "seq_mean_token_sum_norm":
        if max_seq_len is None or max_seq_len < 1:
            raise ValueError("seq_mean_token_sum_norm needs max_seq_len >= 1")
        return (masked.sum(dim=-1) / max_seq_len).mean()
    raise ValueError(f"unknown loss_reduction {loss_reduction!r}; expected one of {', '.join(LOSS_REDUCTIONS)}")


def _token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return reduce_loss(values.to(torch.float32), mask, "token_mean").detach()


def _clipped_surrogate(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip_low: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped loss -min(r*A, clip(r, 1-low, 1+high)*A) and its metrics."""
    log_ratio = log_probs - old_log_probs
    wide = torch.promote_types(log_ratio.dtype, torch.float32)
    ratio = log_ratio.to(wide).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp().to(log_ratio.dtype)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_clip_low, 1.0 + eps_clip_high) * advantages
    token_loss = -torch.minimum(unclipped, clipped)
    metrics = {
        # Tokens whose objective the clip actually lowered (a ratio exactly on the boundary is not clipped).
        "clip_fraction": _token_mean((clipped < unclipped).float(), mask),
        # KL(old || new) estimated on the sampled tokens: mean of log old - log new.
        "approx_kl": _token_mean(-log_ratio, mask),
    }
    return token_loss, metrics


def regular_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped loss (`regular`); `clip_ratio_c` only keeps the signatures uniform."""
    return _clipped_surrogate(log_probs, old_log_probs, advantages, mask, eps_clip_low, eps_clip_high)


def dual_clip_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token dual-clip PPO: for negative advantages the loss is also capped at -clip_ratio_c * A.

    Without the cap a token with A < 0 and a huge ratio would dominate the loss (Ye et al., 2020).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    token_loss, metrics = _clipped_surrogate(log_probs, old_log_probs, advantages, mask, eps_clip_low, eps_clip_high)
    cap = -advantages * clip_ratio_c
    capped = (advantages < 0) & (cap < token_loss)
    token_loss = torch.where(capped, cap, token_loss)
    metrics["dual_clip_fraction"] = _token_mean(capped.float(), mask)
    return token_loss, metrics


def _reduced(token_fn: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]):
    def policy_loss(log_probs, old_log_probs, advantages, mask, *, loss_reduction: str = "token_mean",
                    max_seq_len: int | None = None, **clip):
        token_loss, metrics = token_fn(log_probs, old_log_probs, advantages, mask, **clip)
        return reduce_loss(token_loss, mask, loss_reduction, max_seq_len), metrics

    policy_loss.__doc__ = f"{token_fn.__doc__.splitlines()[0]} Reduced to a scalar by `loss_reduction`."
    return policy_loss


regular_policy_loss = _reduced(regular_token_loss)
dual_clip_policy_loss = _reduced(dual_clip_token_loss)


def token_weights(
    mask: torch.Tensor,
    loss_reduction: str,
    *,
    total_tokens: float,
    total_sequences: float,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Per-token weights w with sum(token_loss * w) over a whole mini-batch == reduce_loss of it.

    A worker sees only its micro-batches of its shard; the totals are the mini-batch's (all ranks), so
    micro-batch and rank losses add up to the mini-batch loss whatever the split.
    """
    mask = mask.to(torch.float32)
    if loss_reduction == "token_mean":
        return mask / max(total_tokens, 1.0)
    if loss_reduction == "sequence_mean":
        return mask / mask.sum(dim=-1, keepdim=True).clamp(min=1) / max(total_sequences, 1.0)
    if loss_reduction == "seq_mean_token_sum_norm":
        if max_seq_len is None or max_seq_len < 1:
            raise ValueError("seq_mean_token_sum_norm needs max_seq_len >= 1")
        return mask / max_seq_len / max(total_sequences, 1.0)
    raise ValueError(f"unknown loss_reduction {loss_reduction!r}; expected one of {', '.join(LOSS_REDUCTIONS)}")


# Keys are spec v1's `policy_loss_type` values implemented so far.
POLICY_TOKEN_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "regular": regular_token_loss,
    "dual_clip": dual_clip_token_loss,
}
POLICY_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {
    "regular": regular_policy_loss,
    "dual_clip": dual_clip_policy_loss,
}
