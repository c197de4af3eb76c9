"""Qwen3.5's text model under the megatron strategy (rlc's conversion `megatron_qwen35`, its Gated DeltaNet module
`megatron_gdn`), on the CPU through `megatron_cpu`.

The checkpoints are tiny random Qwen3.5 models built here: four decoder layers alternating linear attention
(Gated DeltaNet) and gated full attention with partial RoPE, saved as a text model (`Qwen3_5ForCausalLM`) and as a
multimodal one (`Qwen3_5ForConditionalGeneration`, a one-block vision tower beside the same text model), each read
as its text model alone; and a tiny Qwen3.5-MoE, trained on one rank, over two expert-parallel ranks and over two
tensor-parallel ranks under sequence parallelism.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from conftest import run_ranks  # noqa: E402
from test_fsdp import _batch  # noqa: E402
from test_megatron import _assert_same_step, _collected, _run  # noqa: E402

LAYERS = ["linear_attention", "full_attention", "linear_attention", "full_attention"]


def _text(tokenizer) -> dict:
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(LAYERS),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=LAYERS,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )


def _save(model, tokenizer, path) -> str:
    # Random init leaves the zero-centred norms at 0 and the DeltaNet's norm at 1: move every norm off its start,
    # so a conversion that mixes the conventions up shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def qwen35(tiny_model, tmp_path_factory) -> str:
    """The text model alone (model_type qwen3_5_text)."""
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**_text(tokenizer)))
        return _save(model, tokenizer, tmp_path_factory.mktemp("qwen3_5_text") / "model")


@pytest.fixture(scope="module")
def qwen35_multimodal(tiny_model, tmp_path_factory) -> str:
    """A multimodal checkpoint (model_type qwen3_5): its text model is what language_model_only trains."""
    from transformers import AutoTokenizer, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4)
    config = Qwen3_5Config(text_config=_text(tokenizer), vision_config=vision, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen3_5ForConditionalGeneration(config)
        return _save(model, tokenizer, tmp_path_factory.mktemp("qwen3_5") / "model")


def _hf(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


# -- the conversion and the delta rule, in torch alone ----------------------------------------------------------------


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_round_trip_is_exact(qwen35, tp, pp):
    from rlc.runtime.workers import megatron_qwen35 as q35
    from rlc.runtime.workers.megatron_weights import global_name

    hf = _hf(qwen35)
    state = hf.state_dict()
    layout = q35.layout_from_hf(hf.config, tp)
    shards: dict[str, list] = {}
    for pp_rank in range(pp):
        offset = (layout.num_layers // pp) * pp_rank
        for tp_rank in range(tp):
            part = q35.hf_to_megatron(state, layout, tp_rank, tp, pp_rank, pp)
            for name, t in part.items():
                shards.setdefault(global_name(name, offset), []).append(t)
    back = {}
    for name, parts in shards.items():
        parts = parts if q35.tp_split_dim(name) is not None else parts[:1]
        back.update(q35.megatron_to_hf(name, parts, layout))
    assert back.keys() == state.keys()
    for name in state:
        assert torch.equal(back[name], state[name]), name
    # a linear-attention layer's parameters are split by key-head groups: each rank holds whole heads
    if tp == 2:
        a = q35.hf_to_megatron(state, layout, 0, 2)["decoder.layers.0.self_attention.A_log"]
        assert torch.equal(a, state["model.layers.0.linear_attn.A_log"][:2])


def test_multimodal_config_reads_the_text_config(qwen35_multimodal):
    from rlc.runtime.workers import megatron_weights as mw
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(qwen35_multimodal)
    assert config.model_type == "qwen3_5"
    conversion = mw.conversion_for(config)
    layout = conversion.layout_from_hf(config, 2)
    assert (layout.num_layers, layout.hidden_size, layout.layer_types) == (4, 32, tuple(LAYERS))
    assert layout.rotary_percent == 0.25  # Qwen3.5's partial RoPE
    kwargs = conversion.transformer_config_kwargs(config)
    assert kwargs["linear_attention_freq"] == [1, 0, 1, 0]
    assert kwargs["attention_output_gate"] and kwargs["qk_layernorm"]


def test_unsupported_configs_are_refused(qwen35):
    from rlc.runtime.workers import megatron_qwen35 as q35
    from rlc.runtime.workers.megatron_weights import UnsupportedModel
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(qwen35)
    with pytest.raises(UnsupportedModel, match="linear_num_key_heads=2 is not divisible by tp_size=4"):
        q35.layout_from_hf(config, 4)
    with pytest.raises(UnsupportedModel, match="num_key_value_heads=2 is not divisible by tp_size=3"):
        config.num_attention_heads = 6
        q35.layout_from_hf(config, 3)
    config.hidden_act = "gelu"
    with pytest.raises(UnsupportedModel, match="hidden_act"):
        q35.layout_from_hf(config)


def test_delta_rule_matches_the_token_by_token_recurrence():
    from rlc.runtime.workers.megatron_gdn import _l2norm, delta_rule
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    g = torch.Generator().manual_seed(0)
    b, s, h, dk, dv = 2, 21, 3, 8, 4
    q, k = (torch.randn(b, s, h, dk, generator=g) for _ in range(2))
    v = torch.randn(b, s, h, dv, generator=g)
    decay = -torch.rand(b, s, h, generator=g)
    beta = torch.rand(b, s, h, generator=g)
    want, _ = torch_recurrent_gated_delta_rule(q, k, v, decay, beta, use_qk_l2norm_in_kernel=True)
    heads = [_l2norm(q).transpose(1, 2) * dk**-0.5, _l2norm(k).transpose(1, 2), v.transpose(1, 2)]
    for chunk in (4, 8, 64):  # several chunks with a partial last one, and one chunk
        got = delta_rule(*heads, decay.transpose(1, 2), beta.transpose(1, 2), chunk=chunk).transpose(1, 2)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# -- the Megatron worker ----------------------------------------------------------------------------------------------


def _logits_rank(
    rank: int, world: int, port: int, q, model_path: str, text_only: bool, megatron: dict | None = None
) -> None:
    """One rank: the worker's model's logits of the test batch (left-padded prompts, padded responses), gathered
    over the tensor-parallel ranks' slices of the vocabulary."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from megatron.core import parallel_state as ps
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model

    policy = {"language_model_only": text_only, "megatron_config": megatron or {}}
    spec = default_model().to_typed({"version": 1, "trainer": {"strategy": "megatron", "policy": policy}})
    settings = WorkerSettings("policy", model_path)
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    kinds = [type(layer.self_attention).__name__ for layer in worker.chunks[0].decoder.layers]
    batch = _batch(worker.arch.vocab_size)
    with torch.no_grad(), worker._device():
        worker.models[0].eval()
        ids, positions, mask = worker._inputs(batch)
        logits = worker.models[0](ids, positions, mask)
        if worker.tp > 1:
            parts = [torch.empty_like(logits) for _ in range(worker.tp)]
            torch.distributed.all_gather(parts, logits.contiguous(), group=ps.get_tensor_model_parallel_group())
            logits = torch.cat(parts, -1)
    logits = logits[:, : batch.input_ids.shape[1], : worker.arch.vocab_size].float()
    q.put((rank, (kinds, logits, worker.tconfig.sequence_parallel)))
    worker.shutdown()


def test_megatron_logits_are_hf_logits(qwen35_multimodal):
    """The multimodal checkpoint's text model (the text model alone: its log-probs are fsdp2's in the steps below)."""
    path = qwen35_multimodal
    ((kinds, logits, _),) = run_ranks(_logits_rank, 1, path, True)
    assert kinds == ["GatedDeltaNet", "SelfAttention", "GatedDeltaNet", "SelfAttention"]
    hf = _hf(path).eval()
    batch = _batch(hf.config.vocab_size)
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = hf(batch.input_ids, attention_mask=batch.attention_mask, position_ids=positions).logits
    real = batch.attention_mask.bool()
    torch.testing.assert_close(logits[real], want[real], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def runs(qwen35, tmp_path_factory):
    d = tmp_path_factory.mktemp("megatron_qwen35")
    ckpt = str(d / "ckpt")
    return {
        "fsdp": _run(1, qwen35, str(d / "fsdp.pt"), strategy="fsdp2"),
        "one": _run(1, qwen35, str(d / "one.pt"), ckpt=ckpt, mode="save"),
        "tp2": _run(2, qwen35, str(d / "tp2.pt"), tp=2),
        "pp2": _run(2, qwen35, str(d / "pp2.pt"), pp=2),
        # a fresh worker under tp=2 resumes the one-rank checkpoint: the DeltaNet's shards reshard
        "tp2resume": _run(2, qwen35, str(d / "tp2resume.pt"), tp=2, ckpt=ckpt, mode="resume"),
    }, d


@pytest.mark.parametrize("layout", ["one", "tp2", "pp2"])
def test_megatron_step_matches_fsdp2(runs, layout, qwen35):
    by_name, d = runs
    _assert_same_step(by_name["fsdp"], d / "fsdp.pt", by_name[layout], d / f"{layout}.pt", qwen35)


def test_checkpoint_restores_the_step(runs):
    by_name, d = runs
    one = by_name["one"][0]
    assert one["second"]["policy_loss"] != one["metrics"]["policy_loss"]
    for key in ("policy_loss", "kl", "entropy", "grad_norm"):
        assert one["again"][key] == pytest.approx(one["second"][key], rel=1e-6, abs=1e-8), key
    second = torch.load(str(d / "one.pt") + ".second")["weights"]
    again = torch.load(str(d / "one.pt") + ".again")["weights"]
    for name in second:
        torch.testing.assert_close(again[name], second[name], rtol=0, atol=1e-6, msg=name)
    # under another tensor-parallel size
    resumed = _collected(by_name["tp2resume"])[0]["second"]
    for key in ("policy_loss", "kl", "entropy"):
        assert resumed[key] == pytest.approx(one["second"][key], rel=1e-4, abs=1e-6), key
    w = torch.load(d / "tp2resume.pt")["weights"]
    for name in second:
        torch.testing.assert_close(w[name], second[name], rtol=1e-4, atol=1e-5, msg=name)


def test_weights_go_to_engines_under_the_text_models_names(runs, qwen35):
    """What the engines load (hf engine: the text model; vLLM: its Qwen3_5ForCausalLM) by name and shape."""
    by_name, _ = runs
    state = _hf(qwen35).state_dict()
    metas = by_name["one"][0]["metas"]
    assert len(metas) == len(state)
    assert {n: s for n, s in metas} == {n: tuple(t.shape) for n, t in state.items()}


# -- Qwen3.5-MoE: the same hybrid, each layer's MLP routed experts beside a gated shared expert ----------------------


def _moe_text(tokenizer) -> dict:
    text = _text(tokenizer)
    del text["intermediate_size"]
    return {
        **text,
        # one key-value head: under tp 2 each rank computes it for its half of the query heads (as Qwen3.5-35B-A3B's
        # 2 at SkyRL's tp 4)
        "num_key_value_heads": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
    }


@pytest.fixture(scope="module")
def qwen35_moe(tiny_model, tmp_path_factory) -> str:
    """A multimodal Qwen3.5-MoE checkpoint (model_type qwen3_5_moe) read as its text model."""
    from transformers import AutoTokenizer, Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4)
    config = Qwen3_5MoeConfig(text_config=_moe_text(tokenizer), vision_config=vision, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        model = Qwen3_5MoeForConditionalGeneration(config)
        with torch.no_grad():  # transformers leaves the router at zero: every expert would tie
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(std=0.5)
        return _save(model, tokenizer, tmp_path_factory.mktemp("qwen3_5_moe") / "model")


@pytest.mark.parametrize("tp,pp,ep,etp", [(1, 1, 1, 1), (2, 1, 1, 2), (1, 1, 2, 1), (2, 2, 2, 1)])
def test_moe_round_trip_is_exact(qwen35_moe, tp, pp, ep, etp):
    """Every rank's shards (the dense part's tensor slices, each expert rank's experts in expert-tensor slices)
    convert back to the HF weights."""
    from rlc.runtime.workers import megatron_experts as mx
    from rlc.runtime.workers import megatron_qwen35 as q35
    from test_megatron_moe import gather

    hf = _hf(qwen35_moe)
    state = hf.state_dict()
    layout = q35.layout_from_hf(hf.config, tp)
    assert layout.experts is not None and layout.experts.shared_gate
    back = {}
    for name, parts in gather(state, layout, tp, pp, ep, etp, conversion=q35).items():
        assert len(parts) == (etp if mx.is_expert(name) else tp), name
        back.update(q35.megatron_to_hf(name, parts if q35.tp_split_dim(name) is not None else parts[:1], layout))
    assert not layout.pending
    assert back.keys() == state.keys()
    for name in state:
        assert torch.equal(back[name], state[name]), name


def test_moe_megatron_logits_are_hf_logits(qwen35_moe):
    """The multimodal checkpoint (its experts named in its text config), as SkyRL trains Qwen3.5-35B-A3B: over two
    tensor ranks (sequence parallel, more ranks than key-value heads) and two expert ranks."""
    megatron = {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2, "expert_tensor_parallel_size": 1}
    (kinds, logits, sequence_parallel), _ = run_ranks(_logits_rank, 2, qwen35_moe, True, megatron)
    assert kinds == ["GatedDeltaNet", "GatedSelfAttention", "GatedDeltaNet", "GatedSelfAttention"]
    assert sequence_parallel  # Megatron-Core trains an MoE layer under tp only so (it forwards without)
    hf = _hf(qwen35_moe).eval()
    batch = _batch(hf.config.vocab_size)
    positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        want = hf(batch.input_ids, attention_mask=batch.attention_mask, position_ids=positions).logits
    real = batch.attention_mask.bool()
    torch.testing.assert_close(logits[real], want[real], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def qwen35_moe_text(tiny_model, tmp_path_factory) -> str:
    """Qwen3.5-MoE's text model alone (model_type qwen3_5_moe_text)."""
    from transformers import AutoTokenizer, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**_moe_text(tokenizer)))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(std=0.5)
        return _save(model, tokenizer, tmp_path_factory.mktemp("qwen3_5_moe_text") / "model")


@pytest.fixture(scope="module")
def moe_runs(qwen35_moe_text, tmp_path_factory):
    from test_megatron_moe import EP2, _moe_run

    d = tmp_path_factory.mktemp("megatron_qwen35_moe")
    path = qwen35_moe_text
    return {
        "fsdp": _run(1, path, str(d / "fsdp.pt"), strategy="fsdp2"),
        "one": _run(1, path, str(d / "one.pt")),
        # two data-parallel ranks, the experts split over them (all-to-all dispatch)
        "ep2": _moe_run(2, path, str(d / "ep2.pt"), EP2),
        # two tensor-parallel ranks under sequence parallelism (the DeltaNet and gated attention gather the rows,
        # their output projections scatter them back), the experts split over them by ep 2, etp 1: SkyRL's layout
        "tp2": _moe_run(
            2, path, str(d / "tp2.pt"), {"tensor_model_parallel_size": 2, **EP2, "expert_tensor_parallel_size": 1}
        ),
    }, d


@pytest.mark.parametrize("layout", ["one", "ep2", "tp2"])
def test_moe_step_matches_fsdp2(moe_runs, layout, qwen35_moe_text):
    by_name, d = moe_runs
    _assert_same_step(by_name["fsdp"], d / "fsdp.pt", by_name[layout], d / f"{layout}.pt", qwen35_moe_text)


def test_moe_experts_split_over_the_expert_ranks_and_return_whole(moe_runs, qwen35_moe_text):
    """Each expert-parallel rank builds half the experts; the engines get HF's fused expert tensors, whole."""
    by_name, _ = moe_runs
    assert [r["experts"] for r in by_name["tp2"]] == [[2], [2]]
    state = _hf(qwen35_moe_text).state_dict()
    metas = torch.load(moe_runs[1] / "tp2.pt")["metas"]
    assert dict(metas) == {n: tuple(t.shape) for n, t in state.items()}
