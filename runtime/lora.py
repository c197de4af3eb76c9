"""LoRA adapters (`model.lora.rank > 0`) with PEFT, the same on the trainer and in the hf engine.

Both sides wrap the same base model with the same adapter config, so their adapter tensors carry the
same names and a weight sync moves only those.
"""

from __future__ import annotations

import warnings

import torch

ADAPTER_MARK = ".lora_"  # in the name of every adapter tensor PEFT adds


def with_lora(lm: torch.nn.Module, lora) -> torch.nn.Module:
    """`lm` with PEFT LoRA adapters per `model.lora` (rank, alpha, dropout, target/exclude modules, init)."""
    from peft import LoraConfig, get_peft_model

    init = (
        True if lora.init_method in ("kaiming", "default") else lora.init_method
    )  # PEFT's default is kaiming-uniform A
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        exclude_modules=lora.exclude_modules,
        init_lora_weights=init,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # PEFT asks transformers an is_gradient_checkpointing it deprecated
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(lm, config)


def adapter_names(names) -> list[str]:
    return [n for n in names if ADAPTER_MARK in n]
