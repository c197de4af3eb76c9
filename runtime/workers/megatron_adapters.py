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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
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


def _stage_adapters(worker: Any) -> dict[str, torch.Tensor]:
    """This pipeline stage's adapters under PEFT's Hugging Face names (complete on tensor rank 0)."""
    stages, out = worker._stages(), {}
    for v, chunk in enumerate(worker.chunks):
        offset = stages.layers(worker.pp_rank, v).start
        for name, module in chunk.named_modules():
            if not isinstance(module, LoraLinear):
                continue
            if module.lora_type != "lora":
                raise RuntimeError(f"merge_lora: false syncs lora_type lora only, not {module.lora_type}")
            weight = worker.conversion.global_name(f"{name}.weight", offset)
            a, b = module.lora_A[0].detach(), module.lora_B[0].detach()
            if module.style == "column":  # B split as the weight's rows; A whole on every rank
                split = worker.conversion.megatron_to_hf(weight, _gather(b, worker.tp), worker.arch)
                out.update({_peft(n, "B"): t for n, t in split})
                out.update({_peft(n, "A"): a for n, _ in split})
            else:  # A split as the weight's input; B whole
                split = worker.conversion.megatron_to_hf(weight, _gather(a, worker.tp), worker.arch)
                out.update({_peft(n, "A"): t for n, t in split})
                out.update({_peft(n, "B"): b for n, _ in split})
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
