"""A tiny llama checkpoint written as a GGUF file with the `gguf` package: what `rlc:smollm2-135m`'s conversion reads,
at a size a test can convert in seconds. Byte-level BPE tokenizer (every byte a token, one merge) with ChatML
control tokens and a chat template, float32 tensors with random values."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_tiny_gguf(
    path: Path, *, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2, intermediate: int = 64
) -> dict:
    """Write the file; returns the numpy arrays written, by GGUF tensor name."""
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_tokens = list(bytes_to_unicode().values())
    tokens = [*SPECIALS, *byte_tokens, "\u0120t"]  # "Ġt": a space then t, made by the one merge
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))  # 3: control, 1: normal
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("rlc tiny gguf")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["\u0120 t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    arrays = {"token_embd.weight": weight(len(tokens), hidden), "output_norm.weight": np.ones(hidden, np.float32)}
    for i in range(layers):
        arrays.update(
            {
                f"blk.{i}.attn_norm.weight": np.ones(hidden, np.float32),
                f"blk.{i}.attn_q.weight": weight(heads * head_dim, hidden),
                f"blk.{i}.attn_k.weight": weight(kv_heads * head_dim, hidden),
                f"blk.{i}.attn_v.weight": weight(kv_heads * head_dim, hidden),
                f"blk.{i}.attn_output.weight": weight(hidden, heads * head_dim),
                f"blk.{i}.ffn_norm.weight": np.ones(hidden, np.float32),
                f"blk.{i}.ffn_gate.weight": weight(intermediate, hidden),
                f"blk.{i}.ffn_up.weight": weight(intermediate, hidden),
                f"blk.{i}.ffn_down.weight": weight(hidden, intermediate),
            }
        )
    for name, array in arrays.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return arrays
