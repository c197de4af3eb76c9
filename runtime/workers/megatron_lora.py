"""LoRA for the megatron strategy: `model.lora` (rank, alpha, dropout, target/exclude modules, init_method)
with `megatron_config.lora_config.lora_type`:

- `lora`: one adapter per Megatron layer, so the fused `linear_qkv` and `linear_fc1` share one A;
- `canonical_lora`: an adapter per Hugging Face projection (q, k, v; gate, up), their outputs laid out as
  Megatron's fused layers lay theirs out (per query group [q heads, k, v]; [gate | up]);
- `dora`: `lora` plus a learned magnitude per output row, W' = m * (W + s·BA) / ||W + s·BA|| (the norm
  taken as a constant in the backward pass, as DoRA's authors suggest).

Tensor parallelism follows the base layer: on a column-parallel layer A sees the whole input and B gives
this rank's rows (A's input gradient is summed over the tensor group); on a row-parallel layer A takes this
rank's slice of the input and the rank's partial products are summed before B. Only the adapters train;
the engines get the merged weights (`merged_weight`).

Qwen3.5's hybrid layers take adapters as Hugging Face's projections lay out there: the gated attention's
linear_qkv holds per query group [q heads, gate heads, k, v] (HF's q_proj gives q and gate), and a Gated
DeltaNet's in_proj (HF's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) per key-head group [q, k, v, z, b, a], its
out_proj row-parallel as linear_proj is; a `lora` adapter's B rows follow the fused weight's rows, so the
conversion that splits the weight splits B too.

On a mixture-of-experts model every routed expert's linear_fc1 / linear_fc2 (and a shared expert's) gets its own
adapters, which live with their expert on its expert-parallel rank: they carry the base weight's `allreduce`
flag, so Megatron's DDP reduces their gradients over the expert-data-parallel group as it does the expert's.
"""

from __future__ import annotations

import math

import torch
from rlc.core.runtime_facts import MEGATRON_LORA_LAYERS, megatron_lora_targets

LAYERS = MEGATRON_LORA_LAYERS  # Megatron layer -> the projections it fuses and its parallel style
LORA_TYPES = ("lora", "canonical_lora", "dora")


target_layers = megatron_lora_targets  # the compiler's memory model counts the same adapters


def _init_a(weight: torch.Tensor, method: str) -> None:
    if method == "zero":
        torch.nn.init.zeros_(weight)
    elif method == "xavier":
        torch.nn.init.xavier_normal_(weight)
    elif method == "normal":
        torch.nn.init.normal_(weight, std=1 / weight.shape[0])
    else:  # kaiming (PEFT's default)
        torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


class LoraLinear(torch.nn.Module):
    """A Megatron column- or row-parallel linear layer with adapters; returns (output, bias) as the base does."""

    def __init__(
        self,
        base: torch.nn.Module,
        style: str,
        pieces: list[int],
        rank: int,
        alpha: float,
        dropout: float,
        init: str,
        lora_type: str,
        grouped: tuple[int, list[int]] | None = None,
    ):
        super().__init__()
        # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        if lora_type not in LORA_TYPES:
            raise ValueError(f"lora_type {lora_type!r} is not one of {LORA_TYPES}")
        self.base, self.style, self.lora_type = base, style, lora_type
        self.scale = alpha / rank
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        # (local groups, each piece's rows per group): a fused layer whose rows run group by group, each group holding
        # a share of every piece (attention's query groups, the DeltaNet's key-head groups)
        self.grouped = grouped
        self.group = getattr(base, "tp_group", None)  # an expert's layer: the expert-tensor group
        expert_parallel = not getattr(base.weight, "allreduce", True)
        out_local, in_local = base.weight.shape
        dtype, device = base.weight.dtype, base.weight.device
        # canonical_lora: one adapter per fused piece; otherwise one for the whole layer.
        sizes = pieces if lora_type == "canonical_lora" else [out_local]
        self.lora_A = torch.nn.ParameterList()
        self.lora_B = torch.nn.ParameterList()
        for size in sizes:
            a = torch.nn.Parameter(torch.empty(rank, in_local, dtype=dtype, device=device))
            _init_a(a, init)
            b = torch.nn.Parameter(torch.zeros(size, rank, dtype=dtype, device=device))
            sharded, dim = (b, 0) if style == "column" else (a, 1)
            set_tensor_model_parallel_attributes(sharded, True, dim, 1)
            for p in (a, b):
                p.allreduce = not expert_parallel
            self.lora_A.append(a)
            self.lora_B.append(b)
        if lora_type == "dora":
            self.magnitude = torch.nn.Parameter(self._row_norm(base.weight.detach()).to(dtype))
            set_tensor_model_parallel_attributes(self.magnitude, style == "column", 0, 1)
            self.magnitude.allreduce = not expert_parallel
        if getattr(base, "is_expert", False):
            # An expert's adapters live on its expert rank alone, never copies of another tensor rank's: flagged
            # tensor-parallel as Megatron-Core flags the expert weights, every rank counts them in the gradient norm
            # (unflagged, only tensor rank 0 would).
            for p in [*self.lora_A, *self.lora_B]:
                if not getattr(p, "tensor_model_parallel", False):
                    set_tensor_model_parallel_attributes(p, True, 0, 1)
        if self._sequence_parallel():
            # Each tensor rank runs its slice of the rows through a weight every rank holds whole: a column layer's A
            # (before the rows are gathered), a row layer's B and DoRA magnitude (after they are scattered). Flagged
            # sequence-parallel, Megatron-Core sums their gradients over the tensor group, as it does a norm's.
            whole = list(self.lora_A) if style == "column" else list(self.lora_B)
            if style == "row" and lora_type == "dora":
                whole.append(self.magnitude)
            for p in whole:
                p.sequence_parallel = True
        for p in base.parameters():
            p.requires_grad_(False)

    def _sequence_parallel(self) -> bool:
        """The base layer takes (column) or gives (row) each tensor rank's slice of the rows. An expert's layer under
        expert parallelism communicates nothing itself: its dispatcher moved the tokens."""
        return bool(getattr(self.base, "sequence_parallel", False)) and not getattr(
            self.base, "explicit_expert_comm", False
        )

    def _row_norm(self, weight: torch.Tensor) -> torch.Tensor:
        """Norm of each output row; a row-parallel layer's rows span the tensor group's input slices."""
        squares = weight.float().pow(2).sum(-1)
        if self.style == "row":
            # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
            from megatron.core import parallel_state as ps

            group = self.group or ps.get_tensor_model_parallel_group()
            if torch.distributed.get_world_size(group) > 1:
                torch.distributed.all_reduce(squares, group=group)
        return squares.sqrt()

    def _layout(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Pieces' outputs in the fused layer's row order."""
        if len(parts) == 1:
            return parts[0]
        if self.grouped is None:  # [gate | up]
            return torch.cat(parts, dim=-1)
        groups, rows = self.grouped
        lead = parts[0].shape[:-1]
        fused = torch.cat([p.reshape(*lead, groups, r) for p, r in zip(parts, rows)], dim=-1)
        return fused.reshape(*lead, groups * sum(rows))

    def delta_weight(self) -> torch.Tensor:
        """s·BA in the base weight's (local) layout."""
        parts = [(b @ a).T for a, b in zip(self.lora_A, self.lora_B)]  # (in, piece) each
        return self._layout(parts).T * self.scale

    def forward(self, x, *args, **kwargs):
        # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
        from megatron.core.tensor_parallel.mappings import (
            copy_to_tensor_model_parallel_region,
            gather_from_sequence_parallel_region,
            reduce_from_tensor_model_parallel_region,
            reduce_scatter_to_sequence_parallel_region,
        )

        out, bias = self.base(x, *args, **kwargs)
        x = self.dropout(x)
        # Under sequence parallelism a column-parallel layer takes each rank's slice of the rows and gathers them, a
        # row-parallel one sums and scatters them back: the adapter's rank-r activations follow the same path.
        sp = self._sequence_parallel()
        if self.style == "column":
            mix = gather_from_sequence_parallel_region if sp else copy_to_tensor_model_parallel_region
        else:
            mix = reduce_scatter_to_sequence_parallel_region if sp else reduce_from_tensor_model_parallel_region
        parts = [mix(x @ a.T, group=self.group) @ b.T for a, b in zip(self.lora_A, self.lora_B)]
        delta = self._layout(parts) * self.scale
        if self.lora_type != "dora":
            return out + delta, bias
        norm = self._row_norm(self.base.weight + self.delta_weight()).detach()
        return (out + delta) * (self.magnitude / norm).to(out.dtype), bias

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        """The weight an engine runs: W + s·BA (times m / ||W + s·BA|| for DoRA). Every rank of the tensor group
        must call it (DoRA's row norms of a row-parallel layer are summed over it)."""
        merged = self.base.weight + self.delta_weight()
        if self.lora_type == "dora":
            merged = merged * (self.magnitude.float() / self._row_norm(merged)).to(merged.dtype).unsqueeze(-1)
        return merged

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        """Megatron checkpoint entries: the base layer's own, and the adapters split on the tensor-parallel axis
        their layer splits them on."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        out = self.base.sharded_state_dict(f"{prefix}base.", sharded_offsets, metadata)
        own = {k: v for k, v in self.state_dict(prefix="", keep_vars=True).items() if not k.startswith("base.")}
        axes = {
            k: (0 if self.style == "column" else 1)
            for k in own
            if (k.startswith("lora_B") and self.style == "column") or (k.startswith("lora_A") and self.style == "row")
        }
        if "magnitude" in own and self.style == "column":
            axes["magnitude"] = 0
        out.update(make_sharded_tensors_for_checkpoint(own, prefix, axes, sharded_offsets))
        return out


def _owners(layer: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of a decoder layer whose linear layers take adapters: attention, and the dense MLP or the MoE
    block's local experts (SequentialMLP's) and shared expert."""
    mlp = layer.mlp
    local = getattr(getattr(mlp, "experts", None), "local_experts", None)
    if local is None and getattr(mlp, "experts", None) is not None:
        raise ValueError("LoRA on routed experts needs Megatron's local experts (moe_grouped_gemm: false)")
    if local is not None and (getattr(mlp.config, "expert_tensor_parallel_size", 1) or 1) > 1:
        raise ValueError("LoRA on routed experts needs expert_tensor_parallel_size 1")
    config = mlp.config
    if local is not None and config.tensor_model_parallel_size > 1 and config.expert_model_parallel_size == 1:
        # every tensor rank holds every expert whole; the adapters' step there differs from one rank's (CPU check)
        raise ValueError(
            "LoRA on routed experts under tensor_model_parallel_size > 1 needs expert_model_parallel_size > 1 (the "
            "experts split over the expert ranks, as SkyRL's layouts do)"
        )
    shared = getattr(mlp, "shared_experts", None)
    if local is None:
        return [layer.self_attention, mlp]
    return [layer.self_attention, *local, *([shared] if shared is not None else [])]


def add_adapters(gpt: torch.nn.Module, lora, lora_type: str, arch, tp: int) -> int:
    """Wrap the targeted layers of every decoder layer of `gpt` (a GPTModel stage); returns how many."""
    layers = target_layers(lora.target_modules, lora.exclude_modules)
    if not layers:
        raise ValueError(
            f"model.lora.target_modules {lora.target_modules!r} names no layer the megatron strategy has "
            f"(its layers fuse {', '.join(p for ps, _ in LAYERS.values() for p in ps)})"
        )
    for p in gpt.parameters():  # only the adapters train, as with PEFT
        p.requires_grad_(False)
    if getattr(gpt, "embedding", None) is not None:
        # With every weight below frozen, activation recompute (Megatron's checkpoint is reentrant) would see no
        # input that needs a gradient and cut the adapters off from the loss: the embedding output asks for one.
        gpt.embedding.register_forward_hook(
            lambda module, args, out: out.requires_grad_(True) if not out.requires_grad else out
        )
    count = 0
    for layer in gpt.decoder.layers:
        for owner in _owners(layer):
            for name in layers:
                base = getattr(owner, name, None)
                if base is None:
                    continue
                grouped = _grouped(owner, name, arch, tp)
                rows = base.weight.shape[0]
                if grouped is not None:
                    pieces = [grouped[0] * r for r in grouped[1]]
                else:
                    pieces = [rows // 2, rows // 2] if name == "linear_fc1" else [rows]  # [gate | up], this rank's
                wrapped = LoraLinear(
                    base,
                    LAYERS[name][1],
                    pieces,
                    lora.rank,
                    lora.alpha,
                    lora.dropout,
                    lora.init_method,
                    lora_type,
                    grouped,
                )
                setattr(owner, name, wrapped)
                count += 1
    return count


def _grouped(owner: torch.nn.Module, name: str, arch, tp: int) -> tuple[int, list[int]] | None:
    """(this rank's groups, each Hugging Face projection's rows per group) of a layer whose fused rows run group by
    group: attention's linear_qkv per query group [q heads, k, v], where a gated attention's (Qwen3.5) q_proj gives
    the q and gate heads; a Gated DeltaNet's in_proj per key-head group [q, k, v (in_proj_qkv), z, b, a]."""
    if name == "linear_qkv":
        gated = bool(getattr(owner.config, "attention_output_gate", False))
        q_rows = arch.heads_per_group * arch.head_dim * (2 if gated else 1)
        return arch.num_query_groups // tp, [q_rows, arch.head_dim, arch.head_dim]
    if name == "in_proj":
        r = owner.r  # value heads per key head
        return owner.groups, [2 * owner.dk + r * owner.dv, r * owner.dv, r, r]
    return None
