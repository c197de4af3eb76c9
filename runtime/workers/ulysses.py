"""Ulysses sequence parallelism for the fsdp2 strategy: every sequence split over the ranks of a group.

With `sequence_parallel_size` sp, the role's ranks form groups of sp consecutive ranks; a group takes one
data-parallel block of rows (data parallel = world / sp), and each of its ranks runs 1/sp of every row's
positions through the model. Everything in a decoder layer but attention is per token. Attention gets the whole
sequence by two all-to-alls (DeepSpeed-Ulysses): before it, each rank trades its positions of every head for all
positions of 1/sp of the heads; after it, the reverse. The attention kernel itself is the model's own (sdpa, eager
or flash attention), run on whole sequences.

The model's attention implementation is swapped for `attention` (a registered transformers attention function),
which reads the whole micro-batch's shape from a `SequenceSplit` passed down as the `rlc_split` keyword: the
model builds no mask of its own then (transformers skips mask creation for an implementation it has no mask
function for), and the split gives the one the whole sequence needs, causal in global positions, hiding padding
and keeping packed sequences apart.

The loss is computed on every rank of a group from the whole rows' outputs (`sum_over_group`), so each rank's
backward yields the gradient of its own positions, and the all-to-alls route the rest: the gradients summed over
the group are those of the unsplit rows, the same loss and gradient as sp = 1 on the same batch.

Heads: the query heads must divide by sp (the compiler checks); key/value heads that do not are repeated up to
lcm(kv, sp), which keeps each query head with its own key/value head.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from rlc.runtime.workers.megatron_cp import sum_over_group
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ATTENTION = "rlc_ulysses"  # the name the swapped-in attention function is registered under
INNER = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")  # kernels `attention` runs on whole sequences


def group_of(rank: int, world_size: int, sp: int):
    """This rank's sequence-parallel group (ranks sp·k .. sp·k + sp − 1); every rank must call it."""
    if world_size % sp:
        raise ValueError(f"sequence_parallel_size {sp} does not divide the world size {world_size}")
    mine = None
    for start in range(0, world_size, sp):
        group = dist.new_group(list(range(start, start + sp)))
        if start <= rank < start + sp:
            mine = group
    return mine


class _AllToAll(torch.autograd.Function):
    """Split `x` into the group's parts along `scatter`, send part i to rank i, and join what arrives along
    `gather` in rank order; backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, scatter: int, gather: int) -> torch.Tensor:
        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather
        return _exchange(x, group, scatter, gather)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _exchange(grad, ctx.group, ctx.gather, ctx.scatter), None, None, None


def _exchange(x: torch.Tensor, group, scatter: int, gather: int) -> torch.Tensor:
    parts = [p.contiguous() for p in x.tensor_split(dist.get_world_size(group), scatter)]
    out = [torch.empty_like(p) for p in parts]
    dist.all_to_all(out, parts, group=group)
    return torch.cat(out, gather)


@dataclass
class SequenceSplit:
    """One micro-batch's rows of `length` positions (a multiple of the group's size), split over the group.

    `key_mask` (rows, length) marks the real tokens, None when every key a query can see is real (the only padding
    follows a row's last token); `segments` (rows, length) numbers the packed sequences of a row, None for one
    sequence per row; `positions` are the model's position ids of the whole rows.
    """

    group: Any
    inner: str  # the model's own attention implementation, run on the whole sequences
    positions: torch.Tensor
    key_mask: torch.Tensor | None = None
    segments: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None  # packed: sequence boundaries of the whole row (flash attention)
    max_len: int = 0
    _masks: dict = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    @property
    def length(self) -> int:
        return self.positions.shape[1]

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's positions of a (rows, length, ...) tensor."""
        step = self.length // self.size
        return x[:, self.rank * step : (self.rank + 1) * step]

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, length) per-position outputs on every rank of the group from each rank's (rows, length / size);
        each rank's backward keeps the gradient of its own positions (every rank computes the same loss)."""
        step = self.length // self.size
        out = x.new_zeros(x.shape[0], self.length)
        out = out.index_copy(1, torch.arange(self.rank * step, (self.rank + 1) * step, device=x.device), x)
        return sum_over_group(out, self.group)

    def mask(self, dtype: torch.dtype, window: int | None) -> torch.Tensor | None:
        """The whole sequence's attention mask for sdpa (boolean, True = attend) or eager (additive), (rows, 1,
        length, length); None for sdpa when causal attention alone is right."""
        eager = self.inner == "eager"
        key = (eager, dtype, window)
        if key in self._masks:
            return self._masks[key]
        if not eager and self.key_mask is None and self.segments is None and window is None:
            self._masks[key] = None
            return None
        i = torch.arange(self.length, device=self.positions.device)
        allowed = (i[None, :] <= i[:, None])[None].expand(self.positions.shape[0], -1, -1)
        if window is not None:
            allowed = allowed & (i[:, None] - i[None, :] < window)
        if self.segments is not None:
            allowed = allowed & (self.segments[:, :, None] == self.segments[:, None, :])
        if self.key_mask is not None:
            allowed = allowed & self.key_mask[:, None, :].bool()
        # A padding query that may see no key would give NaN (and a NaN gradient through its masked keys): let it
        # see itself. Its output is never read.
        allowed = allowed | (~allowed.any(-1, keepdim=True) & torch.eye(self.length, dtype=torch.bool, device=i.device))
        allowed = allowed[:, None]
        if eager:
            out = torch.zeros(allowed.shape, dtype=dtype, device=i.device)
            mask = out.masked_fill(~allowed, torch.finfo(dtype).min)
        else:
            mask = allowed
        self._masks[key] = mask
        return mask


def padded_split(group, inner: str, ids: torch.Tensor, attn: torch.Tensor, positions: torch.Tensor, masked: bool):
    """A split of padded rows ([left-padded prompt | right-padded response], `masked` when some prompt is
    left-padded), right-padded to a multiple of the group's size; and this rank's ids and positions."""
    size = dist.get_world_size(group)
    pad = -ids.shape[1] % size
    if pad:
        ids = torch.nn.functional.pad(ids, (0, pad))
        attn = torch.nn.functional.pad(attn, (0, pad))
        # Positions go on counting: a restart would read as a new packed sequence to flash attention.
        positions = torch.cat([positions, positions[:, -1:] + torch.arange(1, pad + 1, device=ids.device)], 1)
    split = SequenceSplit(group, inner, positions, key_mask=attn.bool() if masked else None)
    return split, split.local(ids), split.local(positions)


def packed_split(group, inner: str, ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor):
    """A split of a packed (1, T) row: padded to a multiple of the group's size with a sequence of its own."""
    size = dist.get_world_size(group)
    total = ids.shape[1]
    pad = -total % size
    cu = cu_seqlens.to(ids.device)
    if pad:
        ids = torch.nn.functional.pad(ids, (0, pad))
        positions = torch.cat([positions, torch.arange(pad, device=ids.device)[None]], 1)
        cu = torch.cat([cu, cu.new_tensor([total + pad])])
    lengths = (cu[1:] - cu[:-1]).long()
    segments = torch.repeat_interleave(torch.arange(lengths.numel(), device=ids.device), lengths)[None]
    split = SequenceSplit(
        group, inner, positions, segments=segments, cu_seqlens=cu, max_len=int(lengths.max()) if pad or total else 0
    )
    return split, split.local(ids), split.local(positions)


class _Groups:
    """An attention module seen with another number of query heads per key/value head (after the split)."""

    def __init__(self, module: torch.nn.Module, groups: int):
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name: str):
        return getattr(self._module, name)


def attention(module, query, key, value, attention_mask, *, rlc_split: SequenceSplit | None = None, **kwargs):
    """The registered attention function: (rows, heads, local positions, dim) in, whole-sequence attention on 1/sp
    of the heads by the model's own kernel, (rows, local positions, heads, dim) out."""
    if rlc_split is None:
        raise RuntimeError(f"the {ATTENTION} attention runs only inside a sequence-parallel forward (rlc_split=...)")
    split, group = rlc_split, rlc_split.group
    size = split.size
    heads, kv = query.shape[1], key.shape[1]
    wanted = math.lcm(kv, size)  # key/value heads that split evenly, each query head keeping its own
    if wanted != kv:
        key = key.repeat_interleave(wanted // kv, dim=1)
        value = value.repeat_interleave(wanted // kv, dim=1)
    query = _AllToAll.apply(query, group, 1, 2)
    key = _AllToAll.apply(key, group, 1, 2)
    value = _AllToAll.apply(value, group, 1, 2)
    target = module if wanted == kv else _Groups(module, heads // wanted)
    window = kwargs.get("sliding_window")
    kwargs.pop("position_ids", None)  # the local ones; flash attention takes the whole row's boundaries below
    if split.inner.startswith("flash"):
        mask = split.key_mask
        if split.cu_seqlens is not None:
            kwargs.update(
                cu_seq_lens_q=split.cu_seqlens,
                cu_seq_lens_k=split.cu_seqlens,
                max_length_q=split.max_len,
                max_length_k=split.max_len,
            )
    else:
        mask = split.mask(query.dtype, window)
    out, _ = _inner(split.inner, module)(target, query, key, value, mask, **kwargs)
    return _AllToAll.apply(out, group, 1, 2), None


def _inner(name: str, module: torch.nn.Module):
    if name == "eager":  # each model family defines its own
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def unsupported(config: Any) -> str | None:
    """Why this model cannot split its sequences this way, or None."""
    inner = getattr(config, "_attn_implementation", None) or "eager"
    if inner not in INNER:
        return f"attention implementation {inner!r} (sequence parallelism runs {', '.join(INNER)})"
    other = set(getattr(config, "layer_types", None) or ()) - {"full_attention", "sliding_attention"}
    if other:
        return f"layer types {sorted(other)} mix tokens outside attention"
    return None


def enable(model: torch.nn.Module, config: Any, size: int) -> str:
    """Swap the model's attention for `attention`; returns the implementation it wraps. Raises ValueError when the
    model cannot be split over `size` ranks."""
    why = unsupported(config)
    if why:
        raise ValueError(f"sequence_parallel_size {size} cannot run this model: {why}")
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    if heads % size:
        raise ValueError(f"sequence_parallel_size {size} does not divide the model's {heads} attention heads")
    inner = config._attn_implementation or "eager"
    AttentionInterface.register(ATTENTION, attention)
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(ATTENTION)
    else:
        config._attn_implementation = ATTENTION
    return inner
