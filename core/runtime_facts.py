"""What the runtime has and how it works that the compiler must know too, written once for both sides: the
compiler's rules and memory model read these, the runtime runs by them."""

from __future__ import annotations

# The environments rlc.runtime.envs makes by name (environment.env_class); extensions add their own.
BUILTIN_ENVS = ("arithmetic", "gsm8k", "synthetic")

# Tokens the trainer scores at a time (rlc.runtime.algorithms.losses.score_tokens): its float32 work space is a few
# [LOGPROB_CHUNK_TOKENS, vocab] blocks (about 0.3 GB each at Qwen's 152k vocabulary) whatever the micro-batch, and the
# memory model counts the same blocks.
LOGPROB_CHUNK_TOKENS = 512

# What rlc's Megatron LoRA puts adapters on: each Megatron linear layer of a decoder layer -> the Hugging Face
# projections it fuses (in its output order) and its parallel style. RLC-E510 accepts these names in target_modules.
MEGATRON_LORA_LAYERS: dict[str, tuple[tuple[str, ...], str]] = {
    "linear_qkv": (("q_proj", "k_proj", "v_proj"), "column"),
    "linear_proj": (("o_proj",), "row"),
    "linear_fc1": (("gate_proj", "up_proj"), "column"),
    "linear_fc2": (("down_proj",), "row"),
}
