"""The shapes of rlc's embedded models (`rlc:tiny`, ...), read by both sides: the runtime builds them, the
compiler sizes them before the first build. One table, so the two cannot drift apart."""

from __future__ import annotations

from rlc.core.dataclass import dataclass


@dataclass(frozen=True)
class EmbeddedModel:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 512


# Llama-style decoders with random weights and a tokenizer trained on this machine (runtime/models.py).
EMBEDDED: dict[str, EmbeddedModel] = {
    "tiny": EmbeddedModel(64, 128, 2, 4, 2, vocab_size=64),
    # rlc:tiny's size with heads of 32 (2 query heads, 1 key/value head): vLLM's CPU attention has no head size 16.
    "tiny-vllm": EmbeddedModel(64, 128, 2, 2, 1, vocab_size=64),
    # Some tens of millions of parameters: big enough that compute, not framework overhead, dominates.
    "small": EmbeddedModel(512, 1536, 8, 8, 4, vocab_size=4096),
}
# The cache directory's suffix: bump it when a recipe changes so caches built by older versions are not reused.
RECIPE = "v1"
