"""The compiler's memory estimate against the real thing: transformers models built on torch's meta device from the
same configs (parameter counts and AdamW state bytes, exactly), and the peak RSS of an fsdp2 training step on CPU.
The GPU measurement (torch.cuda.max_memory_allocated over fsdp2 steps) is `test_gpu_peak_matches_the_estimate`."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import run_ranks  # noqa: E402
from rlc.compiler.memory import activation_bytes, fsdp_cost, megatron_cost  # noqa: E402
from rlc.compiler.model_size import EMBEDDED, TABLE, model_info, shape_from_config  # noqa: E402

# The totals Hugging Face publishes for these checkpoints (the safetensors parameter count on each model page).
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B-Instruct": 494_032_768,
    "Qwen/Qwen2.5-1.5B-Instruct": 1_543_714_304,
    "Qwen/Qwen2.5-3B-Instruct": 3_085_938_688,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen2.5-14B-Instruct": 14_770_033_664,
    "Qwen/Qwen2.5-32B-Instruct": 32_763_876_352,
    "Qwen/Qwen2.5-72B-Instruct": 72_706_203_648,
    "Qwen/Qwen3-0.6B": 596_049_920,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,
    "Qwen/Qwen3-235B-A22B": 235_093_634_560,
    "meta-llama/Llama-3.2-1B-Instruct": 1_235_814_400,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "meta-llama/Llama-3.1-70B-Instruct": 70_553_706_496,
    "mistralai/Mistral-7B-Instruct-v0.3": 7_248_023_552,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 46_702_792_704,
    "google/gemma-2-2b-it": 2_614_341_888,
    "google/gemma-2-9b-it": 9_241_705_984,
    "google/gemma-3-1b-it": 999_885_952,
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1_777_088_000,
}


def _meta_model(config: dict):
    cfg = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _count(model) -> int:
    return sum(p.numel() for p in model.parameters())


# One small config per architecture, every optional part switched on somewhere (biases, untied heads, MoE layout).
SMALL = {
    "llama-bias": {**TABLE["meta-llama/Llama-3.2-1B"], "num_hidden_layers": 2, "attention_bias": True, "mlp_bias": True},
    "qwen2": {**TABLE["Qwen/Qwen2.5-0.5B"], "num_hidden_layers": 2, "tie_word_embeddings": False},
    "qwen3": {**TABLE["Qwen/Qwen3-0.6B"], "num_hidden_layers": 2},
    "mistral": {**TABLE["mistralai/Mistral-7B-v0.3"], "num_hidden_layers": 2},
    "gemma": {**TABLE["google/gemma-2b"], "num_hidden_layers": 2},
    "gemma2": {**TABLE["google/gemma-2-2b-it"], "num_hidden_layers": 2},
    "gemma3": {**TABLE["google/gemma-3-1b-it"], "num_hidden_layers": 2},
    "mixtral": {**TABLE["mistralai/Mixtral-8x7B-Instruct-v0.1"], "num_hidden_layers": 2},
    "qwen3-moe": {**TABLE["Qwen/Qwen3-30B-A3B"], "num_hidden_layers": 4, "mlp_only_layers": [1], "decoder_sparse_step": 1},
    "qwen2-moe": {
        "model_type": "qwen2_moe", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 1000, "num_experts": 6,
        "moe_intermediate_size": 128, "shared_expert_intermediate_size": 256, "decoder_sparse_step": 2,
        "num_experts_per_tok": 2, "tie_word_embeddings": False,
    },
    # Qwen3.5's text model: gated-delta-net layers (every one but each third here) beside gated-query attention
    "qwen3_5_text": {
        "model_type": "qwen3_5_text", "hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 48,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 3, "attention_bias": True, "tie_word_embeddings": False,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SMALL))
def test_parameter_count_is_exact(name):
    config = SMALL[name]
    assert shape_from_config(config).params == _count(_meta_model(config))


@pytest.mark.parametrize("hub_id", sorted(PUBLISHED))
def test_table_entries_match_the_published_counts(hub_id):
    params = shape_from_config(TABLE[hub_id]).params
    assert abs(params - PUBLISHED[hub_id]) <= 0.005 * PUBLISHED[hub_id]


@pytest.mark.parametrize(
    "hub_id", ["Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-30B-A3B"]
)
def test_table_entries_build_to_their_count(hub_id):
    """The table's values build, in transformers, a model of exactly the size the compiler states."""
    assert shape_from_config(TABLE[hub_id]).params == _count(_meta_model(TABLE[hub_id]))


def test_a_local_config_is_read_exactly_and_the_critic_and_lora_counts_match(tmp_path):
    from peft import LoraConfig, get_peft_model
    from rlc.runtime.workers.fsdp import ValueModel

    config = SMALL["qwen2"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = model_info(str(tmp_path))
    assert info.source == "config.json"
    model = _meta_model(config)
    assert info.shape.params == _count(model)
    with torch.device("meta"):
        critic = ValueModel(_meta_model(config), "value_head")
    assert info.shape.critic_params == _count(critic)
    lora = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert info.shape.lora_params(8) == trainable


def test_language_model_only_sizes_a_multimodal_checkpoints_text_model(tmp_path):
    """A Qwen3.5 checkpoint's config.json (text and vision configs): unknown as a whole (rlc sizes decoders), and with
    SkyRL's language_model_only the text model the runtime loads, exactly, with its LoRA adapters."""
    from peft import LoraConfig, get_peft_model

    text = {k: v for k, v in SMALL["qwen3_5_text"].items() if k != "model_type"}
    composite = transformers.Qwen3_5Config(text_config=text, vision_config={"depth": 1, "hidden_size": 32})
    composite.save_pretrained(tmp_path)
    assert model_info(str(tmp_path)).shape is None
    info = model_info(str(tmp_path), None, language_model_only=True)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(composite)  # what load_causal_lm builds
        full = transformers.Qwen3_5ForConditionalGeneration(composite)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert info.shape.params == _count(model) < _count(full)
    lora = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    assert info.shape.lora_params(8) == sum(p.numel() for p in lora.parameters() if p.requires_grad)
    # the estimate reads each role's setting
    from rlc.compiler.memory import models_of
    from rlc.spec.model import default_model

    for on in (True, False):
        policy = {"model": {"path": str(tmp_path)}, "language_model_only": on}
        spec = default_model().to_typed({"version": 1, "trainer": {"policy": policy}})
        assert (models_of(spec)["policy"].shape is not None) is on


def test_model_config_kwargs_override_the_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL["qwen2"]))
    info = model_info(str(tmp_path), {"num_hidden_layers": 3})
    assert info.shape.params == _count(_meta_model({**SMALL["qwen2"], "num_hidden_layers": 3}))


def test_embedded_models_match_the_runtime_recipe():
    from rlc.runtime.models import EMBEDDED as RECIPES

    for name, recipe in RECIPES.items():
        table = EMBEDDED[f"rlc:{name}"]
        assert (table["hidden_size"], table["intermediate_size"], table["num_hidden_layers"]) == (
            recipe.hidden_size,
            recipe.intermediate_size,
            recipe.num_hidden_layers,
        )


def test_optimizer_state_bytes_are_exact():
    """AdamW keeps two float32 moments of every trainable parameter: the estimate's 8 bytes per parameter."""
    config = {**SMALL["llama-bias"], "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256}
    config.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    opt = torch.optim.AdamW(model.parameters())
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items() if k != "step")
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    spec = _spec({})
    cost = fsdp_cost(spec, "policy", shape_from_config(config), 1, False)
    assert state == cost.optimizer["optimizer"]
    assert grads == cost.train["grads"]


@pytest.mark.parametrize(
    "placing,stage",
    [
        ({"num_layers_in_first_pipeline_stage": 4}, range(0, 4)),  # 10 layers: 4, then 2 on each of 3 stages
        ({}, range(0, 3)),  # 12 layers: 3 on each of 4 stages
    ],
)
def test_megatron_weights_are_the_largest_pipeline_stages(placing, stage):
    """The Megatron estimate holds the weights of the stage with the most layers (the first here, with the
    embedding): its parameters counted on the meta device."""
    config = {**SMALL["qwen2"], "num_hidden_layers": 10 if placing else 12}
    model = _meta_model(config)
    held = model.model.embed_tokens.weight.numel() + sum(_count(model.model.layers[i]) for i in stage)
    megatron = {"pipeline_model_parallel_size": 4, "transformer_config_kwargs": placing}
    cost = megatron_cost(_spec({"strategy": "megatron", "policy": {"megatron_config": megatron}}), "policy",
                         shape_from_config(config), 4)  # fmt: skip
    assert cost.state["weights"] == 2 * held  # bf16


@pytest.mark.parametrize("pp,vp", [(1, 1), (4, 1), (2, 2), (4, 2), (8, 3)])
def test_megatron_activations_in_flight_are_megatron_cores_warm_up(pp, vp):
    """The first stage's micro-batches in flight are Megatron-Core's own warm-up count (plus the one running)."""
    pytest.importorskip("megatron.core")
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches
    from rlc.compiler.memory import in_flight_chunks

    first_stage = SimpleNamespace(
        pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: 0),
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
    )
    _total, _all, warm_up, _rest = get_pp_rank_microbatches(64, vp, pp, p2p_communicator=first_stage)
    assert in_flight_chunks(pp, vp) == (warm_up + 1 if pp > 1 else 1)


def _spec(trainer: dict, generator: dict | None = None):
    from rlc.spec.model import default_model

    return default_model().to_typed({"version": 1, "trainer": trainer, "generator": generator or {}})


# -- measured peaks ------------------------------------------------------------------------------------------------

ROWS, PROMPT, RESPONSE = 8, 24, 40
CPU_CONFIG = {
    "model_type": "llama", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
    "num_key_value_heads": 4, "intermediate_size": 1536, "vocab_size": 8192, "tie_word_embeddings": False,
}  # fmt: skip


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _measure_rank(rank: int, world: int, port: int, q, model_path: str, device: str, checkpointing: bool) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import TrainBatch, shards, totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings

    spec = _spec(
        {
            "bf16": device == "cuda",
            "gradient_checkpointing": checkpointing,
            "micro_train_batch_size_per_gpu": ROWS // world,
            "algorithm": {"use_kl_loss": False},
        }
    )
    settings = WorkerSettings(
        "policy",
        model_path,
        micro_train_batch_size=ROWS // world,
        micro_forward_batch_size=ROWS // world,
        total_optimizer_steps=4,
        device=device,
        bf16=device == "cuda",
        gradient_checkpointing=checkpointing,
    )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, CPU_CONFIG["vocab_size"], (ROWS, PROMPT + RESPONSE), generator=g)
    batch = TrainBatch(
        input_ids=ids,
        attention_mask=torch.ones(ROWS, PROMPT + RESPONSE, dtype=torch.long),
        response_ids=ids[:, PROMPT:],
        loss_mask=torch.ones(ROWS, RESPONSE),
        rollout_logprobs=torch.zeros(ROWS, RESPONSE),
        token_rewards=torch.zeros(ROWS, RESPONSE),
        group=torch.arange(ROWS),
        prompt_len=PROMPT,
        advantages=torch.randn(ROWS, RESPONSE, generator=g),
        old_logprobs=-torch.rand(ROWS, RESPONSE, generator=g),
    )
    if device == "cuda":
        torch.cuda.set_device(rank)
    before = _status("VmRSS")
    worker = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.share_prompts = False
    worker.setup("127.0.0.1", port)
    mine = shards(batch, world)[rank]
    worker.train_mini_batch(mine, totals(batch))  # the first step allocates AdamW's moments
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        worker.train_mini_batch(mine, totals(batch))
        peak = torch.cuda.max_memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as fh:  # resets VmHWM, the peak resident set
            fh.write("5")
        worker.train_mini_batch(mine, totals(batch))
        peak = _status("VmHWM") - before
    q.put((rank, peak))
    worker.shutdown()


def _estimate(device: str, world: int, checkpointing: bool) -> int:
    spec = _spec(
        {
            "bf16": device == "cuda",
            "gradient_checkpointing": checkpointing,
            "micro_train_batch_size_per_gpu": ROWS // world,
            "max_prompt_length": PROMPT,
            "use_sample_packing": False,
            "algorithm": {"use_kl_loss": False},
        },
        {"sampling_params": {"max_generate_length": RESPONSE}},
    )
    cost = fsdp_cost(spec, "policy", shape_from_config(CPU_CONFIG), world, device == "cuda")
    return sum(cost.state.values()) + sum(cost.optimizer.values()) + sum(cost.train.values())


@pytest.fixture(scope="module")
def cpu_model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("memory-model")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**CPU_CONFIG))
    model.save_pretrained(path)
    return str(path)


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's resettable peak RSS")
def test_cpu_peak_rss_of_an_fsdp2_step_is_near_the_estimate(cpu_model, monkeypatch):
    # Large blocks straight from mmap, so memory freed between steps leaves the resident set.
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    peaks = run_ranks(_measure_rank, 2, cpu_model, "cpu", False)
    estimate = _estimate("cpu", 2, False)
    # RSS also counts what the step touches for the first time in the libraries and glibc's arenas, which the
    # estimate leaves out: measured 528 MiB per rank against an estimate of 475 MiB (10% under). Held to 20%.
    print(
        f"cpu fsdp2 step: measured peak RSS {[round(p / 2**20) for p in peaks]} MiB, estimate {estimate / 2**20:.0f} MiB"
    )
    for peak in peaks:
        assert abs(peak - estimate) <= 0.20 * peak, (peak, estimate)


@pytest.mark.gpu
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("layers", [4, 8, 16])
def test_gpu_peak_matches_the_estimate(tmp_path, layers, checkpointing):
    """torch.cuda.max_memory_allocated of an fsdp2 step against the estimate (without the CUDA context, which the
    allocator does not count), within 15%."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    config = {**CPU_CONFIG, "num_hidden_layers": layers, "hidden_size": 1024, "intermediate_size": 3072}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    model.save_pretrained(tmp_path)
    world = 1
    CPU_CONFIG_BACKUP = dict(CPU_CONFIG)
    CPU_CONFIG.update(config)
    try:
        peaks = run_ranks(_measure_rank, world, str(tmp_path), "cuda", checkpointing)
        estimate = _estimate("cuda", world, checkpointing)
    finally:
        CPU_CONFIG.clear()
        CPU_CONFIG.update(CPU_CONFIG_BACKUP)
    for peak in peaks:
        assert abs(peak - estimate) <= 0.15 * peak, (peak, estimate)


def test_checkpointing_saves_what_the_estimate_says():
    shape = shape_from_config(CPU_CONFIG)
    assert activation_bytes(shape, 100, 2, True) < activation_bytes(shape, 100, 2, False)


def _scoring_rank(rank: int, world: int, port: int, q, tokens: int, vocab: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.algorithms.losses import score_tokens

    g = torch.Generator().manual_seed(0)
    width = 64
    hidden = torch.randn(tokens, width, generator=g, dtype=torch.bfloat16).requires_grad_()
    head = (torch.randn(vocab, width, generator=g, dtype=torch.bfloat16) / 4).requires_grad_()
    ids = torch.randint(0, vocab, (tokens,), generator=g)
    weights = torch.randn(tokens, generator=g)

    def step(rows: int, inplace: bool) -> int:
        """Peak resident bytes of a head's logits for `rows` tokens, scored with the entropy and back-propagated."""
        hidden.grad = head.grad = None
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        before = _status("VmRSS")
        logits = hidden[:rows] @ head.T  # a vocabulary head's output, as the workers score it
        logp, ent = score_tokens(logits, ids[:rows], 0.8, entropy=True, inplace_backward=inplace)
        del logits
        ((logp * weights[:rows]).sum() + 0.01 * ent.sum()).backward()
        return _status("VmHWM") - before

    step(64, True), step(64, False)  # first-use allocations of the kernels
    q.put((rank, (step(tokens, True), step(tokens, False))))


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's resettable peak RSS")
def test_the_logits_term_is_the_scorers_measured_peak(monkeypatch):
    """bf16 logits of a micro-batch from a vocabulary head, scored with the entropy and back-propagated as the
    workers do it (the gradient written over the logits): the peak resident set against `logits_bytes`. Without
    the in-place backward the peak is a whole logits tensor more (and a float32 log-softmax 4x the logits more)."""
    from rlc.compiler.memory import logits_bytes

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    tokens, vocab = 4096, 16384
    ((inplace, copied),) = run_ranks(_scoring_rank, 1, tokens, vocab)
    estimate = logits_bytes(vocab, tokens, tokens, 2)
    print(
        f"scoring {tokens} x {vocab}: measured peak {inplace / 2**20:.0f} MiB in place, {copied / 2**20:.0f} MiB "
        f"with a separate gradient; estimate {estimate / 2**20:.0f} MiB"
    )
    assert abs(inplace - estimate) <= 0.15 * inplace, (inplace, estimate)
    assert copied - inplace >= 0.8 * tokens * vocab * 2  # the logits' own size: the check can fail


@pytest.mark.parametrize("hub_id", ["Qwen/Qwen3.5-0.8B", "Qwen/Qwen3.6-27B", "Qwen/Qwen3.5-35B-A3B"])
def test_tabled_qwen3_5_hub_ids_size_their_text_model(hub_id):
    """The table's Qwen3.5 / 3.6 entries are multimodal configs: unknown as a whole, and under language_model_only
    the text model transformers builds from them, exactly (0.8B: about 0.75B without its vision tower)."""
    assert model_info(hub_id).shape is None
    info = model_info(hub_id, None, language_model_only=True)
    entry = TABLE[hub_id]
    assert info.source == "table" and info.shape.model_type == entry["text_config"]["model_type"]
    text = {k: v for k, v in entry["text_config"].items() if k != "model_type"}
    composite = transformers.AutoConfig.for_model(
        entry["model_type"], text_config=text, tie_word_embeddings=entry["tie_word_embeddings"]
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(composite)
    assert info.shape.params == _count(model)
