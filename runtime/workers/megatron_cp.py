"""Context parallelism for the megatron strategy: every sequence split over the ranks of a context group.

A row of length S (right-padded to a multiple of 2·cp) is cut into 2·cp equal chunks, and context rank r
holds chunks r and 2·cp−1−r. Under a causal mask the early chunks attend to few keys and the late ones to
many, so pairing them gives every rank the same attention work; it is the split Megatron-Core's rotary
embedding assumes for a context-parallel rank, so the positions of the local tokens agree with it.

Attention is the one place ranks need each other's tokens. `ContextParallelAttention` gathers the keys and
values of the whole sequence from the group (the gradients of the gathered copies are summed back to the
rank that owns them) and attends this rank's queries to them, with a mask that is causal in global
positions and hides padding. Everything else in a layer is per token. Log-probs are computed on each rank
for the response positions it holds and summed over the group, so every rank of the group sees the whole
row's log-probs and the same loss; Megatron's schedule and DDP account for the group in the gradients
(the loss is multiplied by cp, the gradients averaged over data × context ranks).

The keys and values of the whole sequence sit on every rank of the group (as in Llama 3's context
parallelism), so activation memory falls by cp everywhere but the attention's key/value copies. It needs
no TransformerEngine and runs on gloo as well as nccl.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist


def padded_length(seq_len: int, cp: int) -> int:
    """The row length after right-padding to a multiple of 2·cp."""
    step = 2 * cp
    return -(-seq_len // step) * step


def local_positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of context rank `rank`'s tokens (chunks rank and 2·cp−1−rank) in a row of
    `seq_len` tokens, a multiple of 2·cp; with cp = 1, the whole row, whatever its length."""
    if cp == 1:
        return torch.arange(seq_len)
    if seq_len % (2 * cp):
        raise ValueError(f"a row of {seq_len} tokens does not split into {2 * cp} chunks")
    chunk = seq_len // (2 * cp)
    return torch.cat(
        [
            torch.arange(rank * chunk, (rank + 1) * chunk),
            torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk),
        ]
    )


def gathered_positions(seq_len: int, cp: int) -> torch.Tensor:
    """Global positions of the tokens in the order `gather_sequence` returns them (rank by rank)."""
    return torch.cat([local_positions(seq_len, cp, r) for r in range(cp)])


def attention_mask(attn: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """Megatron's mask (True = hidden) of this rank's queries against the gathered keys, [b, 1, sq, S]:
    a key is visible when it is a real token at or before the query's global position."""
    seq_len = attn.shape[1]
    queries = local_positions(seq_len, cp, rank).to(attn.device)
    keys = gathered_positions(seq_len, cp).to(attn.device)
    causal = keys[None, :] <= queries[:, None]
    allowed = causal[None, None] & attn.bool()[:, keys][:, None, None, :]
    return ~allowed


class _GatherSequence(torch.autograd.Function):
    """All ranks' tensors concatenated along dim 0 in rank order; backward: the summed gradient of this rank's part."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.n = group, dist.get_rank(group), x.shape[0]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce-scatter
        return grad[ctx.rank * ctx.n : (ctx.rank + 1) * ctx.n], None


class _SumOverGroup(torch.autograd.Function):
    """The sum of every rank's tensor; backward: the gradient as it is (each rank computes the same loss from
    the sum, so each already holds the gradient of its own part)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    return _GatherSequence.apply(x, group)


def sum_over_group(x: torch.Tensor, group) -> torch.Tensor:
    return _SumOverGroup.apply(x, group)


def response_values(values: torch.Tensor, positions: torch.Tensor, start: int, length: int, group) -> torch.Tensor:
    """[b, length] values of the whole response on every rank of the group, from this rank's `values` at the
    global token `positions` (each scoring the token after it; the response is scored from `start`)."""
    out = values.new_zeros(values.shape[0], length).index_copy(1, positions - start, values)
    return sum_over_group(out, group)


def context_parallel_attention_class():
    """Megatron's DotProductAttention over the gathered keys and values (built lazily: Megatron-Core is optional)."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it); workers/ulysses.py (FSDP) imports this module
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class ContextParallelAttention(DotProductAttention):
        def __init__(self, config, *args, **kwargs):
            kwargs.pop("cp_comm_type", None)  # TransformerEngine's ring variants: the keys are gathered here
            local = copy.copy(config)
            local.context_parallel_size = 1  # the parent attends one rank's queries to the keys it is given
            super().__init__(local, *args, **kwargs)
            self.cp_group = ps.get_context_parallel_group()

        def forward(
            self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
        ):
            key = gather_sequence(key, self.cp_group)
            value = gather_sequence(value, self.cp_group)
            return super().forward(
                query,
                key,
                value,
                attention_mask,
                attn_mask_type=attn_mask_type,
                attention_bias=attention_bias,
                packed_seq_params=packed_seq_params,
            )

    return ContextParallelAttention
