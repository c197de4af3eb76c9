"""Megatron LoRA adapters synced unmerged (`megatron_config.lora_config.merge_lora: false`): the engines keep the
base weights they loaded and apply the adapters themselves, as with fsdp2's LoRA (PEFT in the hf engine, vLLM's
LoRA from an adapter directory).

rlc's Megatron `lora` adapter of a fused layer shares one A over the projections the layer fuses, its B giving
their rows in the layer's order; as Hugging Face projections (PEFT's names, `...q_proj.lora_A.default.weight`),
each projection gets that A and its own rows of B. B of a column-parallel layer (linear_qkv, linear_fc1) is split
over the tensor group as the layer's weight is, and A of a row-parallel one (linear_proj, linear_fc2) as its
weight's input: the weight's own conversion (`megatron_weights.megatron_to_hf`) turns the gathered shards into the
projections' rows. The scale alpha / rank is PEFT's too; the engines' adapters sit on the projections
`runtime_facts.megatron_lora_projections` names. `canonical_lora` and `dora` stay merged (RLC-E808).

A mixture-of-experts model's routed experts each have their own adapters, gathered from every expert-parallel rank.
transformers 5 holds a layer's experts as fused [experts, out, in] parameters (`mlp.experts.gate_up_proj`,
`down_proj`); PEFT maps the projections the engines target there (transformers 4's per-expert gate_proj, up_proj,
down_proj) and adapts each expert: lora_A [experts * r, in] stacks the experts' A, lora_B [out, r * experts] their B
with the expert index fastest. gate_up_proj fuses two projections, so PEFT gives it rank 2r and alpha 2 alpha (the
same scale): an expert's linear_fc1 adapter there is A over itself ([A; A]) and B block-diagonal ([B_gate, 0;
0, B_up]). Where a layer's two fused parameters both have adapters PEFT wraps the experts module twice, gate_up_proj's
adapters innermost (under `base_layer.`). A shared expert's adapters are a dense MLP's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from rlc.runtime.workers import megatron_experts as mx
from rlc.runtime.workers.megatron_lora import LoraLinear

PEFT_PREFIX = "base_model.model."


def _peft(hf_weight_name: str, which: str) -> str:
    return PEFT_PREFIX + hf_weight_name.removesuffix(".weight") + f".lora_{which}.default.weight"


def _gather(t: torch.Tensor, tp: int) -> list[torch.Tensor]:
    # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
    from megatron.core import parallel_state as ps

    if tp == 1:
        return [t]
    parts = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
    return parts


def _gather_experts(t: torch.Tensor, ep: int) -> list[torch.Tensor]:
    """One local expert's adapter factor from every expert-parallel rank, in rank order."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
    from megatron.core import parallel_state as ps

    if ep == 1:
        return [t]
    parts = [torch.empty_like(t) for _ in range(ep)]
    dist.all_gather(parts, t.contiguous(), group=ps.get_expert_model_parallel_group())
    return parts


def _experts_to_peft(worker: Any, held: dict) -> dict[str, torch.Tensor]:
    """PEFT's fused-expert adapters of every (global Megatron layer-and-fc weight name, fc) in `held`, each a dict of
    global expert index -> (A, B)."""
    fused: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    for (weight, fc), experts in held.items():
        for e in sorted(experts):  # the conversion stacks the experts once the last one arrives
            split = experts[e][1] if fc == 1 else experts[e][0]  # the factor split as the weight is (rows / input)
            done = worker.conversion.megatron_to_hf(mx.global_expert_name(weight, e), [split], worker.arch)
        ((hf, _),) = done
        fused.setdefault(hf.rpartition(".")[0], {})[fc] = tuple(
            torch.stack([experts[e][k] for e in sorted(experts)]) for k in (0, 1)
        )
    out = {}
    for module, fcs in fused.items():  # module: ...mlp.experts
        for fc, (a, b) in fcs.items():  # a [E, r, in], b [E, out, r]
            if fc == 1:  # gate_up_proj at rank 2r: [A; A] and [B_gate, 0; 0, B_up]
                gate, up = b.chunk(2, dim=1)
                a = torch.cat([a, a], dim=1)
                b = torch.cat(
                    [torch.cat([gate, torch.zeros_like(gate)], 2), torch.cat([torch.zeros_like(up), up], 2)], 1
                )
            inner = "base_layer." if fc == 1 and 2 in fcs else ""
            key = f"{PEFT_PREFIX}{module}.{inner}lora_"
            out[key + "A.default.weight"] = a.reshape(-1, a.shape[-1])
            out[key + "B.default.weight"] = b.permute(1, 2, 0).reshape(b.shape[1], -1)
    return out


def _stage_adapters(worker: Any) -> dict[str, torch.Tensor]:
    """This pipeline stage's adapters under PEFT's Hugging Face names (complete on tensor rank 0)."""
    stages, out = worker._stages(), {}
    place = worker._placement().get("experts")
    held: dict = {}  # (a routed expert layer's weight name with local expert 0, fc) -> {global expert: (A, B)}
    for v, chunk in enumerate(worker.chunks):
        offset = stages.layers(worker.pp_rank, v).start
        for name, module in chunk.named_modules():
            if not isinstance(module, LoraLinear):
                continue
            if module.lora_type != "lora":
                raise RuntimeError(f"merge_lora: false syncs lora_type lora only, not {module.lora_type}")
            weight = worker.conversion.global_name(f"{name}.weight", offset)
            a, b = module.lora_A[0].detach(), module.lora_B[0].detach()
            leaf = (
                mx.expert_leaf("mlp.experts." + weight.rpartition("mlp.experts.")[2]) if mx.is_expert(weight) else None
            )
            if leaf is not None:  # a routed expert's (expert tensor parallelism is 1 under LoRA)
                j, fc = leaf
                per_rank = worker.arch.experts.num_experts // place.ep_size
                experts = held.setdefault((mx.global_expert_name(weight, -j), fc), {})
                for r, (ra, rb) in enumerate(zip(_gather_experts(a, place.ep_size), _gather_experts(b, place.ep_size))):
                    experts[r * per_rank + j] = (ra, rb)
                continue
            if module.style == "column":  # B split as the weight's rows; A whole on every rank
                split = worker.conversion.megatron_to_hf(weight, _gather(b, worker.tp), worker.arch)
                out.update({_peft(n, "B"): t for n, t in split})
                out.update({_peft(n, "A"): a for n, _ in split})
            else:  # A split as the weight's input; B whole
                split = worker.conversion.megatron_to_hf(weight, _gather(a, worker.tp), worker.arch)
                out.update({_peft(n, "A"): t for n, t in split})
                out.update({_peft(n, "B"): b for n, _ in split})
    out.update(_experts_to_peft(worker, held))
    return out


@torch.no_grad()
def hf_adapters(worker: Any, cast: torch.dtype | None) -> dict[str, torch.Tensor] | None:
    """Every stage's adapters on global rank 0 (None elsewhere), on the CPU; every rank must call it."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
    from megatron.core import parallel_state as ps

    mine = {k: (t.to(cast) if cast is not None else t).cpu().clone() for k, t in _stage_adapters(worker).items()}
    if worker.tp_rank != 0 or worker.dp_rank != 0 or worker.cp_rank != 0:
        return None
    if worker.pp > 1:
        gathered: list = [None] * worker.pp
        dist.all_gather_object(gathered, mine, group=ps.get_pipeline_model_parallel_group())
        mine = {k: t for stage in gathered for k, t in stage.items()}
    return mine if worker.rank == 0 else None
