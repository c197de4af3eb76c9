"""rlc's HF <-> Megatron-Core weight conversion (runtime/workers/megatron_weights.py).

Megatron-Core itself is only imported in subprocesses (this file run as a script), so its global
parallel state never leaks into other tests.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlc.runtime.workers import megatron_weights as mw  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("llama", "qwen2")
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}


def hf_config(family: str, **overrides):
    """Tiny GQA configs: Llama with a non-square head_dim, Qwen2 with qkv biases and tied embeddings."""
    common = dict(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    if family == "llama":
        return transformers.LlamaConfig(**{**common, "head_dim": 12, "rope_theta": 5000.0, **overrides})
    return transformers.Qwen2Config(**{**common, "tie_word_embeddings": True, **overrides})


def hf_model(family: str, **overrides):
    """A random HF model whose norms and biases are random too (so swapped names cannot pass)."""
    cfg = hf_config(family, **overrides)
    torch.manual_seed(0)
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.Qwen2ForCausalLM
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
            elif "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return cfg, model


@cache
def hf_state(family: str):
    cfg, model = hf_model(family)
    return cfg, model.state_dict()


def gather(state: dict, layout: mw.Layout, tp: int, pp: int) -> dict[str, list]:
    """Every shard of every (tp, pp) rank, keyed by global Megatron name, TP shards in rank order."""
    out: dict[str, dict[int, list]] = {}
    for pp_rank in range(pp):
        offset = mw.Stages(layout.num_layers, pp).layers(pp_rank).start
        for tp_rank in range(tp):
            for name, t in mw.hf_to_megatron(state, layout, tp_rank, tp, pp_rank, pp).items():
                out.setdefault(mw.global_name(name, offset), {}).setdefault(pp_rank, []).append(t)
    for name, stages in out.items():
        assert len(stages) == 1, f"{name} on stages {sorted(stages)}"
    return {name: next(iter(stages.values())) for name, stages in out.items()}


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_exact(family, tp, pp):
    cfg, state = hf_state(family)
    layout = mw.layout_from_hf(cfg, tp_size=tp)
    assert layout.tied == (family == "qwen2") and layout.qkv_bias == (family == "qwen2")
    shards = gather(state, layout, tp, pp)
    assert ("output_layer.weight" in shards) == (not layout.tied or pp > 1)
    back: list[tuple[str, torch.Tensor]] = []
    for name, ts in shards.items():
        assert len(ts) == tp
        if mw.tp_split_dim(name) is None:
            assert all(torch.equal(t, ts[0]) for t in ts)
            ts = ts[:1]
        back += mw.megatron_to_hf(name, ts, layout)
    expected = [n for n in state if not (layout.tied and n == "lm_head.weight")]
    assert mw.hf_names(layout) == expected
    names = [n for n, _ in back]
    assert len(names) == len(set(names)) and set(names) == set(expected)
    for name, t in back:
        assert torch.equal(t, state[name]), name


def test_tp_shards_have_split_shapes_and_group_layout():
    cfg, state = hf_state("llama")
    layout = mw.layout_from_hf(cfg, tp_size=2)
    full = mw.hf_to_megatron(state, layout)
    shards = [mw.hf_to_megatron(state, layout, r, 2) for r in range(2)]
    for name, t in full.items():
        dim = mw.tp_split_dim(name)
        shape = list(t.shape)
        if dim is not None:
            shape[dim] //= 2
        assert all(list(s[name].shape) == shape for s in shards), name
    s1 = shards[1]
    heads, groups, d, hidden = 4, 2, 12, 32
    qkv_rows = (heads // groups + 2) * (groups // 2) * d
    assert s1["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (qkv_rows, hidden)
    assert s1["decoder.layers.0.self_attention.linear_proj.weight"].shape == (hidden, heads * d // 2)
    assert s1["decoder.layers.0.mlp.linear_fc1.weight"].shape == (48, hidden)
    assert s1["decoder.layers.0.mlp.linear_fc2.weight"].shape == (hidden, 24)
    assert s1["embedding.word_embeddings.weight"].shape == (51, hidden)
    assert s1["decoder.layers.0.input_layernorm.weight"].shape == (hidden,)
    # rank 1 holds query group 1: q heads 2-3, k head 1, v head 1; and the second halves of gate and up.
    attn = "model.layers.0.self_attn."
    qkv = s1["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert torch.equal(qkv[:24], state[attn + "q_proj.weight"][24:])
    assert torch.equal(qkv[24:36], state[attn + "k_proj.weight"][12:])
    assert torch.equal(qkv[36:], state[attn + "v_proj.weight"][12:])
    fc1 = s1["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:24], state["model.layers.0.mlp.gate_proj.weight"][24:])
    assert torch.equal(fc1[24:], state["model.layers.0.mlp.up_proj.weight"][24:])
    embed = s1["embedding.word_embeddings.weight"]
    assert torch.equal(embed[:-1], state["model.embed_tokens.weight"][51:]) and not embed[-1].any()


def test_names_helpers():
    assert mw.global_name("decoder.layers.1.mlp.linear_fc1.weight", 2) == "decoder.layers.3.mlp.linear_fc1.weight"
    wrapped = "module.decoder.layers.{}.input_layernorm.weight"
    assert mw.global_name(wrapped.format(0), 4) == wrapped.format(4)
    assert mw.global_name("decoder.final_layernorm.weight", 4) == "decoder.final_layernorm.weight"
    assert mw.Stages(8, 4).layers(3) == range(6, 8)
    with pytest.raises(ValueError, match="do not divide evenly over 4"):
        mw.Stages(6, 4).layers(0)
    assert mw.tp_split_dim("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight") is None
    assert mw.tp_split_dim("decoder.layers.3.self_attention.linear_proj.weight") == 1
    layout = mw.layout_from_hf(hf_config("llama"))
    assert mw.megatron_to_hf("decoder.layers.0.mlp.linear_fc2._extra_state", [None], layout) == []


def test_fused_norm_names():
    cfg, state = hf_state("qwen2")
    layout = mw.layout_from_hf(cfg, fused_norms=True)
    conv = mw.hf_to_megatron(state, layout)
    assert "decoder.layers.0.input_layernorm.weight" not in conv
    name = "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"
    assert torch.equal(conv[name], state["model.layers.0.post_attention_layernorm.weight"])
    assert mw.megatron_to_hf(name, [conv[name]], layout)[0][0] == "model.layers.0.post_attention_layernorm.weight"


def test_config_kwargs_from_plain_namespace():
    cfg = SimpleNamespace(
        model_type="mistral",
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        rope_scaling=None,
        sliding_window=None,
        hidden_act="silu",
    )
    layout = mw.layout_from_hf(cfg)
    assert layout.head_dim == 4 and not layout.tied and not layout.qkv_bias
    assert mw.transformer_config_kwargs(cfg)["layernorm_epsilon"] == 1e-5
    kw = mw.gpt_model_kwargs(cfg, layout)
    assert kw["rotary_base"] == 1e6 and kw["vocab_size"] == 10 and kw["position_embedding_type"] == "rope"
    assert mw.gpt_model_kwargs(hf_config("llama"), layout)["rotary_base"] == 5000.0


def test_module_imports_only_torch_stdlib_and_rlc_core():
    tree = ast.parse(Path(mw.__file__).read_text())
    names = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    roots = {n.split(".")[0] for n in names if not n.startswith("rlc.core.")}  # the layer both sides share
    assert roots <= {"__future__", "dataclasses", "importlib", "re", "types", "typing", "torch"}, roots


def _namespace(**overrides) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(hf_config("llama")), "model_type": "llama", **overrides})


def test_unsupported_models():
    with pytest.raises(mw.UnsupportedModel, match="'gpt2'.*llama"):
        mw.layout_from_hf(transformers.GPT2Config())
    with pytest.raises(mw.UnsupportedModel, match="num_key_value_heads=2 is not divisible by tp_size=4"):
        mw.layout_from_hf(hf_config("llama"), tp_size=4)
    with pytest.raises(mw.UnsupportedModel, match="intermediate_size=49 is not divisible by tp_size=2"):
        mw.layout_from_hf(_namespace(intermediate_size=49), tp_size=2)
    with pytest.raises(mw.UnsupportedModel, match="num_attention_heads=6 is not divisible by tp_size=4"):
        mw.layout_from_hf(_namespace(num_attention_heads=6), tp_size=4)
    with pytest.raises(mw.UnsupportedModel, match="mixture-of-experts"):
        mw.layout_from_hf(_namespace(num_local_experts=8))
    with pytest.raises(mw.UnsupportedModel, match="'yarn'"):
        mw.layout_from_hf(hf_config("llama", rope_scaling={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}))
    with pytest.raises(mw.UnsupportedModel, match="low_freq_factor"):
        mw.gpt_model_kwargs(hf_config("llama", rope_scaling={**LLAMA3_ROPE, "low_freq_factor": 2.0}), None)
    with pytest.raises(mw.UnsupportedModel, match="sliding"):
        mw.layout_from_hf(transformers.MistralConfig(sliding_window=16, max_position_embeddings=64))
    with pytest.raises(mw.UnsupportedModel, match="sliding"):
        mw.layout_from_hf(hf_config("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=1))
    kw = mw.gpt_model_kwargs(
        hf_config("llama", rope_scaling=LLAMA3_ROPE, max_position_embeddings=16384),
        mw.layout_from_hf(hf_config("llama")),
    )
    assert kw["rope_scaling"] is True and kw["rope_scaling_factor"] == 8.0 and kw["rotary_base"] == 500000.0


@pytest.fixture(scope="module")
def megatron_run():
    """One subprocess for both Megatron checks (importing Megatron-Core costs seconds)."""
    pytest.importorskip("megatron.core")
    return subprocess.run(
        [sys.executable, __file__],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def _failure(proc) -> str:
    return f"subprocess failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"


def test_matches_real_megatron_gpt_model(megatron_run):
    for family in FAMILIES:
        assert f"structure ok {family}" in megatron_run.stdout, _failure(megatron_run)


def test_converted_megatron_model_computes_hf_logits(megatron_run):
    pytest.importorskip("rlc.runtime.workers.megatron_cpu")
    assert megatron_run.returncode == 0, _failure(megatron_run)
    line = next(x for x in megatron_run.stdout.splitlines() if x.startswith("forward "))
    errors = json.loads(line.removeprefix("forward "))
    assert set(errors) == set(FAMILIES)
    for family in FAMILIES:
        assert errors[family] < 1e-4, errors


# ---- subprocess side: runs with Megatron-Core imported ----


def _megatron_world():
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _close_megatron_world():
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _gpt_model(cfg, layout: mw.Layout, **kwargs):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    conf = {**mw.transformer_config_kwargs(cfg), **kwargs.pop("config", {})}
    tc = TransformerConfig(**conf, use_cpu_initialization=True, params_dtype=torch.float32)
    return GPTModel(tc, get_gpt_layer_local_spec(normalization="RMSNorm"), **mw.gpt_model_kwargs(cfg, layout), **kwargs)


def _check_structure(family: str, cfg, hf) -> None:
    state = hf.state_dict()
    layout = mw.layout_from_hf(cfg)
    for pp, pp_rank, flags in [(1, 0, {}), (2, 0, {"post_process": False}), (2, 1, {"pre_process": False})]:
        model = _gpt_model(cfg, layout, config={"num_layers": layout.num_layers // pp}, **flags)
        want = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        conv = mw.hf_to_megatron(state, layout, pp_rank=pp_rank, pp_size=pp)
        assert want == {k: tuple(v.shape) for k, v in conv.items()}, (family, pp, pp_rank, sorted(want), sorted(conv))
        res = model.load_state_dict(conv, strict=False)
        assert not [k for k in res.missing_keys if not k.endswith("_extra_state")], res.missing_keys
        assert not res.unexpected_keys, res.unexpected_keys
        for k, v in model.state_dict().items():
            if k in conv:
                assert torch.equal(v, conv[k]), k
    rope_cfgs = [cfg]
    if family == "llama":
        rope_cfgs.append(hf_config(family, rope_scaling=LLAMA3_ROPE, max_position_embeddings=16384))
    for rope_cfg in rope_cfgs:
        ref = type(hf)(rope_cfg).model.rotary_emb.inv_freq
        got = _gpt_model(rope_cfg, layout).rotary_pos_emb.inv_freq
        assert torch.allclose(got, ref, rtol=1e-6, atol=0), (got, ref)
    print(f"structure ok {family}", flush=True)


def _forward_error(cfg, hf) -> float:
    layout = mw.layout_from_hf(cfg)
    model = _gpt_model(cfg, layout)
    model.load_state_dict(mw.hf_to_megatron(hf.state_dict(), layout), strict=False)
    model.eval()
    b, s = 2, 9
    ids = torch.randint(0, cfg.vocab_size, (b, s), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(s).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)[None, None].expand(b, 1, s, s)
    with torch.no_grad():
        got = model(ids, pos, mask)[..., : cfg.vocab_size].float()
        ref = hf(input_ids=ids, position_ids=pos).logits.float()
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return (got - ref).abs().max().item()


def main() -> None:
    """Check names and shapes against real GPTModels, then (with megatron_cpu) the logits."""
    models = {family: hf_model(family) for family in FAMILIES}  # seeded before megatron_cpu patches seeding
    _megatron_world()
    try:
        for family, (cfg, hf) in models.items():
            _check_structure(family, cfg, hf)
        try:
            from rlc.runtime.workers import megatron_cpu
        except ImportError:
            return
        from megatron.core import tensor_parallel

        megatron_cpu.enable()
        with megatron_cpu.active():
            tensor_parallel.model_parallel_cuda_manual_seed(0)
            errors = {family: _forward_error(cfg, hf) for family, (cfg, hf) in models.items()}
        print("forward " + json.dumps(errors), flush=True)
    finally:
        _close_megatron_world()


if __name__ == "__main__":
    main()
