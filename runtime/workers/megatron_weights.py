"""Hugging Face <-> Megatron-Core GPTModel weight conversion for dense Llama-family models.

Supports Llama, Mistral (Llama-shaped) and Qwen2 (q/k/v biases) checkpoints, split for tensor
parallelism (TP) and pipeline parallelism (PP). Megatron names follow ``get_gpt_layer_local_spec()``
or, with ``Layout.fused_norms``, the TransformerEngine spec (norms fused into ``linear_qkv`` /
``linear_fc1`` as ``layer_norm_weight``). Only torch is imported: configs are read by attribute.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from rlc.core.pipeline_stages import Stages

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# Model families another module converts: model_type -> that module, which offers this module's functions
# (layout_from_hf, transformer_config_kwargs, gpt_model_kwargs, layer_spec, hf_to_megatron, megatron_to_hf,
# tp_split_dim, global_name). The Megatron worker calls them through `conversion_for`, never this module directly.
FAMILIES: dict[str, str] = {
    # Qwen3.5's hybrid text model (Gated DeltaNet + gated attention), alone or as a multimodal checkpoint's text part
    "qwen3_5": "rlc.runtime.workers.megatron_qwen35",
    "qwen3_5_text": "rlc.runtime.workers.megatron_qwen35",
    "qwen3_5_moe": "rlc.runtime.workers.megatron_qwen35",
    "qwen3_5_moe_text": "rlc.runtime.workers.megatron_qwen35",
    "qwen3_moe": "rlc.runtime.workers.megatron_moe",
    "mixtral": "rlc.runtime.workers.megatron_moe",
}
_MOE_ATTRS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LAYER_ANYWHERE = re.compile(r"(^|\.)decoder\.layers\.(\d+)\.")


class UnsupportedModel(ValueError):
    """The HF model cannot be converted to Megatron-Core's GPTModel by rlc."""


@dataclass(frozen=True)
class Layout:
    """Shape facts the conversion needs; built by :func:`layout_from_hf`.

    ``fused_norms``: names for the TransformerEngine layer spec, whose input / pre-MLP norms live in
    ``linear_qkv`` / ``linear_fc1`` as ``layer_norm_weight``.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tied: bool
    qkv_bias: bool
    fused_norms: bool = False

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups


def _unsupported(model_type: Any, why: str) -> UnsupportedModel:
    return UnsupportedModel(
        f"model_type {model_type!r}: {why}; rlc's Megatron backend supports dense "
        f"{', '.join(SUPPORTED_MODEL_TYPES)} models"
    )


def _rope_kwargs(hf_config) -> dict:
    """GPTModel's RoPE kwargs; raises UnsupportedModel for RoPE variants Megatron would compute differently."""
    model_type = getattr(hf_config, "model_type", None)
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    params = dict(params)
    if params and all(isinstance(v, dict) for v in params.values()):
        raise _unsupported(model_type, "per-layer-type rope_parameters are not supported")
    kind = params.get("rope_type") or params.get("type") or "default"
    theta = params.get("rope_theta") or getattr(hf_config, "rope_theta", None) or 10000.0
    partial = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    if partial not in (None, 1, 1.0):
        raise _unsupported(model_type, f"partial_rotary_factor={partial} is not supported")
    kwargs: dict = {"rotary_base": theta}
    if kind == "default":
        return kwargs
    if kind == "llama3":
        off = {k: params.get(k) for k, v in _LLAMA3_ROPE.items() if params.get(k) != v}
        if off:
            raise _unsupported(
                model_type, f"llama3 RoPE scaling needs {_LLAMA3_ROPE} (Megatron's fixed values), got {off}"
            )
        return {**kwargs, "rope_scaling": True, "rope_scaling_factor": float(params["factor"])}
    raise _unsupported(model_type, f"RoPE scaling type {kind!r} is not supported (only default and llama3)")


def _check_attention(hf_config, model_type: str) -> None:
    layer_types = getattr(hf_config, "layer_types", None) or ()
    if any(t != "full_attention" for t in layer_types):
        kinds = sorted(set(layer_types))
        raise _unsupported(model_type, f"layer_types {kinds} (sliding-window attention) are not supported")
    if model_type == "qwen2" and getattr(hf_config, "use_sliding_window", False) and not layer_types:
        raise _unsupported(model_type, "use_sliding_window=True is not supported")
    if model_type != "qwen2":
        window = getattr(hf_config, "sliding_window", None)
        max_pos = getattr(hf_config, "max_position_embeddings", None)
        if window is not None and (max_pos is None or window < max_pos):
            raise _unsupported(
                model_type,
                f"sliding-window attention (sliding_window={window} < max_position_embeddings={max_pos}) "
                "is not supported",
            )
        if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
            raise _unsupported(model_type, "attention_bias / mlp_bias are not supported")


def conversion_for(hf_config) -> ModuleType:
    """The module converting the config's model family: this one for dense Llama-family models."""
    model_type = getattr(hf_config, "model_type", None)
    return importlib.import_module(FAMILIES.get(model_type, __name__) if isinstance(model_type, str) else __name__)


def layer_spec(config, te: bool):
    """Megatron-Core's spec of a dense decoder layer: TransformerEngine's modules or Megatron's local ones."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
    from megatron.core.models.gpt import gpt_layer_specs

    if te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    return gpt_layer_specs.get_gpt_layer_local_spec()


def uneven_over_tp(counts: dict[str, int | None], tp_size: int) -> str | None:
    """Why tensor parallelism cannot split the model evenly: the first of `counts` (None: left out) that `tp_size`
    does not divide; None when it divides them all."""
    for what, n in counts.items():
        if n is not None and n % tp_size:
            return f"{what}={n} is not divisible by tp_size={tp_size}"
    return None


def shared_fields(cfg, tp_size: int, ffn: int, tied: bool) -> dict:
    """The `Layout` fields every family reads alike from its (text) config: layers, widths, heads, vocabulary."""
    heads, vocab = cfg.num_attention_heads, cfg.vocab_size
    return {
        "num_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": heads,
        "num_query_groups": getattr(cfg, "num_key_value_heads", None) or heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        "ffn_hidden_size": ffn,
        "vocab_size": vocab,
        "padded_vocab_size": -(-vocab // tp_size) * tp_size,
        "tied": tied,
    }


def layout_from_hf(hf_config, tp_size: int = 1, fused_norms: bool = False) -> Layout:
    """Validate an HF config for conversion at ``tp_size`` and describe its layout."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise _unsupported(model_type, "not supported")
    for attr in _MOE_ATTRS:
        if getattr(hf_config, attr, None):
            value = getattr(hf_config, attr)
            raise _unsupported(model_type, f"mixture-of-experts configs ({attr}={value}) are not supported")
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise _unsupported(model_type, f"hidden_act={act!r} is not supported (only silu)")
    _check_attention(hf_config, model_type)
    _rope_kwargs(hf_config)
    heads = hf_config.num_attention_heads
    groups = getattr(hf_config, "num_key_value_heads", None) or heads
    ffn = hf_config.intermediate_size
    uneven = uneven_over_tp(
        {"num_attention_heads": heads, "num_key_value_heads": groups, "intermediate_size": ffn}, tp_size
    )
    if uneven:
        raise _unsupported(model_type, uneven)
    if heads % groups:
        raise _unsupported(model_type, f"num_attention_heads={heads} is not divisible by num_key_value_heads={groups}")
    return Layout(
        **shared_fields(hf_config, tp_size, ffn, bool(getattr(hf_config, "tie_word_embeddings", False))),
        qkv_bias=model_type == "qwen2",
        fused_norms=fused_norms,
    )


def transformer_config_kwargs(hf_config) -> dict:
    """Megatron ``TransformerConfig`` kwargs under which GPTModel computes the HF model's function."""
    layout = layout_from_hf(hf_config)
    return {
        "num_layers": layout.num_layers,
        "hidden_size": layout.hidden_size,
        "num_attention_heads": layout.num_attention_heads,
        "num_query_groups": layout.num_query_groups,
        "kv_channels": layout.head_dim,
        "ffn_hidden_size": layout.ffn_hidden_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": getattr(hf_config, "rms_norm_eps", 1e-6),
        "layernorm_zero_centered_gamma": False,
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": layout.qkv_bias,
        "rotary_interleaved": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "apply_query_key_layer_scaling": False,
        "attention_softmax_in_fp32": True,
        "init_method_std": getattr(hf_config, "initializer_range", 0.02),
    }


def gpt_model_kwargs(hf_config, layout: Layout) -> dict:
    """``GPTModel`` kwargs (besides config, layer spec and pre/post_process) matching the HF model."""
    rope = _rope_kwargs(hf_config)
    return {
        "vocab_size": layout.padded_vocab_size,
        "max_sequence_length": hf_config.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": layout.tied,
        **rope,
    }


def _strip(name: str) -> str:
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


def tp_split_dim(name: str) -> int | None:
    """Dim along which TP splits a Megatron parameter; None when replicated."""
    name = _strip(name)
    if name.endswith("_extra_state") or name.endswith("layernorm.weight") or name.endswith("layer_norm_weight"):
        return None
    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return 0
    m = _LAYER.match(name)
    if m:
        leaf = m.group(2)
        if leaf in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias", "mlp.linear_fc1.weight"):
            return 0
        if leaf in ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight"):
            return 1
    raise KeyError(f"not a known Megatron GPTModel parameter: {name!r}")


def global_name(local_name: str, layer_offset: int) -> str:
    """Rename ``decoder.layers.{local}`` to ``decoder.layers.{local + layer_offset}``."""

    def shift(m: re.Match) -> str:
        return f"{m.group(1)}decoder.layers.{int(m.group(2)) + layer_offset}."

    return _LAYER_ANYWHERE.sub(shift, local_name, count=1)


def _norm_names(layout: Layout) -> tuple[str, str]:
    if layout.fused_norms:
        return "self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"
    return "input_layernorm.weight", "pre_mlp_layernorm.weight"


def _shard(t: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    return t if size == 1 else t.chunk(size, dim)[rank].contiguous()


def _pad_vocab(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    extra = layout.padded_vocab_size - t.shape[0]
    return t if extra == 0 else torch.cat([t, t.new_zeros(extra, *t.shape[1:])])


def _qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Interleave HF q/k/v (weights or biases) into Megatron's per-query-group [q heads, k, v] rows."""
    g, d = layout.num_query_groups, layout.head_dim
    rest = q.shape[1:]
    return torch.cat(
        [q.reshape(g, layout.heads_per_group * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1
    ).reshape(-1, *rest)


def _split_qkv(t: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d = layout.num_query_groups, layout.head_dim
    rest = t.shape[1:]
    q, k, v = t.reshape(g, (layout.heads_per_group + 2) * d, *rest).split([layout.heads_per_group * d, d, d], dim=1)
    return tuple(x.reshape(-1, *rest).contiguous() for x in (q, k, v))


def hf_to_megatron(
    hf_state: dict,
    layout: Layout,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    stages: Stages | None = None,
    vp_stage: int = 0,
) -> dict:
    """Megatron state dict (local names and layer indices) of the (tp_rank, pp_rank) shard, or of its virtual stage
    `vp_stage`; `stages` places the layers (default: Megatron's even split over `pp_size` stages).

    Tensors may share storage with ``hf_state``; keys of ``hf_state`` that are not model weights are ignored.
    """
    if layout.padded_vocab_size % tp_size or layout.num_query_groups % tp_size:
        raise ValueError(f"layout was not built for tp_size={tp_size}")
    if stages is None:
        stages = Stages(layout.num_layers, pp_size)
    out: dict[str, torch.Tensor] = {}
    first, last = stages.holds_embedding(pp_rank, vp_stage), stages.holds_head(pp_rank, vp_stage)
    pp_size = stages.pp
    embed = hf_state["model.embed_tokens.weight"]
    if first:
        out["embedding.word_embeddings.weight"] = _shard(_pad_vocab(embed, layout), 0, tp_rank, tp_size)
    norm_in, norm_mlp = _norm_names(layout)
    for local, i in enumerate(stages.layers(pp_rank, vp_stage)):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{local}."
        attn = hf + "self_attn."
        qkv = _qkv(
            hf_state[attn + "q_proj.weight"], hf_state[attn + "k_proj.weight"], hf_state[attn + "v_proj.weight"], layout
        )
        out[mg + norm_in] = hf_state[hf + "input_layernorm.weight"]
        out[mg + "self_attention.linear_qkv.weight"] = _shard(qkv, 0, tp_rank, tp_size)
        if layout.qkv_bias:
            bias = _qkv(
                hf_state[attn + "q_proj.bias"], hf_state[attn + "k_proj.bias"], hf_state[attn + "v_proj.bias"], layout
            )
            out[mg + "self_attention.linear_qkv.bias"] = _shard(bias, 0, tp_rank, tp_size)
        out[mg + "self_attention.linear_proj.weight"] = _shard(hf_state[attn + "o_proj.weight"], 1, tp_rank, tp_size)
        out[mg + norm_mlp] = hf_state[hf + "post_attention_layernorm.weight"]
        gate, up = (_shard(hf_state[f"{hf}mlp.{p}_proj.weight"], 0, tp_rank, tp_size) for p in ("gate", "up"))
        out[mg + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
        out[mg + "mlp.linear_fc2.weight"] = _shard(hf_state[hf + "mlp.down_proj.weight"], 1, tp_rank, tp_size)
    if last:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        if not layout.tied:
            head = hf_state["lm_head.weight"]
        elif pp_size > 1:
            head = embed
        else:
            head = None
        if head is not None:
            out["output_layer.weight"] = _shard(_pad_vocab(head, layout), 0, tp_rank, tp_size)
    return out


def megatron_to_hf(name: str, shards: list, layout: Layout) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one Megatron parameter (global layer index) given its TP shards in rank order."""
    name = _strip(name)
    if name.endswith("_extra_state"):
        return []
    dim = tp_split_dim(name)
    shards = [s.detach() for s in shards]
    if name == "output_layer.weight":
        if layout.tied:
            return []
        return [("lm_head.weight", torch.cat(shards)[: layout.vocab_size])]
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", torch.cat(shards)[: layout.vocab_size])]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", shards[0])]
    m = _LAYER.match(name)
    if m is None:
        raise ValueError(f"not a Megatron weight this conversion knows: {name}")
    i, leaf = m.groups()
    hf = f"model.layers.{i}."
    norm_in, norm_mlp = _norm_names(layout)
    if leaf == norm_in:
        return [(hf + "input_layernorm.weight", shards[0])]
    if leaf == norm_mlp:
        return [(hf + "post_attention_layernorm.weight", shards[0])]
    if leaf in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = leaf.rsplit(".", 1)[1]
        q, k, v = _split_qkv(torch.cat(shards, dim), layout)
        return [(f"{hf}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v))]
    if leaf == "self_attention.linear_proj.weight":
        return [(hf + "self_attn.o_proj.weight", torch.cat(shards, dim))]
    if leaf == "mlp.linear_fc1.weight":
        halves = [s.chunk(2) for s in shards]
        gate = torch.cat([h[0] for h in halves]).contiguous()
        up = torch.cat([h[1] for h in halves]).contiguous()
        return [(hf + "mlp.gate_proj.weight", gate), (hf + "mlp.up_proj.weight", up)]
    if leaf == "mlp.linear_fc2.weight":
        return [(hf + "mlp.down_proj.weight", torch.cat(shards, dim))]
    raise KeyError(f"not a known Megatron GPTModel parameter: {name!r}")


def hf_names(layout: Layout) -> list[str]:
    """Every HF parameter name of the model, in HF's state-dict order (no ``lm_head.weight`` when tied)."""
    names = ["model.embed_tokens.weight"]
    for i in range(layout.num_layers):
        attn = f"model.layers.{i}.self_attn."
        for p in "qkv":
            names.append(f"{attn}{p}_proj.weight")
            if layout.qkv_bias:
                names.append(f"{attn}{p}_proj.bias")
        names.append(attn + "o_proj.weight")
        names += [f"model.layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
        names += [f"model.layers.{i}.input_layernorm.weight", f"model.layers.{i}.post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not layout.tied:
        names.append("lm_head.weight")
    return names
