"""SkyRL's `language_model_only` on a Qwen3.5 checkpoint (a multimodal model: a text decoder beside a vision tower):
rlc's FSDP2 worker loads the text model alone, trains it as text, and exports a text-only checkpoint.

The checkpoint is a tiny random Qwen3.5 built here (two decoder layers, one linear-attention and one full-attention,
and a one-block vision tower), saved with `save_pretrained` beside the embedded tokenizer.
"""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import run_ranks  # noqa: E402
from test_fsdp import _batch_and_noise  # noqa: E402


@pytest.fixture(scope="module")
def qwen35(tiny_model, tmp_path_factory) -> str:
    from transformers import AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        layer_types=["linear_attention", "full_attention"],
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4)
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3_5ForConditionalGeneration(config)
    path = tmp_path_factory.mktemp("qwen3_5") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _checkpoint(path) -> dict:
    from safetensors.torch import load_file

    return load_file(os.path.join(path, "model.safetensors"))


def _rank(rank: int, world: int, port: int, q, model_path: str, export: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model

    spec = default_model().to_typed(
        {"version": 1, "trainer": {"policy": {"language_model_only": True, "optimizer_config": {"lr": 1e-2}}}}
    )
    worker = FSDPWorker(
        WorkerSettings("policy", model_path, micro_train_batch_size=4, micro_forward_batch_size=4),
        spec.trainer.policy,
        spec.trainer.algorithm,
        rank,
        world,
    )
    worker.setup("127.0.0.1", port)
    kind = type(worker.model).__name__
    names = [n for n, _ in worker.model.named_parameters()]
    batch, noise = _batch_and_noise(worker.model.config.vocab_size)
    batch.old_logprobs = worker.forward(batch) + noise
    metrics = worker.train_mini_batch(batch, totals(batch))
    full = worker.full_state_dict()
    worker.export_hf(export, model_path)
    q.put((rank, (kind, names, metrics, full)))
    worker.shutdown()


@pytest.fixture(scope="module")
def trained(qwen35, tmp_path_factory):
    export = str(tmp_path_factory.mktemp("export") / "hf")
    (result,) = run_ranks(_rank, 1, qwen35, export)
    return (*result, export)


def test_the_worker_loads_the_text_model_alone(qwen35, trained):
    kind, names, _, full, _ = trained
    assert kind == "Qwen3_5ForCausalLM"
    assert not [n for n in names if "visual" in n]
    checkpoint = _checkpoint(qwen35)
    visual = [k for k in checkpoint if k.startswith("model.visual.")]
    assert visual  # the checkpoint has a vision tower: not loaded, so not trained
    text = {k for k in checkpoint if not k.startswith("model.visual.")}
    # every text weight of the checkpoint, and nothing else, under the text model's names
    assert {k.replace("model.language_model.", "model.", 1) for k in text} == set(full)


def test_the_text_model_trains(qwen35, trained):
    _, _, metrics, full, _ = trained
    assert torch.isfinite(torch.tensor(metrics["policy_loss"]))
    before = {k.replace("model.language_model.", "model.", 1): v for k, v in _checkpoint(qwen35).items()}
    changed = [n for n in full if not torch.equal(full[n], before[n])]
    assert len(changed) > len(full) // 2


def test_the_export_is_a_text_only_qwen3_5(trained):
    """What SkyRL's FSDP worker with language_model_only loads (`AutoModelForCausalLM`), and what vLLM serves as
    its text-only `Qwen3_5ForCausalLM` architecture: no vision config, no vision weights."""
    from transformers import AutoModelForCausalLM

    _, _, _, full, export = trained
    config = json.loads(open(os.path.join(export, "config.json")).read())
    assert config["model_type"] == "qwen3_5_text"
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert "vision_config" not in config
    assert not [k for k in _checkpoint(export) if "visual" in k]
    loaded = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert type(loaded).__name__ == "Qwen3_5ForCausalLM"
    state = loaded.state_dict()
    assert set(state) == set(full)
    assert all(torch.equal(state[n], full[n]) for n in full)


def test_vllm_serves_the_export_as_a_text_model():
    registry = pytest.importorskip("vllm.model_executor.models.registry")
    assert registry._TEXT_GENERATION_MODELS["Qwen3_5ForCausalLM"] == ("qwen3_5", "Qwen3_5ForCausalLM")


def test_synced_weights_take_the_names_vllm_loaded(qwen35, trained):
    """vLLM serving the multimodal checkpoint with language_model_only takes the trainer's text-model weights under
    the checkpoint's own names, the ones its load_weights read at start-up."""
    from rlc.runtime.inference.vllm_worker import multimodal_checkpoint_name

    _, _, _, full, _ = trained
    text = {k for k in _checkpoint(qwen35) if not k.startswith("model.visual.")}
    assert {multimodal_checkpoint_name(n) for n in full} == text


def test_the_hf_engine_loads_the_text_model(qwen35, trained):
    from rlc.runtime.inference.hf import HFEngine

    _, _, _, full, _ = trained
    engine = HFEngine(qwen35, language_model_only=True)
    assert type(engine.model).__name__ == "Qwen3_5ForCausalLM"
    assert set(engine.model.state_dict()) == set(full)


def test_vllm_gets_its_engine_argument():
    from rlc.compiler.decide import vllm_args
    from rlc.runtime.inference.vllm import engine_kwargs
    from rlc.spec.model import default_model

    spec = default_model().to_typed({"version": 1})
    args = vllm_args(spec, "cuda", [0])
    assert engine_kwargs(args, model="m", language_model_only=True)["language_model_only"] is True
    assert "language_model_only" not in engine_kwargs(args, model="m")


def test_a_multimodal_checkpoint_without_a_text_class_is_refused_by_name(tmp_path):
    from rlc.runtime.models import LanguageModelOnlyError, load_causal_lm
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(
        text_config=dict(
            model_type="llama",
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        ),
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=8,
            patch_size=4,
        ),
    )
    LlavaForConditionalGeneration(config).save_pretrained(tmp_path)
    with pytest.raises(LanguageModelOnlyError, match="language_model_only: .* multimodal 'llava' checkpoint"):
        load_causal_lm(str(tmp_path), language_model_only=True)
