"""Mixture-of-experts models under the megatron strategy: rlc's HF <-> Megatron-Core conversion of Qwen3-MoE and
Mixtral (runtime/workers/megatron_moe.py, megatron_experts.py), and the Megatron worker training a tiny Qwen3-MoE
under expert parallelism on the CPU.

Megatron-Core itself is only imported in subprocesses (this file run as a script, or the worker's spawned ranks), so
its global parallel state never leaks into other tests. The worker's GRPO step under expert parallelism (with data and
pipeline parallelism, both token dispatchers) gives fsdp2's losses, gradient norm and updated Hugging Face weights on
the same batch; a checkpoint written on one rank resumes on two expert-parallel ranks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
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


def gather(state: dict, layout, tp: int, pp: int, ep: int, etp: int, conversion=mm) -> dict[str, list]:
    """Every shard of every rank, keyed by global Megatron name (global expert index), shards in (expert) TP order;
    `conversion`: the family module whose hf_to_megatron cuts them."""
    out: dict[str, dict[int, list]] = {}
    n_local = layout.experts.num_experts // ep
    for pp_rank in range(pp):
        offset = mw.Stages(layout.num_layers, pp).layers(pp_rank).start
        for ep_rank in range(ep):
            # the dense part's TP ranks and the experts' ETP ranks are different slices of the same ranks: take
            # TP shards from expert rank 0's view and ETP shards from each expert-tensor rank
            for r in range(max(tp, etp)):
                place = mx.Placement(ep_rank, ep, r % etp, etp)
                state_r = conversion.hf_to_megatron(state, layout, r % tp, tp, pp_rank, pp, experts=place)
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


# ---- the worker: a GRPO step under expert parallelism ----


def test_the_worker_refuses_expert_layouts_megatron_would_fail_mid_step():
    pytest.importorskip("megatron.core")
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model

    def check(tp: int = 1, te: bool = False, **megatron):
        worker = object.__new__(MegatronWorker)  # the check reads the layout, sizes and settings only
        spec = default_model().to_typed(
            {"version": 1, "trainer": {"strategy": "megatron", "policy": {"megatron_config": megatron}}}
        )
        worker.mc, worker.tp, worker.hf_config = spec.trainer.policy.megatron_config, tp, hf_config("qwen3_moe")
        worker.arch = mm.layout_from_hf(worker.hf_config, tp)
        worker._check_experts(te)

    check(expert_model_parallel_size=4)
    check(expert_model_parallel_size=2, expert_tensor_parallel_size=2)  # etp apart from tp: test_moe_step_matches_fsdp2
    with pytest.raises(RuntimeError, match="num_experts=4 is not divisible by expert_model_parallel_size=3"):
        check(expert_model_parallel_size=3)
    with pytest.raises(RuntimeError, match="sequence_parallel: false"):
        check(tp=2, te=True, transformer_config_kwargs={"sequence_parallel": False})
    check(tp=2)  # sequence parallelism by default under TP, rlc's norms on the local spec (the tp2 step below)
    check(tp=2, te=True)


@pytest.fixture(scope="module")
def moe_model(tiny_model, tmp_path_factory) -> str:
    """A tiny Qwen3-MoE (2 layers of 4 experts, top 2) with `rlc:tiny`'s tokenizer and vocabulary."""
    target = tmp_path_factory.mktemp("qwen3-moe") / "model"
    shutil.copytree(tiny_model, target)
    vocab = transformers.AutoConfig.from_pretrained(tiny_model).vocab_size
    cfg, model = hf_model("qwen3_moe", vocab_size=vocab, hidden_size=32, tie_word_embeddings=False)
    model.save_pretrained(target)
    return str(target)


def _moe_rank(rank: int, world: int, port: int, q, model_path: str, out: str, mc: dict, ckpt: str, mode: str) -> None:
    """One GRPO step (mode "step"); a step then a checkpoint (mode "save"); or a fresh worker resuming the
    checkpoint, then a step (mode "resume"). The step's metrics, layout and old log-probs go on the queue, rank 0's
    Hugging Face weights after the step (and the weight metas) to `out`."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model
    from test_fsdp import _batch_and_noise
    from test_megatron import ALGORITHM, OPTIMIZER, _old_logprobs

    megatron = {"dist_ckpt_optim_fully_reshardable": True, **mc}
    policy = {"optimizer_config": OPTIMIZER, "megatron_config": megatron}
    spec = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": "megatron", "policy": policy, "algorithm": ALGORITHM}}
    )
    settings = WorkerSettings(
        "policy", model_path, micro_train_batch_size=2, micro_forward_batch_size=3, total_optimizer_steps=4
    )
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    layout = worker.layout()
    batch, noise = _batch_and_noise(transformers.AutoConfig.from_pretrained(model_path).vocab_size)
    mine = shards(batch, layout["dp_size"])[layout["dp_rank"]]
    mine_noise = noise.chunk(layout["dp_size"])[layout["dp_rank"]]
    result: dict = {
        "layout": layout,
        "experts": [len(c.decoder.layers[0].mlp.experts.local_experts) for c in worker.chunks],
    }
    if mode == "resume":
        worker.load_checkpoint(ckpt)
    result["squares"] = worker.forward(mine, sum_pi_squared=True)
    old = _old_logprobs(worker, mine, world)
    result["old"] = old
    result["metrics"] = worker.train_mini_batch(dataclasses.replace(mine, old_logprobs=old + mine_noise), totals(batch))
    full = worker.full_state_dict()
    metas = [(m.name, tuple(m.shape)) for m in worker.weight_metas()]
    if mode == "save":  # then a second step, which a worker resuming the checkpoint must take alike
        worker.save_checkpoint(ckpt)
        old = _old_logprobs(worker, mine, world)
        step = dataclasses.replace(mine, old_logprobs=old + mine_noise)
        result["second"] = worker.train_mini_batch(step, totals(batch))
        second = worker.full_state_dict()
        if rank == 0:
            torch.save({"weights": second}, out + ".second")
    if rank == 0:
        torch.save({"weights": full, "metas": metas}, out)
    q.put((rank, result))
    worker.shutdown()


def _moe_run(world: int, model_path: str, out: str, mc: dict | None = None, ckpt: str = "", mode: str = "step"):
    from conftest import run_ranks  # here: this file also runs as a script, where tests/ is not on the path

    return run_ranks(_moe_rank, world, model_path, out, mc or {}, ckpt, mode)


EP2 = {"expert_model_parallel_size": 2}


@pytest.fixture(scope="module")
def moe_runs(moe_model, tmp_path_factory):
    pytest.importorskip("megatron.core")
    from test_megatron import _run

    d = tmp_path_factory.mktemp("megatron-moe")
    ckpt = str(d / "ckpt")
    return {
        "fsdp": _run(1, moe_model, str(d / "fsdp.pt"), strategy="fsdp2"),
        "one": _moe_run(1, moe_model, str(d / "one.pt")),
        # two data-parallel ranks whose experts split in two (tokens cross ranks by all-to-all); then a checkpoint
        "ep2": _moe_run(2, moe_model, str(d / "ep2.pt"), EP2, ckpt=ckpt, mode="save"),
        # two stages of two data-parallel ranks, experts split over each stage's two: the all-gather dispatcher
        "ep2pp2": _moe_run(
            4,
            moe_model,
            str(d / "ep2pp2.pt"),
            {**EP2, "pipeline_model_parallel_size": 2, "moe_token_dispatcher_type": "allgather"},
        ),
        # each expert split in halves over two data-parallel ranks (expert tensor parallelism apart from tp 1): their
        # gradients reduce over the expert-data-parallel group, not the dense one, whose ranks hold other halves
        "etp2": _moe_run(2, moe_model, str(d / "etp2.pt"), {"expert_tensor_parallel_size": 2}),
        # two tensor-parallel ranks (sequence parallelism, rlc's norms on Megatron's local spec), experts split
        # over them by ep 2 with etp 1, as SkyRL's Qwen3-MoE scripts lay them out (tp4 ep8 etp1)
        "tp2": _moe_run(
            2, moe_model, str(d / "tp2.pt"), {"tensor_model_parallel_size": 2, **EP2, "expert_tensor_parallel_size": 1}
        ),
        # fresh workers resume the checkpoint on its own expert layout (Megatron-Core 0.16 names optimizer state
        # differently under other expert layouts: the worker refuses those in one line)
        "resume": _moe_run(2, moe_model, str(d / "resume.pt"), EP2, ckpt=ckpt, mode="resume"),
    }, d


@pytest.mark.parametrize("layout", ["one", "ep2", "ep2pp2", "etp2", "tp2"])
def test_moe_step_matches_fsdp2(moe_runs, layout, moe_model):
    from test_megatron import _assert_same_step

    by_name, d = moe_runs
    _assert_same_step(by_name["fsdp"], d / "fsdp.pt", by_name[layout], d / f"{layout}.pt", moe_model)


def test_experts_are_split_over_the_expert_parallel_ranks(moe_runs):
    by_name, _ = moe_runs
    assert [r["experts"] for r in by_name["one"]] == [[4]]
    assert [r["experts"] for r in by_name["ep2"]] == [[2], [2]]
    assert [r["layout"]["dp_size"] for r in by_name["ep2pp2"]] == [2] * 4
    assert [r["experts"] for r in by_name["ep2pp2"]] == [[2]] * 4


def test_weight_metas_are_the_hf_moe_model(moe_runs, moe_model):
    by_name, d = moe_runs
    hf = transformers.AutoModelForCausalLM.from_pretrained(moe_model).state_dict()
    want = {k: tuple(v.shape) for k, v in hf.items()}
    for layout in ("one", "ep2", "ep2pp2", "etp2", "tp2"):
        saved = torch.load(d / f"{layout}.pt")
        assert dict(saved["metas"]) == want, layout
        assert saved["weights"].keys() == hf.keys(), layout


def test_a_checkpoint_of_expert_parallel_ranks_restores_the_step(moe_runs):
    by_name, d = moe_runs
    first, second = [r["metrics"] for r in by_name["ep2"]], [r["second"] for r in by_name["ep2"]]
    resumed = [r["metrics"] for r in by_name["resume"]]
    assert second[0]["policy_loss"] != first[0]["policy_loss"]  # the first step moved the weights
    for key in ("policy_loss", "kl", "entropy", "grad_norm"):
        for got, want in zip(resumed, second):
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-8), key
    w_second, w_resumed = torch.load(str(d / "ep2.pt") + ".second")["weights"], torch.load(d / "resume.pt")["weights"]
    assert w_second.keys() == w_resumed.keys()
    for name in w_second:  # the optimizer state came back too: the step after it moves the weights the same way
        torch.testing.assert_close(w_resumed[name], w_second[name], rtol=0, atol=1e-6, msg=name)


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
