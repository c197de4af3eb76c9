"""Policy-loss math: log-probs and entropy from logits, the spec's policy losses, loss reductions.

Token tensors are (batch, response_len) with `mask` marking the tokens that carry loss; masked
positions never reach the result, even when they hold inf or NaN. Every policy loss is per token:
`fn(log_probs, old_log_probs, advantages, mask, **options) -> (token_loss, metrics)`, with the
options read from trainer.algorithm as the loss's card says (rlc.core.algorithms, `registry.policy_loss_options`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from rlc.core import algorithms
from rlc.core.runtime_facts import LOGPROB_CHUNK_TOKENS
from rlc.runtime.algorithms.registry import resolve

# Log-ratios are clamped before exp so a stale token cannot overflow the ratio (SkyRL's safe_exp_delta).
_MAX_LOG_RATIO = 20.0
# GSPO caps only the top of its sequence log-ratio, at 10 like SkyRL (e^10 ~ 2.2e4).
_GSPO_MAX_LOG_RATIO = 10.0


def token_log_probs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each given token id under softmax(logits / temperature), in float32 (`score_tokens`)."""
    return score_tokens(logits, token_ids, temperature)[0]


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-position entropy of softmax(logits / temperature); -inf logits (banned tokens) add nothing."""
    ids = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    ent = score_tokens(logits, ids, temperature, entropy=True)[1]
    assert ent is not None
    return ent


def score_tokens(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    *,
    entropy: bool = False,
    sum_pi_squared: bool = False,
    rows: torch.Tensor | None = None,
    chunk: int | None = LOGPROB_CHUNK_TOKENS,
    vocab_start: int = 0,
    vocab_size: int | None = None,
    group: Any = None,
    inplace_backward: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each token id under softmax(logits / temperature), and the entropy when asked, in float32
    (float64 for float64 logits).

    The same values and gradients as `log_softmax(logits.float() / temperature)` gathered at the ids (and its
    entropy), without its [tokens, vocab] float32 tensors: `chunk` tokens at a time are upcast, reduced to a
    log-sum-exp, the chosen logit and the entropy, and dropped; backward recomputes each chunk's softmax from the
    saved logits (in their own dtype) and writes (onehot - softmax) * grad (and the entropy's term) into the
    logits' gradient. Float32 work space is O(chunk * vocab) instead of O(tokens * vocab). `chunk` None: all the
    scored tokens at once (trainer.logprobs_chunk_size null).

    `logits` is [..., vocab]; without `rows`, `token_ids` has its leading shape. With `rows`, the logits are taken
    as [N, vocab] rows (a view of contiguous logits) and only those rows are scored, `token_ids` matching `rows`: a
    model's output is scored at some positions without copying them out first. -inf logits (banned tokens) get
    no probability; a banned id scores -inf, as log_softmax gives.

    Vocabulary parallel (Megatron's tensor parallelism): `logits` is this rank's columns, starting at global id
    `vocab_start`; columns at or past `vocab_size` (padding) get no probability; the normaliser and the chosen
    logit are summed over `group`. Each rank's backward is its own columns' gradient (every rank holds the loss).

    `inplace_backward`: backward writes the logits' gradient over the logits themselves (as flash-attention's
    cross-entropy does), so training holds one [tokens, vocab] tensor instead of two. Only for logits nothing else
    reads in backward (a model head's output); another autograd node that saved them then fails loudly (the
    version check) rather than read the gradient. With `rows`, each row may be scored once only.

    `sum_pi_squared`: the second result is each token's sum of squared probabilities instead of its entropy (the
    optimal token baselines' input; forward passes only: it has no gradient).
    """
    if entropy and sum_pi_squared:
        raise ValueError("score_tokens gives the entropy or the sum of squared probabilities, not both")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    if chunk is None:
        chunk = max(1, token_ids.numel())
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    width = logits.shape[-1]
    if rows is None:
        if token_ids.shape != logits.shape[:-1]:
            raise ValueError(f"token ids {tuple(token_ids.shape)} do not match logits {tuple(logits.shape)}")
        shape = token_ids.shape
        flat = logits.reshape(-1, width)  # a view for contiguous logits (a copy only for a strided slice)
    else:
        if token_ids.shape != rows.shape:
            raise ValueError(f"token ids {tuple(token_ids.shape)} do not match rows {tuple(rows.shape)}")
        shape = rows.shape
        flat = logits.reshape(-1, width)
        rows = rows.reshape(-1).to(device=logits.device, dtype=torch.long)
    valid = width if vocab_size is None else max(min(width, vocab_size - vocab_start), 0)
    logp, ent = _ChunkedScores.apply(
        flat,
        rows,
        token_ids.reshape(-1).to(device=logits.device, dtype=torch.long),
        float(temperature),
        bool(entropy),
        bool(sum_pi_squared),
        int(chunk),
        int(vocab_start),
        valid,
        group,
        bool(inplace_backward),
    )
    return logp.view(shape), (ent.view(shape) if entropy or sum_pi_squared else None)


# Below this a log-probability's exp is 0 in every float format: clamping there keeps 0 * -inf (a banned token's
# p log p) at 0 instead of NaN, and unlike the lowest float it cannot overflow once multiplied by a gradient.
_LOG_FLOOR = -1e4


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _block(flat: torch.Tensor, rows: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor:
    """Tokens lo:hi of the scored ones, in float32 or wider, [hi - lo, vocab] (a new tensor: safe to change in place)."""
    part = flat[lo:hi] if rows is None else flat.index_select(0, rows[lo:hi])
    return part.to(_wide(flat.dtype), copy=True)


def _scaled(x: torch.Tensor, temperature: float, valid: int) -> torch.Tensor:
    if valid < x.shape[-1]:
        x[:, valid:] = float("-inf")
    return x.div_(temperature) if temperature != 1.0 else x


class _ChunkedScores(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, flat, rows, targets, temperature, want_entropy, want_sps, chunk, vocab_start, valid, group, inplace
    ):
        count = targets.numel()
        dev, wide = flat.device, _wide(flat.dtype)
        width = flat.shape[-1]
        local = targets - vocab_start
        mine = (local >= 0) & (local < valid)
        if group is not None:  # ids in other ranks' columns: any in-range index (their value is not used)
            local = local.clamp(0, max(width - 1, 0))
        parallel = group is not None and torch.distributed.get_world_size(group) > 1
        peak = torch.empty(count, dtype=wide, device=dev)
        if parallel:  # one normaliser over every rank's columns: shift by the global maximum first
            for lo in range(0, count, chunk):
                hi = min(lo + chunk, count)
                part = flat[lo:hi] if rows is None else flat.index_select(0, rows[lo:hi])
                top = part[:, :valid].amax(-1) if valid > 0 else torch.full((hi - lo,), float("-inf"), device=dev)
                peak[lo:hi] = top.to(wide) / temperature if temperature != 1.0 else top.to(wide)
            torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX, group=group)
        # sum of exp(x - peak), the chosen token's x - peak, and sum of exp(x - peak) * (x - peak) (entropy) or of
        # exp(2 * (x - peak)) (the sum of squared probabilities, over the first sum squared)
        sums = torch.zeros((3 if want_entropy or want_sps else 2, count), dtype=wide, device=dev)
        for lo in range(0, count, chunk):
            hi = min(lo + chunk, count)
            x = _scaled(_block(flat, rows, lo, hi), temperature, valid)
            if not parallel:
                peak[lo:hi] = x.amax(-1)
            x.sub_(peak[lo:hi, None])
            picked = x.gather(1, local[lo:hi, None]).squeeze(1)
            sums[1, lo:hi] = torch.where(mine[lo:hi], picked, 0.0)
            e = x.exp()
            sums[0, lo:hi] = e.sum(-1)
            if want_entropy:
                # exp(-inf) * -inf would be NaN: a banned token's term is 0 * _LOG_FLOOR, i.e. 0.
                sums[2, lo:hi] = torch.linalg.vecdot(e, x.clamp_(min=_LOG_FLOOR))
            elif want_sps:
                sums[2, lo:hi] = torch.linalg.vecdot(e, e)
            del x, e
        if parallel:
            torch.distributed.all_reduce(sums, group=group)
        log_total = sums[0].log()
        logp = sums[1] - log_total
        lse = peak + log_total
        if want_entropy:
            ent = log_total - sums[2] / sums[0]
        else:
            ent = sums[2] / sums[0] ** 2 if want_sps else logp.new_empty(0)
        ctx.save_for_backward(flat, rows, local, mine, lse, ent if want_entropy else None)
        ctx.opts = (temperature, want_entropy, chunk, valid, inplace)
        ctx.set_materialize_grads(False)
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp, grad_ent):
        flat, rows, local, mine, lse, ent = ctx.saved_tensors
        temperature, want_entropy, chunk, valid, inplace = ctx.opts
        if grad_logp is None and (grad_ent is None or not want_entropy):
            return (None,) * 11
        count = local.numel()
        if inplace:  # each block is copied out (`_block`) before its gradient overwrites it
            grad = flat
        else:
            grad = torch.zeros_like(flat) if rows is not None else torch.empty_like(flat)
        with_ent = want_entropy and grad_ent is not None
        g_logp = grad_logp.to(lse.dtype) if grad_logp is not None else torch.zeros_like(lse)
        for lo in range(0, count, chunk):
            hi = min(lo + chunk, count)
            g = g_logp[lo:hi, None]
            x = _scaled(_block(flat, rows, lo, hi), temperature, valid).sub_(lse[lo:hi, None])  # log p
            p = x.exp()
            if with_ent:  # d(-sum p log p)/dx = -p (log p + H)
                coef = x.clamp_(min=_LOG_FLOOR).add_(ent[lo:hi, None]).mul_(grad_ent[lo:hi, None].to(lse.dtype)).add_(g)
                p.mul_(coef)
            else:
                p.mul_(g)
            p.neg_()
            p.scatter_add_(1, local[lo:hi, None], torch.where(mine[lo:hi, None], g, 0.0))
            if temperature != 1.0:
                p.div_(temperature)
            if rows is None:
                grad[lo:hi].copy_(p)
            elif inplace:
                grad.index_copy_(0, rows[lo:hi], p.to(grad.dtype))
            else:
                grad.index_add_(0, rows[lo:hi], p.to(grad.dtype))
            del x, p
        if inplace and rows is not None:  # rows that were not scored get no gradient
            unscored = torch.ones(grad.shape[0], dtype=torch.bool, device=grad.device)
            unscored[rows] = False
            grad[unscored] = 0
        return grad, None, None, None, None, None, None, None, None, None, None


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
    raise ValueError(_unknown_reduction(loss_reduction))


def _unknown_reduction(name: str) -> str:
    return f"unknown loss_reduction {name!r}; expected one of {', '.join(algorithms.REDUCTIONS)}"


def _token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return reduce_loss(values.to(torch.float32), mask, "token_mean").detach()


def _safe_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp of a log-ratio clamped to +-_MAX_LOG_RATIO, in float32 or wider."""
    wide = torch.promote_types(log_ratio.dtype, torch.float32)
    return log_ratio.to(wide).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO).exp()


def _ppo_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_clip_low: float, eps_clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-min(r*A, clip(r, 1-low, 1+high)*A), and where the clip lowered the objective.

    A ratio exactly on a boundary is not clipped.
    """
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_clip_low, 1.0 + eps_clip_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def _present(mask: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The mask as bool, and `tensors` with 0 outside it, so inf/NaN there reach no value or gradient."""
    keep = mask.bool()
    return keep, [torch.where(keep, x, 0.0) for x in tensors]


def _centred(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """`values` minus their mean over the kept tokens of the whole batch (float32 or wider)."""
    values = values.to(torch.promote_types(values.dtype, torch.float32))
    return values - torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)


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
    ratio = _safe_exp(log_ratio).to(log_ratio.dtype)
    token_loss, clipped = _ppo_objective(ratio, advantages, eps_clip_low, eps_clip_high)
    metrics = {
        "clip_fraction": _token_mean(clipped.float(), mask),
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
    def policy_loss(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        *,
        loss_reduction: str = "token_mean",
        max_seq_len: int | None = None,
        **clip,
    ):
        token_loss, metrics = token_fn(log_probs, old_log_probs, advantages, mask, **clip)
        return reduce_loss(token_loss, mask, loss_reduction, max_seq_len), metrics

    policy_loss.__doc__ = (
        f"{(token_fn.__doc__ or token_fn.__name__).splitlines()[0]} Reduced to a scalar by `loss_reduction`."
    )
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
    """Per-token weights w with sum(token_loss * w) over a whole mini-batch == reduce_loss of it, by the loss
    reduction's card (rlc.core.algorithms).

    A worker sees only its micro-batches of its shard; the totals are the mini-batch's (all ranks), so
    micro-batch and rank losses add up to the mini-batch loss whatever the split.
    """
    card = algorithms.REDUCTIONS.get(loss_reduction)
    if card is None:
        raise ValueError(_unknown_reduction(loss_reduction))
    if card.over_mini_batch:
        raise ValueError(f"{loss_reduction}'s weights are the mini-batch's (mini_batch_weights), not a micro-batch's")
    weights = resolve(card.function)
    return weights(
        mask.to(torch.float32), total_tokens=total_tokens, total_sequences=total_sequences, max_seq_len=max_seq_len
    )


def mini_batch_weights(
    algorithm, mask: torch.Tensor, group: torch.Tensor, micro_batch_size: int
) -> torch.Tensor | None:
    """Per-token weights of `trainer.algorithm.loss_reduction` when it is one over the mini-batch (its card), from
    the whole mini-batch's rows in order: the driver computes them, and each rank sums its rows' token losses times
    them. None for a reduction each rank weighs from the totals (`token_weights`)."""
    card = algorithms.REDUCTIONS.get(algorithm.loss_reduction)
    if card is None:
        raise ValueError(_unknown_reduction(algorithm.loss_reduction))
    if not card.over_mini_batch:
        return None
    weights = resolve(card.function)
    return weights(mask.to(torch.float32), group, micro_batch_size=micro_batch_size, max_seq_len=algorithm.max_seq_len)


def token_mean_legacy_weights(mask, group, *, micro_batch_size, max_seq_len):
    """Each run of `micro_batch_size` rows a token mean, the runs averaged (rows past the last whole run, which
    SkyRL's split never makes, weigh nothing)."""
    size = max(int(micro_batch_size), 1)
    runs = max(mask.shape[0] // size, 1)
    weights = torch.zeros_like(mask)
    for start in range(0, runs * size, size):
        part = mask[start : start + size]
        weights[start : start + size] = part / part.sum().clamp(min=1) / runs
    return weights


def prompt_mean_weights(mask, group, *, micro_batch_size, max_seq_len):
    """Each prompt's samples (the rows sharing its `group`) a token mean, the prompts averaged."""
    prompts, index = torch.unique(group, return_inverse=True)
    tokens = torch.zeros(len(prompts), dtype=mask.dtype, device=mask.device).index_add_(0, index, mask.sum(dim=-1))
    return mask / (len(prompts) * tokens.clamp(min=1))[index].unsqueeze(-1)


# Each loss reduction's weights, which its card names (the same reductions as `reduce_loss`'s).
def token_mean_weights(mask, *, total_tokens, total_sequences, max_seq_len):
    return mask / max(total_tokens, 1.0)


def sequence_mean_weights(mask, *, total_tokens, total_sequences, max_seq_len):
    return mask / mask.sum(dim=-1, keepdim=True).clamp(min=1) / max(total_sequences, 1.0)


def seq_mean_token_sum_norm_weights(mask, *, total_tokens, total_sequences, max_seq_len):
    if max_seq_len is None or max_seq_len < 1:
        raise ValueError("seq_mean_token_sum_norm needs max_seq_len >= 1")
    return mask / max_seq_len / max(total_sequences, 1.0)


def gspo_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token GSPO-token loss (Zheng et al., 2025): the PPO clip applied to a sequence-level ratio.

    Every token of a sequence has the value s = exp(masked mean of its log-ratios), capped at e^10,
    but the gradient of its own log-prob only: s_t = sg(s) * p_t / sg(p_t). SkyRL advises sequence_mean.
    """
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    log_ratio = log_probs - old_log_probs
    wide = torch.promote_types(log_ratio.dtype, torch.float32)
    seq_log_ratio = log_ratio.detach().to(wide).sum(-1, keepdim=True) / keep.sum(-1, keepdim=True).clamp(min=1)
    # logp - sg(logp) is exactly 0, so the value is the sequence term's alone.
    own = log_probs.to(wide) - log_probs.detach().to(wide)
    ratio = (own + seq_log_ratio).clamp(max=_GSPO_MAX_LOG_RATIO).exp()
    token_loss, clipped = _ppo_objective(ratio, advantages, eps_clip_low, eps_clip_high)
    metrics = {
        "clip_fraction": _token_mean(clipped.float(), keep),
        "approx_kl": _token_mean(-log_ratio, keep),
        "ratio_mean": _token_mean(ratio, keep),
    }
    return torch.where(keep, token_loss, 0.0), metrics


def cispo_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    cispo_eps_clip_low: float = 0.0,
    cispo_eps_clip_high: float = 5.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token CISPO loss (MiniMax-M1, 2025): -sg(clip(r, 1-low, 1+high)) * A * log p.

    The clipped ratio only weights a REINFORCE gradient, so a clipped token still learns (in PPO
    it would get no gradient).
    """
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    log_ratio = log_probs - old_log_probs
    ratio = _safe_exp(log_ratio.detach())
    low, high = 1.0 - cispo_eps_clip_low, 1.0 + cispo_eps_clip_high
    weight = ratio.clamp(low, high)
    token_loss = -weight * advantages * log_probs
    metrics = {
        "clip_fraction": _token_mean(((ratio < low) | (ratio > high)).float(), keep),
        "approx_kl": _token_mean(-log_ratio, keep),
        "ratio_mean": _token_mean(ratio, keep),
        "clipped_ratio_mean": _token_mean(weight, keep),
    }
    return torch.where(keep, token_loss, 0.0), metrics


def sapo_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token SAPO loss (Gao et al., 2025): -A * (4 / tau) * sigmoid(tau * (r - 1)).

    tau is tau_pos where A > 0, else tau_neg. The gate has slope 1 at r = 1 (the plain policy
    gradient) and flattens as r moves away: a soft trust region instead of a hard clip.
    """
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    log_ratio = log_probs - old_log_probs
    ratio = _safe_exp(log_ratio)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gate = torch.sigmoid(tau * (ratio - 1.0))
    token_loss = -(4.0 / tau) * gate * advantages
    metrics = {
        "approx_kl": _token_mean(-log_ratio, keep),
        "ratio_mean": _token_mean(ratio, keep),
        # d(gate value)/dr: the share of the plain policy gradient each token keeps.
        "gate_weight_mean": _token_mean(4.0 * gate * (1.0 - gate), keep),
    }
    return torch.where(keep, token_loss, 0.0), metrics


def rollout_is_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    rollout_log_probs: torch.Tensor,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token rollout-IS loss (GLM-5's agentic loss, SkyRL's `rollout_is`): -sg(w) * A * log p, where
    w = r = p / p_rollout inside (1 - low, 1 + high) and 0 outside.

    The ratio is against the engine's log-probs, not the old policy's: the loss needs no old log-probs. A token
    whose ratio left the band gets no gradient at all (PPO would still let it move towards the band).
    """
    keep, (log_probs, rollout, advantages) = _present(mask, log_probs, rollout_log_probs, advantages)
    ratio = _safe_exp((log_probs - rollout).detach())
    inside = (ratio > 1.0 - eps_clip_low) & (ratio < 1.0 + eps_clip_high)
    token_loss = -torch.where(inside, ratio, 0.0) * advantages * log_probs
    metrics = {
        "clip_fraction": _token_mean((~inside).float(), keep),
        "ratio_mean": _token_mean(ratio, keep),
    }
    return torch.where(keep, token_loss, 0.0), metrics


def importance_sampling_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token importance-sampled policy gradient (Tinker's and SkyRL's `importance_sampling`): -r * A with
    r = p / p_old, neither clipped nor clamped."""
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    wide = torch.promote_types(log_probs.dtype, torch.float32)
    ratio = (log_probs.to(wide) - old_log_probs.to(wide)).exp()
    metrics = {"ratio_mean": _token_mean(ratio, keep), "approx_kl": _token_mean(old_log_probs - log_probs, keep)}
    return torch.where(keep, -ratio * advantages, 0.0), metrics


def cross_entropy_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token negative log-likelihood of the sampled tokens (SkyRL's `cross_entropy`, its SFT loss): -log p.

    Advantages and old log-probs are not read: every response token in the loss mask is imitated.
    """
    keep, (log_probs,) = _present(mask, log_probs)
    return torch.where(keep, -log_probs, 0.0), {}


def _pick_at_random(candidates: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """A bool tensor like `candidates` marking `count` of its True entries chosen uniformly (all if fewer)."""
    index = candidates.flatten().nonzero().squeeze(-1)
    if index.numel() > count:
        device = generator.device if generator is not None else torch.device("cpu")
        order = torch.randperm(index.numel(), generator=generator, device=device).to(index.device)
        index = index[order[:count]]
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    chosen[index] = True
    return chosen.view_as(candidates)


def clip_cov_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
    clip_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token Clip-Cov loss (Cui et al., 2025): the PPO loss, with a few high-covariance tokens dropped.

    cov_t = (A_t - mean A) * (log p_t - mean log p) over the batch's masked tokens. Among tokens the
    PPO clip left alone with clip_cov_lb < cov_t < clip_cov_ub, max(1, floor(clip_ratio * tokens))
    chosen uniformly at random get loss 0. The draw uses `generator`, else torch's default generator
    (reproducible under torch.manual_seed), as the paper and SkyRL draw at random.
    """
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    log_ratio = log_probs - old_log_probs
    token_loss, clipped = _ppo_objective(_safe_exp(log_ratio), advantages, eps_clip_low, eps_clip_high)
    with torch.no_grad():
        cov = _centred(advantages, keep) * _centred(log_probs, keep)
        candidates = keep & ~clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        count = max(int(clip_ratio * int(keep.sum())), 1)
        dropped = _pick_at_random(candidates, count, generator)
    metrics = {
        "clip_fraction": _token_mean(clipped.float(), keep),
        "cov_clip_fraction": _token_mean(dropped.float(), keep),
        "approx_kl": _token_mean(-log_ratio, keep),
    }
    return torch.where(keep & ~dropped, token_loss, 0.0), metrics


def kl_cov_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl_cov_frac: float = 0.2,
    ppo_kl_coef: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token KL-Cov loss (Cui et al., 2025): -r*A, plus ppo_kl_coef * |log r| on the top-covariance tokens.

    cov_t as in Clip-Cov; the max(1, floor(kl_cov_frac * tokens)) masked tokens with the largest cov
    are penalized, ties going to the earlier position, so the choice is deterministic. No clipping.
    """
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    log_ratio = log_probs - old_log_probs
    ratio = _safe_exp(log_ratio)
    with torch.no_grad():
        cov = torch.where(keep, _centred(advantages, keep) * _centred(log_probs, keep), -torch.inf)
        tokens = int(keep.sum())
        count = max(int(kl_cov_frac * tokens), 1) if tokens else 0
        top = torch.sort(cov.flatten(), descending=True, stable=True).indices[:count]
        penalized = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
        penalized[top] = True
        penalized = penalized.view_as(cov)
    token_loss = -ratio * advantages + torch.where(penalized, ppo_kl_coef * log_ratio.abs(), 0.0)
    metrics = {
        "approx_kl": _token_mean(-log_ratio, keep),
        "kl_cov_fraction": _token_mean(penalized.float(), keep),
    }
    return torch.where(keep, token_loss, 0.0), metrics


def gpg_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token GPG loss (verl's `gpg`): the plain policy gradient -A * log p, with no ratio and no clip."""
    keep, (log_probs, advantages) = _present(mask, log_probs, advantages)
    return torch.where(keep, -advantages * log_probs, 0.0), {}


def geo_mean_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token GMPO loss (Zhao et al., 2025; verl's `geo_mean`): a sequence's -A * r, with r the geometric mean of
    its tokens' ratios, each log-ratio clipped to (-low, high) on the side its advantage's sign would exploit.

    Every token of a sequence carries the sequence's loss, so `sequence_mean` gives verl's value (verl always
    averages it over sequences) and A is the sequence's mean token advantage.
    """
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    weight = keep.to(log_probs.dtype)
    log_ratio = log_probs - old_log_probs
    sign = torch.sign(advantages)
    clipped = log_ratio.clamp(-eps_clip_low, eps_clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    lengths = weight.sum(-1)
    ratio = torch.exp((pessimistic * weight).sum(-1) / (lengths + 1e-8))
    advantage = (advantages * weight).sum(-1) / (lengths + 1e-8)
    outside = log_ratio != clipped
    metrics = {
        "clip_fraction": _token_mean((outside & (advantages > 0)).float(), keep),
        "clip_fraction_lower": _token_mean((outside & (advantages < 0)).float(), keep),
        "approx_kl": _token_mean(-log_ratio, keep),
    }
    return torch.where(keep, (-advantage * ratio)[:, None], 0.0), metrics


def _dppo_verl_loss(log_probs, old_log_probs, advantages, mask, valid, clip_ratio_c):
    """verl's DPPO: -A * sg(min(r, c)) * log p on the tokens `valid(p, p_old)` keeps."""
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    log_ratio = log_probs - old_log_probs
    ratio = _safe_exp(log_ratio.detach()).to(log_probs.dtype)
    with torch.no_grad():
        kept = valid(log_probs.detach(), old_log_probs, advantages)
    token_loss = -advantages * ratio.clamp(max=clip_ratio_c) * log_probs * kept
    metrics = {
        "clip_fraction": _token_mean((~kept).float(), keep),
        "truncated_fraction": _token_mean(((ratio > clip_ratio_c) & kept).float(), keep),
        "approx_kl": _token_mean(-log_ratio, keep),
    }
    return torch.where(keep, token_loss, 0.0), metrics


def dppo_tv_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token DPPO Binary-TV loss (Qi et al., 2026; verl's `dppo_tv`): -A * sg(min(r, clip_ratio_c)) * log p,
    without the tokens whose probability moved past the threshold in the advantage's direction (p - p_old above
    eps_clip_high for A > 0, below -eps_clip_low otherwise)."""

    def valid(log_probs, old_log_probs, advantages):
        moved = log_probs.exp() - old_log_probs.exp()
        return torch.where(advantages > 0, moved <= eps_clip_high, moved >= -eps_clip_low)

    return _dppo_verl_loss(log_probs, old_log_probs, advantages, mask, valid, clip_ratio_c)


def _binary_kl(log_probs: torch.Tensor, anchor_log_probs: torch.Tensor) -> torch.Tensor:
    """KL(anchor || new) of the two-outcome distribution (the sampled token, or any other)."""
    p, q = log_probs.exp(), anchor_log_probs.exp()
    return q * (anchor_log_probs - log_probs) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))


def dppo_kl_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip_low: float = 0.2,
    eps_clip_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token DPPO Binary-KL loss (verl's `dppo_kl`): as dppo_tv, the threshold on the binary KL between the old
    and new probability of the token instead of their difference."""

    def valid(log_probs, old_log_probs, advantages):
        kl = _binary_kl(log_probs, old_log_probs)
        up, down = log_probs > old_log_probs, log_probs < old_log_probs
        return torch.where(advantages > 0, (kl <= eps_clip_high) | ~up, (kl <= eps_clip_low) | ~down)

    return _dppo_verl_loss(log_probs, old_log_probs, advantages, mask, valid, clip_ratio_c)


def dppo_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    rollout_log_probs: torch.Tensor,
    dppo_type: str = "binary_tv",
    delta_low: float = 0.2,
    delta_high: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token DPPO loss (SkyRL's `dppo`): -r * A with r against the engine's log-probs, without the tokens whose
    divergence from the engine's distribution passed delta_high (A > 0) or delta_low (A < 0) in the advantage's
    direction: the probability difference (binary_tv) or the binary KL (binary_kl)."""
    keep, (log_probs, rollout, advantages) = _present(mask, log_probs, rollout_log_probs, advantages)
    ratio = _safe_exp(log_probs - rollout).to(log_probs.dtype)
    with torch.no_grad():
        moved = log_probs.exp() - rollout.exp()
        if dppo_type == "binary_tv":
            up, down = moved > delta_high, -moved > delta_low
        elif dppo_type == "binary_kl":
            kl = _binary_kl(log_probs, rollout)
            up, down = (moved > 0) & (kl > delta_high), (moved < 0) & (kl > delta_low)
        else:
            raise ValueError(f"unknown dppo_type {dppo_type!r}; expected binary_tv or binary_kl")
        dropped = ((advantages > 0) & up) | ((advantages < 0) & down)
    metrics = {"clip_fraction": _token_mean(dropped.float(), keep), "ratio_mean": _token_mean(ratio, keep)}
    return torch.where(keep & ~dropped, -ratio * advantages, 0.0), metrics


def dro_token_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token DRO loss (Richemond et al., 2024; verl's `dro`): -(A * log p - beta/2 * (log p - log p_old)^2).

    The penalty feeds every token, whatever its advantage; `beta` has no default (RLC-E315 asks for it).
    """
    if beta is None or beta <= 0:
        raise ValueError(f"the dro loss needs trainer.algorithm.dro.beta > 0, got {beta}")
    keep, (log_probs, old_log_probs, advantages) = _present(mask, log_probs, old_log_probs, advantages)
    log_ratio = log_probs - old_log_probs
    token_loss = -(advantages * log_probs - 0.5 * beta * log_ratio.square())
    metrics = {"approx_kl": _token_mean(-log_ratio, keep), "log_ratio_square": _token_mean(log_ratio.square(), keep)}
    return torch.where(keep, token_loss, 0.0), metrics
