"""Hugging Face <-> Megatron-Core GPTModel conversion of mixture-of-experts Llama-shaped models: Qwen3-MoE
(per-head q/k RMSNorm, ``norm_topk_prob``) and Mixtral. A family module of ``megatron_weights.FAMILIES``: it offers
the same functions as ``megatron_weights`` and converts attention, norms and embeddings as that module does for a
dense model, the MoE block through ``megatron_experts``.

Every decoder layer must be an MoE layer (no ``mlp_only_layers``, ``decoder_sparse_step`` 1). Megatron's names follow
``get_gpt_layer_local_spec(num_experts=...)`` (SequentialMLP experts) or, with ``Layout.fused_norms``,
TransformerEngine's spec (input norm fused into ``linear_qkv``, ``pre_mlp_layernorm`` kept, TEGroupedMLP experts).
HF names are transformers 5's in-memory ones (fused ``experts.gate_up_proj`` / ``experts.down_proj``); the routed
experts of a layer are exported once all of them have passed through :func:`megatron_to_hf`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from rlc.core.pipeline_stages import Stages
from rlc.runtime.workers import megatron_experts as mx
from rlc.runtime.workers import megatron_weights as mw

MODEL_TYPES = ("qwen3_moe", "mixtral")
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
global_name = mw.global_name
Layout = mw.Layout


@dataclass(frozen=True)
class MoeLayout(mw.Layout):
    """The dense layout plus the MoE block (``experts``), per-head q/k norms (``qk_norm``) and the experts whose
    Megatron weights :func:`megatron_to_hf` holds until a layer's set is complete (``pending``)."""

    experts: mx.Experts = mx.Experts(1, 1, 1)
    qk_norm: bool = False
    model_type: str = "qwen3_moe"
    pending: dict = field(default_factory=dict, compare=False, repr=False)


def _unsupported(model_type, why: str) -> mw.UnsupportedModel:
    return mw.UnsupportedModel(
        f"model_type {model_type!r}: {why}; rlc's Megatron backend converts MoE models of types "
        f"{', '.join(MODEL_TYPES)} whose every layer is an MoE layer"
    )


def _experts(hf_config, fused_norms: bool) -> mx.Experts:
    model_type = getattr(hf_config, "model_type", None)
    n = getattr(hf_config, "num_experts", None) or getattr(hf_config, "num_local_experts", None)
    if not n:
        raise _unsupported(model_type, "the config names no experts")
    ffn = (
        getattr(hf_config, "moe_intermediate_size", None) if model_type == "qwen3_moe" else hf_config.intermediate_size
    )
    if not ffn:
        raise _unsupported(model_type, "the config names no expert MLP width (moe_intermediate_size)")
    return mx.Experts(num_experts=n, topk=hf_config.num_experts_per_tok, ffn_hidden_size=int(ffn), grouped=fused_norms)


def layer_spec(config, te: bool):
    """Megatron-Core's spec of an MoE decoder layer: TransformerEngine's modules (grouped experts when the config
    asks) or Megatron's local ones (experts one after another: the local grouped GEMM needs the grouped_gemm
    package)."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
    from megatron.core.models.gpt import gpt_layer_specs

    if te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=config.num_moe_experts, moe_grouped_gemm=True, qk_layernorm=config.qk_layernorm
        )
    # deferred: Megatron-Core, optional (FSDP jobs lack it); only an MoE model's layer spec needs it
    from megatron.core.transformer.moe import moe_utils

    if not moe_utils.HAVE_TE and not hasattr(moe_utils, "te_general_gemm"):
        # Megatron-Core 0.16's router tests this TransformerEngine GEMM for None but binds it only when TE imports
        moe_utils.te_general_gemm = None
    spec = gpt_layer_specs.get_gpt_layer_local_spec(
        num_experts=config.num_moe_experts,
        moe_grouped_gemm=False,
        qk_layernorm=config.qk_layernorm,
        normalization="RMSNorm",
    )
    if config.sequence_parallel:  # under TP: norms that take it (the worker's block spec gives the final norm one)
        sub = spec.submodules
        sub.input_layernorm = sub.pre_mlp_layernorm = mx.SequenceParallelNorm
        attention = sub.self_attention.submodules
        if config.qk_layernorm:
            attention.q_layernorm = attention.k_layernorm = mx.SequenceParallelNorm
    return spec


def layout_from_hf(hf_config, tp_size: int = 1, fused_norms: bool = False) -> MoeLayout:
    """Validate an HF MoE config for conversion at ``tp_size`` and describe its layout."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise _unsupported(model_type, "not supported")
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise _unsupported(model_type, f"hidden_act={act!r} is not supported (only silu)")
    if getattr(hf_config, "attention_bias", False):
        raise _unsupported(model_type, "attention_bias is not supported")
    if getattr(hf_config, "mlp_only_layers", None) or getattr(hf_config, "decoder_sparse_step", 1) != 1:
        raise _unsupported(model_type, "dense layers among the MoE layers (mlp_only_layers, decoder_sparse_step)")
    if getattr(hf_config, "router_jitter_noise", 0.0):
        raise _unsupported(model_type, "router_jitter_noise is not supported")
    window = getattr(hf_config, "sliding_window", None)
    use_window = getattr(hf_config, "use_sliding_window", model_type == "mixtral")
    if window is not None and use_window and window < hf_config.max_position_embeddings:
        raise _unsupported(model_type, f"sliding-window attention (sliding_window={window}) is not supported")
    mw._rope_kwargs(hf_config)
    experts = _experts(hf_config, fused_norms)
    heads = hf_config.num_attention_heads
    groups = getattr(hf_config, "num_key_value_heads", None) or heads
    uneven = mw.uneven_over_tp({"num_attention_heads": heads, "num_key_value_heads": groups}, tp_size)
    if uneven:
        raise _unsupported(model_type, uneven)
    if heads % groups:
        raise _unsupported(model_type, f"num_attention_heads={heads} is not divisible by num_key_value_heads={groups}")
    return MoeLayout(
        **mw.shared_fields(
            hf_config, tp_size, experts.ffn_hidden_size, bool(getattr(hf_config, "tie_word_embeddings", False))
        ),
        qkv_bias=False,
        fused_norms=fused_norms,
        experts=experts,
        qk_norm=model_type == "qwen3_moe",
        model_type=model_type,
    )


def transformer_config_kwargs(hf_config) -> dict:
    """Megatron ``TransformerConfig`` kwargs under which GPTModel computes the HF MoE model's function."""
    layout = layout_from_hf(hf_config)
    kwargs = mw.transformer_config_kwargs(_Dense(hf_config, layout))  # the dense part: attention, norms, activation
    norm_topk = getattr(hf_config, "norm_topk_prob", True) if layout.model_type == "qwen3_moe" else True
    kwargs.update(mx.config_kwargs(layout.experts, pre_softmax=not norm_topk))
    kwargs["qk_layernorm"] = layout.qk_norm
    return kwargs


class _Dense:
    """The HF config as the dense conversion reads it (a Llama of the same attention and the experts' ffn size)."""

    def __init__(self, hf_config, layout: MoeLayout):
        self._cfg = hf_config
        self.model_type = "llama"
        self.intermediate_size = layout.ffn_hidden_size
        self.attention_bias = self.mlp_bias = False
        self.sliding_window = None
        self.layer_types = None
        for attr in mw._MOE_ATTRS:
            setattr(self, attr, None)

    def __getattr__(self, name):
        return getattr(self._cfg, name)


def gpt_model_kwargs(hf_config, layout: MoeLayout) -> dict:
    return mw.gpt_model_kwargs(hf_config, layout)


def _norm_names(layout: MoeLayout) -> tuple[str, str]:
    # TransformerEngine fuses the input norm into linear_qkv; an MoE block has no fc1 to fuse the pre-MLP norm into
    return (
        "self_attention.linear_qkv.layer_norm_weight" if layout.fused_norms else "input_layernorm.weight",
        "pre_mlp_layernorm.weight",
    )


def hf_to_megatron(
    hf_state: dict,
    layout: MoeLayout,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    stages: Stages | None = None,
    vp_stage: int = 0,
    experts: mx.Placement | None = None,
) -> dict:
    """Megatron state dict (local names and layer indices) of the (tp_rank, pp_rank) shard of virtual stage
    `vp_stage`, holding the experts `experts` places on this rank (default: all of them, unsplit)."""
    if layout.padded_vocab_size % tp_size or layout.num_query_groups % tp_size:
        raise ValueError(f"layout was not built for tp_size={tp_size}")
    place = experts or mx.Placement()
    if stages is None:
        stages = Stages(layout.num_layers, pp_size)
    out: dict[str, torch.Tensor] = {}
    first, last = stages.holds_embedding(pp_rank, vp_stage), stages.holds_head(pp_rank, vp_stage)
    embed = hf_state["model.embed_tokens.weight"]
    if first:
        out["embedding.word_embeddings.weight"] = mw._shard(mw._pad_vocab(embed, layout), 0, tp_rank, tp_size)
    norm_in, norm_mlp = _norm_names(layout)
    for local, i in enumerate(stages.layers(pp_rank, vp_stage)):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{local}."
        attn = hf + "self_attn."
        q, k, v = (hf_state[f"{attn}{p}_proj.weight"] for p in "qkv")
        qkv = mw._qkv(q, k, v, layout)
        out[mg + norm_in] = hf_state[hf + "input_layernorm.weight"]
        out[mg + "self_attention.linear_qkv.weight"] = mw._shard(qkv, 0, tp_rank, tp_size)
        out[mg + "self_attention.linear_proj.weight"] = mw._shard(hf_state[attn + "o_proj.weight"], 1, tp_rank, tp_size)
        if layout.qk_norm:
            out[mg + "self_attention.q_layernorm.weight"] = hf_state[attn + "q_norm.weight"]
            out[mg + "self_attention.k_layernorm.weight"] = hf_state[attn + "k_norm.weight"]
        out[mg + norm_mlp] = hf_state[hf + "post_attention_layernorm.weight"]
        block = mx.to_megatron(hf_state, hf + "mlp.", layout.experts, place, tp_rank, tp_size)
        out.update({mg + k: v for k, v in block.items()})
    if last:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        head = hf_state["lm_head.weight"] if not layout.tied else (embed if stages.pp > 1 else None)
        if head is not None:
            out["output_layer.weight"] = mw._shard(mw._pad_vocab(head, layout), 0, tp_rank, tp_size)
    return out


def tp_split_dim(name: str) -> int | None:
    """Dim along which TP (for a routed expert: expert TP) splits a Megatron parameter; None when replicated."""
    m = _LAYER.match(mw._strip(name))
    if m and m.group(2).startswith("mlp."):
        try:
            return mx.tp_split_dim(m.group(2))
        except KeyError:
            raise KeyError(f"not a known Megatron GPTModel parameter: {name!r}") from None
    if m and m.group(2) in ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"):
        return None
    return mw.tp_split_dim(name)


def megatron_to_hf(name: str, shards: list, layout: MoeLayout) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one Megatron parameter (global layer and expert indices) given its (expert) TP
    shards in rank order. A routed expert's weight yields nothing until its layer's last expert for that fc arrives,
    then HF's fused tensor of all of them."""
    name = mw._strip(name)
    m = _LAYER.match(name)
    if m is None or name.endswith("_extra_state"):
        return mw.megatron_to_hf(name, shards, layout)
    i, leaf = m.groups()
    hf = f"model.layers.{i}."
    shards = [s.detach() for s in shards]
    if leaf in ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"):
        return [(f"{hf}self_attn.{leaf.split('.')[1][0]}_norm.weight", shards[0])]
    norm_in, norm_mlp = _norm_names(layout)
    if leaf == norm_in:
        return [(hf + "input_layernorm.weight", shards[0])]
    if leaf == norm_mlp:
        return [(hf + "post_attention_layernorm.weight", shards[0])]
    if not leaf.startswith("mlp."):
        return mw.megatron_to_hf(name, shards, layout)
    found = mx.expert_leaf(leaf)
    if found is None:
        return mx.to_hf(leaf, shards, hf + "mlp.")
    e, fc = found
    held = layout.pending.setdefault((int(i), fc), {})
    held[e] = mx.expert_to_hf(fc, shards)
    if len(held) < layout.experts.num_experts:
        return []
    full = torch.stack([held[k] for k in range(layout.experts.num_experts)])
    del layout.pending[(int(i), fc)]
    return [(hf + ("mlp.experts.gate_up_proj" if fc == 1 else "mlp.experts.down_proj"), full)]


def hf_names(layout: MoeLayout) -> list[str]:
    """Every HF parameter name of the model, in HF's state-dict order (no ``lm_head.weight`` when tied)."""
    names = ["model.embed_tokens.weight"]
    for i in range(layout.num_layers):
        attn = f"model.layers.{i}.self_attn."
        names += [f"{attn}{p}_proj.weight" for p in ("q", "k", "v", "o")]
        if layout.qk_norm:
            names += [attn + "q_norm.weight", attn + "k_norm.weight"]
        mlp = f"model.layers.{i}.mlp."
        routed = [mlp + "experts.gate_up_proj", mlp + "experts.down_proj"]
        names += [mlp + "gate.weight", *routed] if layout.model_type == "mixtral" else [*routed, mlp + "gate.weight"]
        names += [f"model.layers.{i}.input_layernorm.weight", f"model.layers.{i}.post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not layout.tied:
        names.append("lm_head.weight")
    return names
