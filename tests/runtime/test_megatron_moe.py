"""Mixture-of-experts models under the megatron strategy: rlc's HF <-> Megatron-Core conversion of Qwen3-MoE and
Mixtral (runtime/workers/megatron_moe.py, megatron_experts.py).

Megatron-Core itself is only imported in subprocesses (this file run as a script), so its global parallel state
never leaks into other tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlc.runtime.workers import megatron_experts as mx  # noqa: E402
from rlc.runtime.workers import megatron_moe as mm  # noqa: E402
from rlc.runtime.workers import megatron_weights as mw  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ("qwen3_moe", "mixtral")


def hf_config(family: str, **overrides):
    """Tiny MoE configs: 4 experts, top 2, GQA; Qwen3-MoE with q/k norms and a non-square head_dim."""
    common = dict(
        vocab_size=101,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        num_experts_per_tok=2,
    )
    if family == "qwen3_moe":
        kw = dict(num_experts=4, moe_intermediate_size=24, intermediate_size=40, head_dim=12, norm_topk_prob=True)
        return transformers.Qwen3MoeConfig(**{**common, **kw, **overrides})
    return transformers.MixtralConfig(**{**common, "num_local_experts": 4, "intermediate_size": 24, **overrides})


def hf_model(family: str, **overrides):
    """A random HF model whose norms and router are random too (so swapped names cannot pass)."""
    cfg = hf_config(family, **overrides)
    torch.manual_seed(0)
    cls = transformers.Qwen3MoeForCausalLM if family == "qwen3_moe" else transformers.MixtralForCausalLM
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            elif name.endswith("gate.weight"):
                p.normal_(0, 0.5)  # the router: distinct choices per token
    return cfg, model


@cache
def hf_state(family: str):
    cfg, model = hf_model(family)
    return cfg, model.state_dict()


def gather(state: dict, layout, tp: int, pp: int, ep: int, etp: int) -> dict[str, list]:
    """Every shard of every rank, keyed by global Megatron name (global expert index), shards in (expert) TP order."""
    out: dict[str, dict[int, list]] = {}
    n_local = layout.experts.num_experts // ep
    for pp_rank in range(pp):
        offset = mw.Stages(layout.num_layers, pp).layers(pp_rank).start
        for ep_rank in range(ep):
            # the dense part's TP ranks and the experts' ETP ranks are different slices of the same ranks: take
            # TP shards from expert rank 0's view and ETP shards from each expert-tensor rank
            for r in range(max(tp, etp)):
                place = mx.Placement(ep_rank, ep, r % etp, etp)
                state_r = mm.hf_to_megatron(state, layout, r % tp, tp, pp_rank, pp, experts=place)
                for name, t in state_r.items():
                    local = mw.global_name(name, offset)
                    if mx.is_expert(local):
                        if r >= etp:
                            continue
                        local = mx.global_expert_name(local, ep_rank * n_local)
                    elif ep_rank or r >= tp:
                        continue
                    out.setdefault(local, {}).setdefault(pp_rank, []).append(t)
    for name, stages in out.items():
        assert len(stages) == 1, f"{name} on stages {sorted(stages)}"
    return {name: next(iter(stages.values())) for name, stages in out.items()}


@pytest.mark.parametrize("tp,pp,ep,etp", [(1, 1, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (2, 2, 4, 1), (1, 1, 2, 2)])
@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_exact(family, tp, pp, ep, etp):
    cfg, state = hf_state(family)
    assert mw.conversion_for(cfg) is mm
    layout = mm.layout_from_hf(cfg, tp_size=tp)
    shards = gather(state, layout, tp, pp, ep, etp)
    back: list[tuple[str, torch.Tensor]] = []
    for name, ts in shards.items():
        want = etp if mx.is_expert(name) else tp
        assert len(ts) == want, name
        if mm.tp_split_dim(name) is None:
            assert all(torch.equal(t, ts[0]) for t in ts)
            ts = ts[:1]
        back += mm.megatron_to_hf(name, ts, layout)
    assert not layout.pending
    expected = [n for n in state if not (layout.tied and n == "lm_head.weight")]
    assert mm.hf_names(layout) == expected
    names = [n for n, _ in back]
    assert len(names) == len(set(names)) and set(names) == set(expected)
    for name, t in back:
        assert torch.equal(t, state[name]), name


def test_expert_shards_hold_their_experts_and_halves():
    cfg, state = hf_state("qwen3_moe")
    layout = mm.layout_from_hf(cfg)
    got = mm.hf_to_megatron(state, layout, experts=mx.Placement(ep_rank=1, ep_size=2, etp_rank=1, etp_size=2))
    fc1 = got["decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"]
    fc2 = got["decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"]
    gate_up, down = state["model.layers.1.mlp.experts.gate_up_proj"], state["model.layers.1.mlp.experts.down_proj"]
    # rank (ep 1, etp 1) holds experts 2 and 3, the second half of each of gate and up, of down's columns
    assert torch.equal(fc1, torch.cat([gate_up[2, 12:24], gate_up[2, 36:48]]))
    assert torch.equal(fc2, down[3][:, 12:])
    assert "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight" not in got
    assert torch.equal(got["decoder.layers.0.mlp.router.weight"], state["model.layers.0.mlp.gate.weight"])
    assert mx.expert_leaf("mlp.experts.linear_fc2.weight3") == (3, 2)
    assert mx.global_expert_name("decoder.layers.1.mlp.experts.linear_fc1.weight1", 2).endswith("fc1.weight3")


def test_config_kwargs_follow_the_router():
    kw = mm.transformer_config_kwargs(hf_config("qwen3_moe"))
    assert kw["num_moe_experts"] == 4 and kw["moe_router_topk"] == 2 and kw["moe_ffn_hidden_size"] == 24
    assert kw["qk_layernorm"] is True and kw["moe_router_pre_softmax"] is False and kw["kv_channels"] == 12
    assert mm.transformer_config_kwargs(hf_config("qwen3_moe", norm_topk_prob=False))["moe_router_pre_softmax"]
    kw = mm.transformer_config_kwargs(hf_config("mixtral"))
    assert kw["qk_layernorm"] is False and kw["moe_router_pre_softmax"] is False and kw["moe_ffn_hidden_size"] == 24


def test_unsupported_moe_configs():
    with pytest.raises(mw.UnsupportedModel, match="mlp_only_layers"):
        mm.layout_from_hf(hf_config("qwen3_moe", mlp_only_layers=[0]))
    with pytest.raises(mw.UnsupportedModel, match="router_jitter_noise"):
        mm.layout_from_hf(hf_config("mixtral", router_jitter_noise=0.1))
    with pytest.raises(mw.UnsupportedModel, match="num_key_value_heads=2 is not divisible by tp_size=4"):
        mm.layout_from_hf(hf_config("qwen3_moe"), tp_size=4)
    assert "not divisible by expert_model_parallel_size=3" in mx.check(
        mm.layout_from_hf(hf_config("mixtral")).experts, ep_size=3
    )


@pytest.fixture(scope="module")
def megatron_run():
    """One subprocess for the Megatron checks (importing Megatron-Core costs seconds)."""
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


def test_converted_megatron_moe_model_computes_hf_logits(megatron_run):
    assert megatron_run.returncode == 0, _failure(megatron_run)
    for family in FAMILIES:
        assert f"structure ok {family}" in megatron_run.stdout, _failure(megatron_run)
    line = next(x for x in megatron_run.stdout.splitlines() if x.startswith("forward "))
    errors = json.loads(line.removeprefix("forward "))
    assert set(errors) == {*FAMILIES, "qwen3_moe_unnormalized"}
    for name, err in errors.items():
        assert err < 1e-4, (name, errors)


# ---- subprocess side: runs with Megatron-Core imported ----


def _megatron_world():
    import torch.distributed as dist
    from megatron.core import parallel_state

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


def _gpt_model(cfg, layout):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    tc = TransformerConfig(
        **mm.transformer_config_kwargs(cfg),
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        moe_token_dispatcher_type="alltoall",
    )
    return GPTModel(tc, mm.layer_spec(tc, te=False), **mm.gpt_model_kwargs(cfg, layout))


def _forward_error(cfg, hf) -> float:
    layout = mm.layout_from_hf(cfg)
    model = _gpt_model(cfg, layout)
    conv = mm.hf_to_megatron(hf.state_dict(), layout)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    assert want == {k: tuple(v.shape) for k, v in conv.items()}, sorted(set(want) ^ set(conv))
    model.load_state_dict(conv, strict=False)
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
    """Check names and shapes against real MoE GPTModels and their logits against HF's (one rank, CPU)."""
    from rlc.runtime.workers import megatron_cpu

    models = {family: hf_model(family) for family in FAMILIES}  # seeded before megatron_cpu patches seeding
    models["qwen3_moe_unnormalized"] = hf_model("qwen3_moe", norm_topk_prob=False)
    _megatron_world()
    from megatron.core import tensor_parallel

    megatron_cpu.enable()
    with megatron_cpu.active():
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        errors = {}
        for name, (cfg, hf) in models.items():
            errors[name] = _forward_error(cfg, hf)
            print(f"structure ok {name}", flush=True)
    print("forward " + json.dumps(errors), flush=True)


if __name__ == "__main__":
    main()
