"""LoRA adapters (`model.lora.rank > 0`) with PEFT, the same on the trainer and in the hf engine.

Both sides wrap the same base model with the same adapter config, so their adapter tensors carry the
same names and a weight sync moves only those.
"""

from __future__ import annotations

import os
import warnings

import torch
from safetensors.torch import save_file

ADAPTER_MARK = ".lora_"  # in the name of every adapter tensor PEFT adds


def lora_config(lora, target_modules=None, parameters=None):
    """PEFT's LoraConfig of `model.lora` (rank, alpha, dropout, target/exclude modules, init); `target_modules`
    replaces the spec's (a saved adapter names the modules it has). An engine's Megatron LoRA adds the fused expert
    parameters whose every expert has adapters (`sections.EngineLora`); a fused gate_up_proj takes rank and alpha
    twice over (the same scale), as PEFT gives it where it maps transformers 4's gate_proj and up_proj there; only
    those among the model's `parameters` names (a dense model has none, and PEFT would warn)."""
    # deferred: PEFT (seconds to import), only for LoRA jobs; every engine and trainer imports this module
    from peft import LoraConfig

    experts = list(getattr(lora, "target_parameters", ())) if target_modules is None else []
    if parameters is not None:
        experts = [p for p in experts if any(n.endswith("." + p) for n in parameters)]
    fused = {r".*\.gate_up_proj": 2} if any(p.endswith("gate_up_proj") for p in experts) else {}
    init = (
        True if lora.init_method in ("kaiming", "default") else lora.init_method
    )  # PEFT's default is kaiming-uniform A
    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target_modules if target_modules is not None else lora.target_modules,
        exclude_modules=lora.exclude_modules if target_modules is None else None,
        init_lora_weights=init,
        target_parameters=experts or None,
        rank_pattern={k: n * lora.rank for k, n in fused.items()},
        alpha_pattern={k: n * lora.alpha for k, n in fused.items()},
        task_type="CAUSAL_LM",
    )


def with_lora(lm: torch.nn.Module, lora) -> torch.nn.Module:
    """`lm` with PEFT LoRA adapters per `model.lora`."""
    # deferred: PEFT (seconds to import), only for LoRA jobs; every engine and trainer imports this module
    from peft import get_peft_model

    with warnings.catch_warnings():  # PEFT asks transformers an is_gradient_checkpointing it deprecated
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(lm, lora_config(lora, parameters=[n for n, _ in lm.named_parameters()]))


def adapter_names(names) -> list[str]:
    return [n for n in names if ADAPTER_MARK in n]


def per_expert(adapters: dict[str, torch.Tensor], target_parameters, rank: int) -> dict[str, torch.Tensor]:
    """`adapters` with PEFT's fused-expert ones (`...mlp.experts[.base_layer].lora_A...`, laid out as
    workers/megatron_adapters.py says) split into each expert's gate_proj / up_proj / down_proj adapters of rank
    `rank`, transformers 4's per-expert modules (`...mlp.experts.{e}.gate_proj.lora_A.default.weight`): the layout
    vLLM's MoE LoRA loads."""
    fused = [p.rpartition(".")[2] for p in target_parameters]  # innermost first, as PEFT nests them
    if not fused:
        return adapters
    out = {}
    for name, t in adapters.items():
        module, _, tail = name.partition(ADAPTER_MARK)
        if not module.endswith((".experts", ".experts.base_layer")):
            out[name] = t
            continue
        param = fused[0] if module.endswith(".base_layer") or len(fused) == 1 else fused[1]
        module = module.removesuffix(".base_layer")
        r = 2 * rank if param == "gate_up_proj" else rank
        if tail.startswith("A"):  # [experts * r, in]
            experts = list(t.reshape(-1, r, t.shape[-1]).unbind(0))
        else:  # [out, r * experts], the expert index fastest
            experts = list(t.reshape(t.shape[0], r, -1).permute(2, 0, 1).unbind(0))
        for e, factor in enumerate(experts):
            if param != "gate_up_proj":
                out[f"{module}.{e}.{param}{ADAPTER_MARK}{tail}"] = factor.contiguous()
                continue
            if tail.startswith("A"):  # [A; A]
                gate, up = factor[:rank], factor[rank:]
            else:  # [B_gate, 0; 0, B_up]
                rows = factor.shape[0] // 2
                gate, up = factor[:rows, :rank], factor[rows:, rank:]
            out[f"{module}.{e}.gate_proj{ADAPTER_MARK}{tail}"] = gate.contiguous()
            out[f"{module}.{e}.up_proj{ADAPTER_MARK}{tail}"] = up.contiguous()
    return out


def save_adapter(adapters: dict[str, torch.Tensor], lora, directory: str, base_model: str) -> None:
    """The trainer's adapter tensors (PEFT's in-model names, `...q_proj.lora_A.default.weight`) as a PEFT adapter
    directory, what vLLM loads a LoRA from: adapter_config.json naming the modules that have adapters, and
    adapter_model.safetensors with PEFT's saved names (the adapter's name left out). Fused-expert adapters are
    written per expert (`per_expert`)."""
    adapters = per_expert(adapters, getattr(lora, "target_parameters", ()), lora.rank)
    saved = {name.replace(".default.", "."): t.contiguous() for name, t in adapters.items()}
    modules = sorted({name.split(ADAPTER_MARK)[0].rsplit(".", 1)[-1] for name in saved})
    config = lora_config(lora, target_modules=modules)
    config.base_model_name_or_path = base_model
    os.makedirs(directory, exist_ok=True)
    config.save_pretrained(directory)
    save_file(saved, os.path.join(directory, "adapter_model.safetensors"))
