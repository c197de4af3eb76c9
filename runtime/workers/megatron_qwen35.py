"""Hugging Face <-> Megatron-Core conversion of Qwen3.5's text model (`qwen3_5_text`, and the text part of a
multimodal `qwen3_5` checkpoint as `language_model_only` reads it: its `text_config`, its `model.language_model.*`
weights under the text model's names).

Qwen3.5's decoder is a hybrid: most layers mix tokens with a Gated DeltaNet (linear attention, rlc's own module in
`megatron_gdn`), every few with gated full attention (an output gate from `q_proj`, per-head q/k RMS norms, RoPE on
part of each head). All its RMS norms but the DeltaNet's store their weight as an offset from one. Both layer kinds
sit in Megatron's TransformerLayer: `HybridMixer` builds each layer's token mixer from its global number.

Megatron names: a full-attention layer keeps GPTModel's (`self_attention.linear_qkv` holding per query group
[q heads, gate heads, k, v], `q_layernorm`, `k_layernorm`, `linear_proj`); a linear-attention layer has
`self_attention.{in_proj, conv1d_weight, A_log, dt_bias, out_norm_weight, out_proj}` (see `megatron_gdn`).
Only torch is imported at module level; configs are read by attribute.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch
from rlc.core.pipeline_stages import Stages
from rlc.runtime.workers import megatron_experts as mx
from rlc.runtime.workers import megatron_moe
from rlc.runtime.workers import megatron_weights as dense
from rlc.runtime.workers.megatron_weights import Layout, UnsupportedModel, global_name  # noqa: F401 (a family's API)

# Qwen3.5 and its MoE variant (every layer's MLP routed experts beside a sigmoid-gated shared expert)
MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
LINEAR, FULL = "linear_attention", "full_attention"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_GDN_SPLIT0 = (
    "self_attention.in_proj.weight",
    "self_attention.conv1d_weight",
    "self_attention.A_log",
    "self_attention.dt_bias",
)


@dataclass(frozen=True)
class HybridLayout(Layout):
    """`Layout` plus the linear-attention shapes and each layer's kind."""

    layer_types: tuple = ()
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    conv_kernel: int = 4
    rotary_percent: float = 1.0
    # Qwen3.5-MoE: the MoE block of every layer (None: a dense MLP), and the routed experts' Megatron weights
    # megatron_to_hf holds until a layer's set is complete
    experts: mx.Experts | None = None
    pending: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def value_heads_per_key(self) -> int:
        return self.linear_value_heads // self.linear_key_heads


def text_config(hf_config):
    """The text model's config: a multimodal checkpoint's `text_config`, or the config itself."""
    return getattr(hf_config, "text_config", None) or hf_config


def _unsupported(why: str) -> UnsupportedModel:
    return UnsupportedModel(f"Qwen3.5 under rlc's Megatron conversion: {why}")


def _rope(cfg) -> tuple[float, float]:
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise _unsupported(f"RoPE type {kind!r} is not supported (only default)")
    theta = params.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0
    return float(theta), float(params.get("partial_rotary_factor", 1.0))


def layout_from_hf(hf_config, tp_size: int = 1, fused_norms: bool = False) -> HybridLayout:
    """Validate a Qwen3.5 config for conversion at `tp_size`. `fused_norms` is ignored: the layers are Megatron's
    local modules on every device (TransformerEngine's fused norms have no zero-centred weight)."""
    if getattr(hf_config, "model_type", None) not in MODEL_TYPES:
        raise _unsupported(f"model_type {getattr(hf_config, 'model_type', None)!r} is not one of {MODEL_TYPES}")
    cfg = text_config(hf_config)
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise _unsupported(f"hidden_act={act!r} is not supported (only silu)")
    if getattr(cfg, "attention_bias", False):
        raise _unsupported("attention_bias is not supported")
    types = tuple(cfg.layer_types)
    if set(types) - {LINEAR, FULL}:
        raise _unsupported(f"layer_types {sorted(set(types) - {LINEAR, FULL})} are not supported")
    _, partial = _rope(cfg)
    heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    experts = _experts(cfg)
    ffn = experts.ffn_hidden_size if experts else cfg.intermediate_size
    # fewer key-value heads than ranks, a divisor of them, is fine: each rank then computes its query group's
    kv = None if tp_size % groups == 0 else groups
    counts = {"num_attention_heads": heads, "num_key_value_heads": kv, "linear_num_key_heads": nk}
    # the MLP that tensor parallelism splits: the dense one, or the MoE block's shared expert (the routed experts
    # split over the expert groups, which the worker checks against its expert sizes)
    mlp = ("shared_expert_intermediate_size", experts.shared_ffn_hidden_size) if experts else ("intermediate_size", ffn)
    uneven = dense.uneven_over_tp({**counts, mlp[0]: mlp[1] or None}, tp_size)
    if uneven:
        raise _unsupported(uneven)
    if heads % groups or nv % nk:
        raise _unsupported("attention heads must divide evenly over key-value heads")
    return HybridLayout(
        **dense.shared_fields(cfg, tp_size, ffn, bool(getattr(hf_config, "tie_word_embeddings", False))),
        qkv_bias=False,
        layer_types=types,
        linear_key_heads=nk,
        linear_value_heads=nv,
        linear_key_dim=cfg.linear_key_head_dim,
        linear_value_dim=cfg.linear_value_head_dim,
        conv_kernel=getattr(cfg, "linear_conv_kernel_dim", 4),
        rotary_percent=partial,
        experts=experts,
    )


def _experts(cfg) -> mx.Experts | None:
    """Qwen3.5-MoE's MoE block: top-k of the routed experts (renormalized), plus a shared expert behind a sigmoid
    gate; None for the dense model."""
    n = getattr(cfg, "num_experts", None)
    if not n:
        return None
    if getattr(cfg, "mlp_only_layers", None):
        raise _unsupported("dense layers among the MoE layers (mlp_only_layers) are not supported")
    return mx.Experts(
        num_experts=n,
        topk=cfg.num_experts_per_tok,
        ffn_hidden_size=cfg.moe_intermediate_size,
        shared_ffn_hidden_size=getattr(cfg, "shared_expert_intermediate_size", 0) or 0,
        shared_gate=True,
    )


def transformer_config_kwargs(hf_config) -> dict:
    """Megatron `TransformerConfig` kwargs of the text model (its norms are rlc's, zero-centred by themselves)."""
    layout = layout_from_hf(hf_config)
    cfg = text_config(hf_config)
    return {
        "num_layers": layout.num_layers,
        "hidden_size": layout.hidden_size,
        "num_attention_heads": layout.num_attention_heads,
        "num_query_groups": layout.num_query_groups,
        "kv_channels": layout.head_dim,
        "ffn_hidden_size": layout.ffn_hidden_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": getattr(cfg, "rms_norm_eps", 1e-6),
        "layernorm_zero_centered_gamma": False,
        "qk_layernorm": True,  # Megatron then sums q/k norm gradients over the tensor group (heads are split)
        "attention_output_gate": True,
        "gated_linear_unit": True,
        "activation_func": torch.nn.functional.silu,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "rotary_interleaved": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "apply_query_key_layer_scaling": False,
        "attention_softmax_in_fp32": True,
        "init_method_std": getattr(cfg, "initializer_range", 0.02),
        # Megatron's own fields for the hybrid's pattern (1 = linear attention) and DeltaNet shapes; rlc's layer spec
        # reads them (Megatron's experimental variant, which would too, stays off: it needs flash-linear-attention)
        "linear_attention_freq": [int(t == LINEAR) for t in layout.layer_types],
        "linear_conv_kernel_dim": layout.conv_kernel,
        "linear_key_head_dim": layout.linear_key_dim,
        "linear_value_head_dim": layout.linear_value_dim,
        "linear_num_key_heads": layout.linear_key_heads,
        "linear_num_value_heads": layout.linear_value_heads,
        # the router: a softmax over the chosen experts' logits, as HF's renormalized top-k probabilities
        **(mx.config_kwargs(layout.experts, pre_softmax=False) if layout.experts else {}),
        **({"moe_token_dispatcher_type": "alltoall"} if layout.experts else {}),
    }


def gpt_model_kwargs(hf_config, layout: Layout) -> dict:
    """`GPTModel` kwargs: RoPE on the first `partial_rotary_factor` of each head. Text tokens take one position
    for all of Qwen3.5's multimodal RoPE sections, which then reduces to this plain RoPE."""
    theta, partial = _rope(text_config(hf_config))
    return {
        "vocab_size": layout.padded_vocab_size,
        "max_sequence_length": text_config(hf_config).max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_percent": partial,
        "rotary_base": theta,
        "share_embeddings_and_output_weights": layout.tied,
    }


class HybridMixer:
    """A layer's token mixer by its global layer number: Megatron's gated SelfAttention on a full-attention layer,
    rlc's GatedDeltaNet on a linear-attention one."""

    def __new__(cls, config, submodules, layer_number: int, attn_mask_type, **kwargs):
        # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
        from megatron.core.transformer.attention import SelfAttention
        from rlc.runtime.workers.megatron_gdn import GatedDeltaNet

        if config.linear_attention_freq[layer_number - 1]:
            return GatedDeltaNet(
                config,
                layer_number=layer_number,
                num_key_heads=config.linear_num_key_heads,
                num_value_heads=config.linear_num_value_heads,
                key_head_dim=config.linear_key_head_dim,
                value_head_dim=config.linear_value_head_dim,
                conv_kernel=config.linear_conv_kernel_dim,
            )
        if config.num_query_groups < config.tensor_model_parallel_size:
            return _gated_attention(SelfAttention)(config, submodules, layer_number, attn_mask_type, **kwargs)
        return SelfAttention(config, submodules, layer_number, attn_mask_type, **kwargs)


@functools.cache
def _gated_attention(self_attention: type) -> type:
    """Megatron's SelfAttention whose output gate also follows fewer key-value heads than tensor ranks (Qwen3.5-35B-A3B
    has 2, SkyRL trains it at tp 4): Megatron-Core 0.16 then gathers a whole query group on each rank and keeps the
    rank's share of its query heads, but the group's whole gate, which the attention output then cannot take."""

    class GatedSelfAttention(self_attention):
        def get_query_key_value_tensors(self, *args, **kwargs):
            out = super().get_query_key_value_tensors(*args, **kwargs)
            if len(out) != 4:
                return out
            query, key, value, gate = out  # [s, b, heads, head_dim]; the gate has the whole group's heads
            # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
            from megatron.core.parallel_state import get_tensor_model_parallel_rank

            share = self.world_size // self.config.num_query_groups  # ranks sharing a query group
            first = get_tensor_model_parallel_rank() % share * query.shape[2]  # as Megatron slices the queries
            return query, key, value, gate[:, :, first : first + query.shape[2]]

    return GatedSelfAttention


def layer_spec(config, te: bool):
    """The decoder's spec: this pipeline stage's layers (one TransformerLayer spec, its mixer chosen per layer) and
    the zero-centred final norm; a Qwen3.5-MoE's routed experts split by Megatron's expert parallelism. Refuses what
    the hybrid cannot run: context parallelism (the DeltaNet's recurrence runs along whole rows) and virtual stages
    of unequal sizes."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from rlc.runtime.workers.megatron_gdn import ZeroCenteredRMSNorm

    if config.context_parallel_size > 1:
        raise _unsupported(
            "context parallelism is not supported: the Gated DeltaNet layers carry a state along each whole row"
        )
    if config.num_moe_experts:  # Megatron's MoE layer, local experts one after another
        spec = megatron_moe.layer_spec(config, te=False)
    else:
        spec = gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=True)
    sub = spec.submodules
    # rlc's norms in every slot: they take sequence parallelism (Megatron-Core's MoE layer under tp needs it)
    sub.input_layernorm = sub.pre_mlp_layernorm = ZeroCenteredRMSNorm
    attn = sub.self_attention
    attn.submodules.q_layernorm = attn.submodules.k_layernorm = ZeroCenteredRMSNorm
    attn.module = HybridMixer
    pp_rank = ps.get_pipeline_model_parallel_rank()
    vp = config.virtual_pipeline_model_parallel_size or 1
    counts = {get_num_layers_to_build(config, vp_stage=v if vp > 1 else None, pp_rank=pp_rank) for v in range(vp)}
    if len(counts) > 1:
        raise _unsupported(f"virtual pipeline stages of unequal sizes {sorted(counts)} are not supported")
    return TransformerBlockSubmodules(layer_specs=[spec] * counts.pop(), layer_norm=ZeroCenteredRMSNorm)


# -- weights -------------------------------------------------------------------------------------------------------


def tp_split_dim(name: str) -> int | None:
    """Dim along which TP splits a Megatron parameter; None when replicated."""
    name = dense._strip(name)
    m = _LAYER.match(name)
    if m:
        leaf = m.group(2)
        if leaf.endswith("layernorm.weight") or leaf == "self_attention.out_norm_weight":
            return None
        if leaf in _GDN_SPLIT0:
            return 0
        if leaf.startswith("mlp.") and leaf not in ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight"):
            return mx.tp_split_dim(leaf)  # an MoE block's
        if leaf == "self_attention.out_proj.weight":
            return 1
    return dense.tp_split_dim(name)


def _gated_qkv(q_gate: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> torch.Tensor:
    """HF's q_proj (per head [q, gate]) with k, v as Megatron's per-query-group [q heads, gate heads, k, v] rows."""
    g, d, hpg = layout.num_query_groups, layout.head_dim, layout.heads_per_group
    h = q_gate.shape[-1]
    pairs = q_gate.reshape(g, hpg, 2, d, h)
    q, gate = pairs[:, :, 0].reshape(g, hpg * d, h), pairs[:, :, 1].reshape(g, hpg * d, h)
    return torch.cat([q, gate, k.reshape(g, d, h), v.reshape(g, d, h)], 1).reshape(-1, h)


def _split_gated_qkv(t: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, hpg = layout.num_query_groups, layout.head_dim, layout.heads_per_group
    h = t.shape[-1]
    q, gate, k, v = t.reshape(g, (2 * hpg + 2) * d, h).split([hpg * d, hpg * d, d, d], 1)
    q_gate = torch.stack([q.reshape(g, hpg, d, h), gate.reshape(g, hpg, d, h)], 2).reshape(-1, h)
    return q_gate.contiguous(), k.reshape(-1, h).contiguous(), v.reshape(-1, h).contiguous()


def _gdn_parts(layout: HybridLayout) -> list[int]:
    """Rows of one key-head group in the fused input projection: q, k, v, z, b, a."""
    dk, dv, r = layout.linear_key_dim, layout.linear_value_dim, layout.value_heads_per_key
    return [dk, dk, r * dv, r * dv, r, r]


def _in_proj(hf_state: dict, pre: str, layout: HybridLayout) -> torch.Tensor:
    nk, dk = layout.linear_key_heads, layout.linear_key_dim
    qkv = hf_state[pre + "in_proj_qkv.weight"]
    h = qkv.shape[-1]
    q, k, v = qkv.split([nk * dk, nk * dk, qkv.shape[0] - 2 * nk * dk])
    parts = [q, k, v] + [hf_state[f"{pre}in_proj_{p}.weight"] for p in "zba"]
    return torch.cat([p.reshape(nk, -1, h) for p in parts], 1).reshape(-1, h)


def _conv(weight: torch.Tensor, layout: HybridLayout) -> torch.Tensor:
    nk, dk = layout.linear_key_heads, layout.linear_key_dim
    q, k, v = weight.split([nk * dk, nk * dk, weight.shape[0] - 2 * nk * dk])
    rest = weight.shape[1:]
    return torch.cat([p.reshape(nk, -1, *rest) for p in (q, k, v)], 1).reshape(-1, *rest)


def _ungroup(t: torch.Tensor, sizes: list[int], nk: int) -> list[torch.Tensor]:
    """Per-group rows back to HF's part-after-part rows."""
    rest = t.shape[1:]
    return [p.reshape(-1, *rest).contiguous() for p in t.reshape(nk, sum(sizes), *rest).split(sizes, 1)]


def hf_to_megatron(
    hf_state: dict,
    layout: HybridLayout,
    tp_rank: int = 0,
    tp_size: int = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    stages: Stages | None = None,
    vp_stage: int = 0,
    experts: mx.Placement | None = None,
) -> dict:
    """Megatron state dict (local names and layer indices) of the (tp_rank, pp_rank) shard, or of its virtual stage;
    a Qwen3.5-MoE's routed experts those `experts` places on this rank (default: all of them)."""
    if stages is None:
        stages = Stages(layout.num_layers, pp_size)
    hf_state = {_text_name(k): v for k, v in hf_state.items()}
    # the dense conversion gives the embedding, head and final norm (its layers are dropped: rebuilt below)
    out = _ends(
        hf_state,
        layout,
        tp_rank,
        tp_size,
        stages.holds_embedding(pp_rank, vp_stage),
        stages.holds_head(pp_rank, vp_stage),
        stages.pp,
    )
    shard = dense._shard
    for local, i in enumerate(stages.layers(pp_rank, vp_stage)):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{local}."
        out[mg + "input_layernorm.weight"] = hf_state[hf + "input_layernorm.weight"]
        out[mg + "pre_mlp_layernorm.weight"] = hf_state[hf + "post_attention_layernorm.weight"]
        if layout.experts:
            block = mx.to_megatron(hf_state, hf + "mlp.", layout.experts, experts or mx.Placement(), tp_rank, tp_size)
            out.update({mg + k: v for k, v in block.items()})
        else:
            gate, up = (shard(hf_state[f"{hf}mlp.{p}_proj.weight"], 0, tp_rank, tp_size) for p in ("gate", "up"))
            out[mg + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
            out[mg + "mlp.linear_fc2.weight"] = shard(hf_state[hf + "mlp.down_proj.weight"], 1, tp_rank, tp_size)
        sa = mg + "self_attention."
        if layout.layer_types[i] == FULL:
            a = hf + "self_attn."
            q, k, v = (hf_state[f"{a}{p}_proj.weight"] for p in "qkv")
            qkv = _gated_qkv(q, k, v, layout)
            out[sa + "linear_qkv.weight"] = shard(qkv, 0, tp_rank, tp_size)
            out[sa + "q_layernorm.weight"] = hf_state[a + "q_norm.weight"]
            out[sa + "k_layernorm.weight"] = hf_state[a + "k_norm.weight"]
            out[sa + "linear_proj.weight"] = shard(hf_state[a + "o_proj.weight"], 1, tp_rank, tp_size)
        else:
            a = hf + "linear_attn."
            out[sa + "in_proj.weight"] = shard(_in_proj(hf_state, a, layout), 0, tp_rank, tp_size)
            out[sa + "conv1d_weight"] = shard(_conv(hf_state[a + "conv1d.weight"], layout), 0, tp_rank, tp_size)
            out[sa + "A_log"] = shard(hf_state[a + "A_log"], 0, tp_rank, tp_size)
            out[sa + "dt_bias"] = shard(hf_state[a + "dt_bias"], 0, tp_rank, tp_size)
            out[sa + "out_norm_weight"] = hf_state[a + "norm.weight"]
            out[sa + "out_proj.weight"] = shard(hf_state[a + "out_proj.weight"], 1, tp_rank, tp_size)
    return out


def _text_name(name: str) -> str:
    """A multimodal checkpoint's text weight under the text model's name."""
    return "model." + name.removeprefix("model.language_model.") if name.startswith("model.language_model.") else name


def _ends(hf_state: dict, layout: HybridLayout, tp_rank: int, tp_size: int, first: bool, last: bool, pp: int) -> dict:
    """The embedding (first stage), final norm and output layer (last stage), as the dense conversion gives them."""
    out = {}
    embed = hf_state["model.embed_tokens.weight"]
    if first:
        out["embedding.word_embeddings.weight"] = dense._shard(dense._pad_vocab(embed, layout), 0, tp_rank, tp_size)
    if last:
        out["decoder.final_layernorm.weight"] = hf_state["model.norm.weight"]
        head = hf_state["lm_head.weight"] if not layout.tied else embed if pp > 1 else None
        if head is not None:
            out["output_layer.weight"] = dense._shard(dense._pad_vocab(head, layout), 0, tp_rank, tp_size)
    return out


def _plain(layout: HybridLayout) -> Layout:
    """The dense layout with no layers: what the dense conversion needs for the embedding and head."""
    fields = {f: getattr(layout, f) for f in Layout.__dataclass_fields__}
    return Layout(**{**fields, "num_layers": 0, "fused_norms": False})


def megatron_to_hf(name: str, shards: list, layout: HybridLayout) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one Megatron parameter (global layer index) given its TP shards in rank order."""
    name = dense._strip(name)
    m = _LAYER.match(name)
    if m is None:
        return dense.megatron_to_hf(name, shards, _plain(layout))
    i, leaf = m.groups()
    shards = [s.detach() for s in shards]
    hf = f"model.layers.{i}."
    dim = tp_split_dim(name)
    whole = shards[0] if dim is None else torch.cat(shards, dim)
    simple = {
        "input_layernorm.weight": "input_layernorm.weight",
        "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
        "mlp.linear_fc2.weight": "mlp.down_proj.weight",
        "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
        "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
        "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
        "self_attention.A_log": "linear_attn.A_log",
        "self_attention.dt_bias": "linear_attn.dt_bias",
        "self_attention.out_norm_weight": "linear_attn.norm.weight",
        "self_attention.out_proj.weight": "linear_attn.out_proj.weight",
    }
    if leaf in simple:
        return [(hf + simple[leaf], whole)]
    if leaf.startswith("mlp.") and layout.experts:
        return _moe_to_hf(int(i), leaf, shards, layout)
    if leaf == "mlp.linear_fc1.weight":
        halves = [s.chunk(2) for s in shards]
        gate = torch.cat([h[0] for h in halves]).contiguous()
        up = torch.cat([h[1] for h in halves]).contiguous()
        return [(hf + "mlp.gate_proj.weight", gate), (hf + "mlp.up_proj.weight", up)]
    if leaf == "self_attention.linear_qkv.weight":
        q, k, v = _split_gated_qkv(whole, layout)
        return [(f"{hf}self_attn.{p}_proj.weight", t) for p, t in zip("qkv", (q, k, v))]
    nk = layout.linear_key_heads
    if leaf == "self_attention.in_proj.weight":
        q, k, v, z, b, a = _ungroup(whole, _gdn_parts(layout), nk)
        return [
            (hf + "linear_attn.in_proj_qkv.weight", torch.cat([q, k, v])),
            (hf + "linear_attn.in_proj_z.weight", z),
            (hf + "linear_attn.in_proj_b.weight", b),
            (hf + "linear_attn.in_proj_a.weight", a),
        ]
    if leaf == "self_attention.conv1d_weight":
        q, k, v = _ungroup(whole, _gdn_parts(layout)[:3], nk)
        return [(hf + "linear_attn.conv1d.weight", torch.cat([q, k, v]))]
    raise KeyError(f"not a known Megatron parameter of Qwen3.5: {name!r}")


def _moe_to_hf(i: int, leaf: str, shards: list, layout: HybridLayout) -> list[tuple[str, torch.Tensor]]:
    """An MoE block's weight: the router and shared expert at once; a routed expert's nothing until its layer's
    last expert for that fc arrives, then HF's fused tensor of all of them."""
    hf = f"model.layers.{i}.mlp."
    found = mx.expert_leaf(leaf)
    if found is None:
        return mx.to_hf(leaf, shards, hf)
    assert layout.experts is not None
    e, fc = found
    held = layout.pending.setdefault((i, fc), {})
    held[e] = mx.expert_to_hf(fc, shards)
    if len(held) < layout.experts.num_experts:
        return []
    full = torch.stack([held[k] for k in range(layout.experts.num_experts)])
    del layout.pending[(i, fc)]
    return [(hf + ("experts.gate_up_proj" if fc == 1 else "experts.down_proj"), full)]
