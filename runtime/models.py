"""Model paths: Hugging Face ids, local directories, and rlc's embedded models (`rlc:tiny`).

An embedded model is built on this machine, never downloaded: a Llama-style decoder with random
weights and a tokenizer trained here on a small corpus. It is saved once in a cache directory and then
loaded like any other model, through `from_pretrained`. (A Llama config, not Qwen2: transformers maps a
`qwen2` config to its own tokenizer class and would ignore the saved tokenizer.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

SCHEME = "rlc:"


@dataclass(frozen=True)
class EmbeddedModel:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int = 512


# Bump the suffix when the recipe changes so caches built by older versions are not reused.
EMBEDDED: dict[str, EmbeddedModel] = {
    "tiny": EmbeddedModel(64, 128, 2, 4, 2, vocab_size=64),
    # Some tens of millions of parameters: big enough that compute, not framework overhead, dominates.
    "small": EmbeddedModel(512, 1536, 8, 8, 4, vocab_size=4096),
}
_RECIPE = "v1"


class ModelPathError(Exception):
    """A model path names no embedded model."""


def cache_root() -> Path:
    return Path(os.environ.get("RLC_CACHE", "~/.cache/rlc")).expanduser()


def is_embedded(path: str) -> bool:
    return path.startswith(SCHEME)


def local_path(path: str) -> str:
    """A path `from_pretrained` can load: embedded models are built on first use, others pass through."""
    if not is_embedded(path):
        return os.path.expanduser(path) if path.startswith("~") else path
    name = path[len(SCHEME) :]
    if name not in EMBEDDED:
        raise ModelPathError(f"unknown embedded model {path!r}; rlc has {', '.join(SCHEME + n for n in EMBEDDED)}")
    target = cache_root() / "models" / f"{name}-{_RECIPE}"
    if not (target / "config.json").exists():
        _build(EMBEDDED[name], target)
    return str(target)


def _corpus() -> list[str]:
    """Text the tokenizer learns its merges from: the environments' prompt shapes, digits and arithmetic."""
    words = (
        "copy the digit question answer what is plus minus times total each has gives left "
        "apples books cars dogs eggs have how many more than then so the sum of and "
    ).split()
    lines = []
    for i in range(400):
        a, b = (i * 7) % 97, (i * 13) % 89
        lines.append(f"copy the digit {i % 10}: {i % 10}")
        lines.append(
            f"Question: {words[i % len(words)]} has {a} {words[(i + 3) % len(words)]} and gets {b} more. "
            f"How many? Answer: {a + b} #### {a + b}"
        )
        lines.append(f"what is {a} plus {b}? {a} + {b} = {a + b}. {a} * 2 = {a * 2}; {b} - 1 = {b - 1}")
    return lines


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    # Digits are single tokens, so numbers spell out digit by digit (answers are easy to check and learn).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.decoder = decoders.Metaspace()
    # The alphabet is the corpus's own characters: a small vocabulary keeps a random model's first guesses
    # from being hopeless (the chance of sampling the right digit, or EOS, is about 1 / vocab).
    alphabet = sorted(set("".join(_corpus())))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        padding_side="left",
    )


def _build(recipe: EmbeddedModel, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = _tokenizer(recipe.vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    # The same weights on every machine and in every process that builds this model.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar for one small shard is noise in the run's output
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            os.rename(staging, target)  # atomic; another process may have won the race
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
