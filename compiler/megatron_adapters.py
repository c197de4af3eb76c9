"""The LoRA adapters one Megatron rank trains, counted without the model: what the memory estimate gives gradients
and optimizer state when the base is frozen.

rlc's Megatron LoRA (runtime/workers/megatron_lora.py) wraps a decoder layer's fused linear layers: `lora` puts one
A and one B on a layer, `canonical_lora` one pair per Hugging Face projection it fuses, `dora` adds a magnitude per
output row. A column-parallel layer keeps A whole and splits B's rows over the tensor group; a row-parallel layer
splits A's columns and keeps B whole. On Qwen3.5's hybrid a linear-attention layer's Gated DeltaNet (in_proj,
out_proj) takes the place of attention's pair. rlc's worker trains no mixture of experts yet; for one the routed experts are
counted with a pair per expert (SkyRL 0.4's Megatron LoRA, whose `experts_shared_outer_loras` shares the fc1 A and
fc2 B of a layer's experts), split with the experts over the expert-parallel ranks: the larger of the ways a
Megatron LoRA may adapt experts, so the estimate errs on the side of memory.
"""

from __future__ import annotations

from rlc.compiler.model_size import ModelShape
from rlc.core.dataclass import dataclass
from rlc.core.runtime_facts import MEGATRON_LORA_LAYERS, megatron_lora_targets


@dataclass(frozen=True)
class RankAdapters:
    """Adapter parameters on one rank of a pipeline stage: those of the dense part (attention, dense MLPs), sharded by
    the distributed optimizer over the data-parallel ranks, and the experts', over the expert data-parallel ranks."""

    dense: int
    experts: int
    adapters: bool = True  # False: the counts are the base's own parameters (no LoRA)

    @property
    def total(self) -> int:
        return self.dense + self.experts


def linear_adapter(out: int, inp: int, pieces: list[int], style: str, rank: int, lora_type: str, tp: int) -> int:
    """Adapter parameters one tensor-parallel rank holds for one linear layer of `out` x `inp` (whole sizes)."""
    sizes = pieces if lora_type == "canonical_lora" else [out]
    if style == "column":  # A sees the whole input; B gives this rank's rows
        count = sum(rank * inp + -(-size // tp) * rank for size in sizes)
        magnitude = -(-out // tp)
    else:  # A takes this rank's input slice; B gives every row
        count = sum(rank * -(-inp // tp) + size * rank for size in sizes)
        magnitude = out
    return count + (magnitude if lora_type == "dora" else 0)


def stage_adapters(
    shape: ModelShape,
    rank: int,
    target_modules: str,
    exclude_modules: str | None,
    lora_type: str,
    stage_layers: int,
    tp: int,
    ep: int = 1,
    etp: int | None = None,
    shared_outer: bool = False,
) -> RankAdapters:
    """The adapters of one rank holding `stage_layers` decoder layers (its share of the expert layers as the model's)."""
    if rank <= 0:
        return RankAdapters(0, 0, adapters=False)
    etp = tp if etp is None else etp
    targets = set(megatron_lora_targets(target_modules, exclude_modules))
    h, hd = shape.hidden, shape.head_dim
    q, kv = shape.heads * hd * (2 if shape.gated_q else 1), shape.kv_heads * hd

    def layer(name: str, out: int, inp: int, pieces: list[int], tp_: int) -> int:
        if name not in targets:
            return 0
        return linear_adapter(out, inp, pieces, MEGATRON_LORA_LAYERS[name][1], rank, lora_type, tp_)

    attention = layer("linear_qkv", q + 2 * kv, h, [q, kv, kv], tp) + layer("linear_proj", h, shape.heads * hd, [h], tp)
    inter = shape.intermediate
    dense_mlp = layer("linear_fc1", 2 * inter, h, [inter, inter], tp) + layer("linear_fc2", h, inter, [h], tp)
    moe_i, local_experts = shape.moe_intermediate, -(-shape.experts // ep)
    expert = layer("linear_fc1", 2 * moe_i, h, [moe_i, moe_i], etp) + layer("linear_fc2", h, moe_i, [h], etp)
    experts = local_experts * expert
    if shared_outer and expert:  # one fc1 A and one fc2 B for the layer's experts, not one each
        outer = rank * h * (("linear_fc1" in targets) + ("linear_fc2" in targets))
        experts -= (local_experts - 1) * outer
    # Qwen3.5's Gated DeltaNet layers: in_proj fuses in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; out_proj
    qkv, v, v_heads = 2 * shape.linear_qk + shape.linear_v, shape.linear_v, shape.linear_v_heads
    mixer = layer("in_proj", qkv + v + 2 * v_heads, h, [qkv, v, v_heads, v_heads], tp) + layer(
        "out_proj", h, v, [h], tp
    )
    moe_layers = stage_layers * shape.moe_layers // max(shape.layers, 1)
    linear = stage_layers * shape.linear_layers // max(shape.layers, 1)
    dense = (stage_layers - linear) * attention + linear * mixer + (stage_layers - moe_layers) * dense_mlp
    return RankAdapters(dense, moe_layers * experts)
