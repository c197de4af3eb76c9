"""Log-probs straight from a model's last hidden states and its LM-head weight (trainer.fused_lm_head_logprob).

The same values and gradients as scoring the head's logits (`rlc.runtime.algorithms.losses.score_tokens` on
`hidden @ weight.T`), but the head's matmul runs inside the chunk loop: `chunk` tokens' logits exist at a time, in
forward and again in backward (recomputed from the saved hidden states and weight), so no [tokens, vocab] tensor,
nor its gradient, is ever whole. Vocabulary parallel as score_tokens: `weight` is this rank's rows of the head.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from rlc.core.runtime_facts import LOGPROB_CHUNK_TOKENS

__all__ = ["score_from_hidden"]


def score_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    *,
    rows: torch.Tensor | None = None,
    chunk: int | None = LOGPROB_CHUNK_TOKENS,
    vocab_start: int = 0,
    vocab_size: int | None = None,
    group: Any = None,
    entropy: bool = False,
    sum_pi_squared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each token id under softmax(hidden @ weight.T / temperature), in float32 (float64 for a
    float64 weight), and the entropy or the sum of squared probabilities when asked (no gradient: metrics only).

    `hidden` is [..., H], `weight` [local vocab, H] starting at global id `vocab_start`; ids at or past `vocab_size`
    (the padding that makes the vocabulary divide by tp) get no probability, and the normaliser and the chosen logit
    are summed over `group`. Without `rows`, `token_ids` has hidden's leading shape; with `rows`, hidden is taken as
    [N, H] rows and only those are scored. Backward gives hidden this rank's share of its gradient (the caller sums
    it over `group`, as Megatron's output layer does) and the weight its own rows'.
    """
    if entropy and sum_pi_squared:
        raise ValueError("score_from_hidden gives the entropy or the sum of squared probabilities, not both")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    width = hidden.shape[-1]
    flat = hidden.reshape(-1, width)
    if rows is None:
        if token_ids.shape != hidden.shape[:-1]:
            raise ValueError(f"token ids {tuple(token_ids.shape)} do not match hidden {tuple(hidden.shape)}")
        rows = torch.arange(flat.shape[0], device=hidden.device)
    elif token_ids.shape != rows.shape:
        raise ValueError(f"token ids {tuple(token_ids.shape)} do not match rows {tuple(rows.shape)}")
    shape = token_ids.shape
    ids = token_ids.reshape(-1).to(device=hidden.device, dtype=torch.long)
    rows = rows.reshape(-1).to(device=hidden.device, dtype=torch.long)
    chunk = max(1, ids.numel()) if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    extra = "entropy" if entropy else "sum_pi_squared" if sum_pi_squared else None
    limit = weight.shape[0] + vocab_start if vocab_size is None else vocab_size
    logp, side = _FusedHeadLogprob.apply(
        flat, weight, rows, ids, float(temperature), chunk, vocab_start, limit, group, extra
    )
    return logp.view(shape), None if side is None else side.view(shape)


def _work_dtype(weight: torch.Tensor) -> torch.dtype:
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


def _all_reduce(t: torch.Tensor, group: Any, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


class _Chunk:
    """One chunk's scaled logits and the local columns of its target ids."""

    def __init__(self, flat, weight, rows, ids, start, end, temperature, vocab_start, limit):
        h = flat[rows[start:end]].to(weight.dtype)
        self.h = h
        self.z = (h @ weight.t()).to(_work_dtype(weight)) / temperature
        local = weight.shape[0]
        if vocab_start + local > limit:  # padding columns past the vocabulary
            self.z[:, max(0, limit - vocab_start) :] = float("-inf")
        t = ids[start:end] - vocab_start
        self.own = (t >= 0) & (t < local) & (ids[start:end] < limit)
        self.target = torch.where(self.own, t, torch.zeros_like(t))


class _FusedHeadLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat, weight, rows, ids, temperature, chunk, vocab_start, limit, group, extra):  # type: ignore[override]
        n = ids.numel()
        work = _work_dtype(weight)
        logp = torch.empty(n, dtype=work, device=flat.device)
        lse = torch.empty(n, dtype=work, device=flat.device)
        side = torch.empty(n, dtype=work, device=flat.device) if extra else None
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            c = _Chunk(flat, weight, rows, ids, start, end, temperature, vocab_start, limit)
            top = _all_reduce(c.z.amax(-1), group, dist.ReduceOp.MAX)
            chosen = c.z.gather(-1, c.target[:, None]).squeeze(-1) * c.own
            sums = _all_reduce(torch.stack([(c.z - top[:, None]).exp().sum(-1), chosen]), group)
            lse[start:end] = top + sums[0].log()
            logp[start:end] = sums[1] - lse[start:end]
            if side is not None:
                p = (c.z - lse[start:end, None]).exp()
                if extra == "entropy":  # H = lse - sum(p z); padding columns (p = 0, z = -inf) add nothing
                    pz = torch.where(p > 0, p * c.z, torch.zeros_like(p)).sum(-1)
                    side[start:end] = lse[start:end] - _all_reduce(pz, group)
                else:
                    side[start:end] = _all_reduce((p * p).sum(-1), group)
        ctx.save_for_backward(flat, weight, rows, ids, lse)
        ctx.settings = (temperature, chunk, vocab_start, limit)
        if side is not None:
            ctx.mark_non_differentiable(side)
        return logp, side

    @staticmethod
    def backward(ctx, grad_logp, _grad_side):  # type: ignore[override]
        flat, weight, rows, ids, lse = ctx.saved_tensors
        temperature, chunk, vocab_start, limit = ctx.settings
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_flat = torch.zeros_like(flat) if want_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=_work_dtype(weight), device=weight.device) if want_weight else None
        )
        for start in range(0, ids.numel(), chunk):
            end = min(ids.numel(), start + chunk)
            c = _Chunk(flat, weight, rows, ids, start, end, temperature, vocab_start, limit)
            g = grad_logp[start:end].to(c.z.dtype)
            # d logp / d z = onehot(target) - softmax, and z is the logits over temperature
            dz = (c.z - lse[start:end, None]).exp().mul_(-g[:, None])
            dz.scatter_add_(-1, c.target[:, None], (g * c.own)[:, None])
            dz = dz.div_(temperature).to(weight.dtype)
            if grad_flat is not None:
                grad_flat.index_add_(0, rows[start:end], (dz @ weight).to(flat.dtype))
            if grad_weight is not None:
                grad_weight += (dz.t() @ c.h).to(grad_weight.dtype)
        gw = None if grad_weight is None else grad_weight.to(weight.dtype)
        return grad_flat, gw, None, None, None, None, None, None, None, None
