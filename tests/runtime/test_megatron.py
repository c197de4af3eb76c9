"""Megatron-Core workers (strategy `megatron`) on the CPU, through `megatron_cpu`.

The same GRPO mini-batch step under tensor, pipeline, context and data parallelism gives the same losses, gradient
norm and updated Hugging Face weights as fsdp2's one-rank step on the same batch; a checkpoint restores
the step exactly; the weights streamed to engines are named and shaped as the Hugging Face model's.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from conftest import run_ranks  # noqa: E402
from test_fsdp import _batch, _batch_and_noise  # noqa: E402

ALGORITHM = {"use_kl_loss": True, "kl_loss_coef": 0.1, "use_entropy_loss": True, "policy_loss_type": "dual_clip"}
# Megatron's optimizer does not decay norms and biases, fsdp2's AdamW decays everything: compare without decay.
OPTIMIZER = {"lr": 1e-2, "weight_decay": 0.0}


def _spec(strategy: str, tp: int = 1, pp: int = 1, profile: str | None = None, cp: int = 1, stages: dict | None = None):
    from rlc.spec.model import default_model

    policy = {"optimizer_config": OPTIMIZER}
    if strategy == "megatron":
        policy["megatron_config"] = {
            "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": pp,
            "context_parallel_size": cp,
            "dist_ckpt_optim_fully_reshardable": True,
        }  # resumable on another layout
        if stages:  # uneven or virtual pipeline stages, as SkyRL sets them
            policy["megatron_config"]["transformer_config_kwargs"] = stages
        if profile:  # the last pipeline stage's rank only
            policy["megatron_config"]["torch_profiler_config"] = {"enable": True, "ranks": [1], "save_path": profile}
    return default_model().to_typed(
        {"version": 1, "trainer": {"strategy": strategy, "policy": policy, "algorithm": ALGORITHM}}
    )


def _old_logprobs(worker, mine, world: int) -> torch.Tensor:
    """The rows' log-probs on every rank: the collecting rank of its data-parallel group sends them, as the driver
    does."""
    import torch.distributed as dist

    layout = worker.layout()
    found: list = [None] * world
    dist.all_gather_object(found, (layout["dp_rank"], layout["collect"], worker.forward(mine)))
    return next(old for dp_rank, collect, old in found if collect and dp_rank == layout["dp_rank"])


def _rank(
    rank: int,
    world: int,
    port: int,
    q,
    model_path: str,
    out: str,
    strategy: str,
    tp: int,
    pp: int,
    ckpt: str | None,
    mode: str,
    cp: int = 1,
    stages: dict | None = None,
    budget: int = -1,
) -> None:
    """mode: "step" (one step), "save" (a step, a checkpoint, a second step, then back to the checkpoint and the
    second step again), or "resume" (a fresh worker loads the checkpoint, then takes the second step). `budget`:
    tokens per micro-batch (-1: micro-batches of a fixed number of rows)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.common import WorkerSettings

    if strategy == "megatron":
        from rlc.runtime.workers.megatron import MegatronWorker as Worker
    else:
        from rlc.runtime.workers.fsdp import FSDPWorker as Worker
    spec = _spec(
        strategy,
        tp,
        pp,
        profile=out + ".prof" if pp == 2 and not stages and budget <= 0 else None,
        cp=cp,
        stages=stages,
    )
    settings = WorkerSettings(
        "policy",
        model_path,
        micro_train_batch_size=2,
        micro_forward_batch_size=3,
        total_optimizer_steps=4,
        max_tokens_per_microbatch=budget,
    )
    worker = Worker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    layout = worker.layout()
    from transformers import AutoConfig

    if strategy == "megatron":  # the global layer numbers Megatron gave each model chunk's layers
        chunks = [[layer.layer_number - 1 for layer in c.decoder.layers] for c in worker.chunks]

    batch, noise = _batch_and_noise(AutoConfig.from_pretrained(model_path).vocab_size)
    mine = shards(batch, layout["dp_size"])[layout["dp_rank"]]
    mine_noise = noise.chunk(layout["dp_size"])[layout["dp_rank"]]
    result: dict = {"layout": layout, "chunks": chunks if strategy == "megatron" else None}
    if budget > 0:  # what the budget cut: each micro-batch's rows (None: a row with no loss) and the tokens it runs
        micro = worker._micro_batches(mine, settings.micro_train_batch_size)
        result["micro"] = [(None if rows is None else rows.tolist(), mb.input_ids.numel()) for rows, mb in micro]
    if mode == "step":  # the old-log-prob pass the optimal token baselines ask for (the collecting ranks' rows)
        result["squares"] = worker.forward(mine, sum_pi_squared=True)
    if mode == "step" and pp == 2 and budget <= 0:  # rows the driver padded the batch with count as rows too
        result["padded"] = worker.forward(dataclasses.replace(mine, padding_rows=1))

    def step() -> dict:
        old = _old_logprobs(worker, mine, world)
        result.setdefault("old", old)
        # ratios != 1
        return worker.train_mini_batch(dataclasses.replace(mine, old_logprobs=old + mine_noise), totals(batch))

    if mode == "resume":
        worker.load_checkpoint(ckpt)
        result["second"] = step()
    else:
        result["metrics"] = step()
    full = worker.full_state_dict()
    if mode == "save":
        worker.save_checkpoint(ckpt)
        result["second"] = step()
        second = worker.full_state_dict()
        worker.load_checkpoint(ckpt)
        result["again"] = step()
        again = worker.full_state_dict()
        if rank == 0:
            result["metas"] = [(m.name, tuple(m.shape)) for m in worker.weight_metas()]
            torch.save({"weights": second}, out + ".second")
            torch.save({"weights": again}, out + ".again")
    if rank == 0:
        torch.save({"weights": full}, out)
    q.put((rank, result))
    worker.shutdown()


def _run(
    world: int,
    model_path: str,
    out: str,
    strategy: str = "megatron",
    tp: int = 1,
    pp: int = 1,
    ckpt: str | None = None,
    mode: str = "step",
    cp: int = 1,
    stages: dict | None = None,
    budget: int = -1,
) -> list[dict]:
    return run_ranks(_rank, world, model_path, out, strategy, tp, pp, ckpt, mode, cp, stages, budget)


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("megatron")
    ckpt = str(d / "ckpt")
    return {
        "fsdp": _run(1, tiny_model, str(d / "fsdp.pt"), strategy="fsdp2"),
        "one": _run(1, tiny_model, str(d / "one.pt"), ckpt=ckpt, mode="save"),
        "tp2": _run(2, tiny_model, str(d / "tp2.pt"), tp=2),
        "pp2": _run(2, tiny_model, str(d / "pp2.pt"), pp=2),
        "cp2": _run(2, tiny_model, str(d / "cp2.pt"), cp=2),
        "tp2cp2": _run(4, tiny_model, str(d / "tp2cp2.pt"), tp=2, cp=2),
        # Token-budget micro-batches of at most 13 tokens (the batch's rows hold 6 to 8): on one data-parallel rank
        # 3 micro-batches of 1 or 2 rows, 6 to 8 wide, which pipeline stages pass on in changing shapes; on the
        # other 4 of one row each, out of batch order, so the first rank runs a row with no loss as its fourth.
        "pp2dp2budget": _run(4, tiny_model, str(d / "pp2dp2budget.pt"), pp=2, budget=13),
        # Two data-parallel ranks resume the one-rank checkpoint: the optimizer state is resharded.
        "dp2": _run(2, tiny_model, str(d / "dp2.pt"), ckpt=ckpt, mode="resume"),
    }, d


def _collected(results: list[dict]) -> list[dict]:
    return [r for r in results if r["layout"]["collect"]]


@pytest.mark.parametrize("layout", ["one", "tp2", "pp2", "cp2", "tp2cp2", "pp2dp2budget"])
def test_megatron_step_matches_fsdp2(runs, layout, tiny_model):
    by_name, d = runs
    _assert_same_step(by_name["fsdp"], d / "fsdp.pt", by_name[layout], d / f"{layout}.pt", tiny_model)


def _assert_same_step(fsdp: list[dict], fsdp_weights, results: list[dict], weights, model_path: str) -> None:
    """The Megatron layout's step gave fsdp2's losses, gradient norm, log-probs and updated weights."""
    ref = fsdp[0]["metrics"]
    got = _collected(results)
    assert len(got) == results[0]["layout"]["dp_size"]
    for key in ("policy_loss", "kl", "entropy", "clip_fraction"):
        assert sum(r["metrics"][key] for r in got) == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    assert got[0]["metrics"]["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    old = torch.cat([r["old"] for r in sorted(got, key=lambda r: r["layout"]["dp_rank"])])
    real = _batch(64).loss_mask.bool()  # padding positions score tokens no row has
    torch.testing.assert_close(old[real], fsdp[0]["old"][real], rtol=1e-4, atol=1e-5)
    if "squares" in got[0]:  # the log-probs and each token's sum of squared probabilities, in one pass
        squares = torch.cat([r["squares"] for r in sorted(got, key=lambda r: r["layout"]["dp_rank"])])
        torch.testing.assert_close(squares[real], fsdp[0]["squares"][real], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(squares[..., 0][real], old[real], rtol=1e-4, atol=1e-5)
    w_ref, w = torch.load(fsdp_weights)["weights"], torch.load(weights)["weights"]
    assert w.keys() == w_ref.keys()
    start = _initial(model_path)
    lr, strong, total = OPTIMIZER["lr"], 0, 0
    for name in w_ref:
        # Adam's first step is lr * g / (|g| + eps). Where |g| is far above eps (95% of the elements here) the step
        # is +-lr and both strategies must agree; where a gradient nearly cancels out (|g| ~ eps), the order the
        # ranks sum in decides its sign, so those elements are not compared.
        clear = (w_ref[name] - start[name]).abs() > 0.999 * lr
        torch.testing.assert_close(w[name][clear], w_ref[name][clear], rtol=0, atol=1e-5, msg=name)
        strong, total = strong + int(clear.sum()), total + clear.numel()
    assert strong > 0.9 * total


def test_token_budget_micro_batches_hold_the_budget_and_run_alike_on_every_rank(runs):
    by_name, _ = runs
    ranks = by_name["pp2dp2budget"]
    for r in ranks:
        micro = r["micro"]
        rows = [i for part, _ in micro for i in part or []]
        assert sorted(rows) == list(range(_batch(64).rows // r["layout"]["dp_size"]))  # each row once
        assert all(tokens <= 13 or len(part or [0]) == 1 for part, tokens in micro)
        # 3 micro-batches hold data-parallel rank 0's rows, 4 rank 1's: rank 0 runs a row with no loss
        assert [part is None for part, _ in micro].count(True) == (r["layout"]["dp_rank"] == 0)
    assert any(len(part or []) > 1 for r in ranks for part, _ in r["micro"])  # rows share where the budget holds them
    assert {len(r["micro"]) for r in ranks} == {4}  # every rank runs as many micro-batches


def _initial(model_path: str) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path).state_dict()


def test_the_profiler_traces_the_listed_ranks_steps(runs):
    _, d = runs
    traces = sorted(p.name for p in (d / "pp2.pt.prof").iterdir())
    assert traces == ["policy_rank1_step1.json"]  # rank 0 is not listed; one trace per optimizer step
    import json

    events = json.loads((d / "pp2.pt.prof" / traces[0]).read_text())["traceEvents"]
    assert sum(str(e.get("name", "")).startswith("aten::") for e in events) > 100  # the step's ops were traced


def test_layouts(runs):
    by_name, _ = runs
    assert [r["layout"] for r in by_name["tp2"]] == [
        {"dp_rank": 0, "dp_size": 1, "collect": True},
        {"dp_rank": 0, "dp_size": 1, "collect": False},
    ]
    assert [r["layout"]["collect"] for r in by_name["pp2"]] == [False, True]  # the last stage has the logits
    # A shard of a batch the driver padded to divide over the ranks: a log-prob for each of its rows, padding or not
    torch.testing.assert_close(by_name["pp2"][1]["padded"], by_name["pp2"][1]["squares"][..., 0])
    # Context ranks share their rows (each holds half of every row's tokens); context rank 0 returns results.
    assert [r["layout"] for r in by_name["cp2"]] == [
        {"dp_rank": 0, "dp_size": 1, "collect": True},
        {"dp_rank": 0, "dp_size": 1, "collect": False},
    ]
    assert [r["layout"]["dp_rank"] for r in by_name["dp2"]] == [0, 1]


def test_checkpoint_restores_the_step(runs):
    by_name, _ = runs
    one = by_name["one"][0]
    assert one["second"]["policy_loss"] != one["metrics"]["policy_loss"]  # the weights did move
    for key in ("policy_loss", "kl", "entropy", "grad_norm"):
        assert one["again"][key] == pytest.approx(one["second"][key], rel=1e-6, abs=1e-8), key
    _, d = runs
    second, again = (
        torch.load(str(d / "one.pt") + ".second")["weights"],
        torch.load(str(d / "one.pt") + ".again")["weights"],
    )
    for name in second:  # the optimizer state came back too: the step after it moves the weights the same way
        torch.testing.assert_close(again[name], second[name], rtol=0, atol=1e-6, msg=name)


def test_a_fresh_worker_resumes_on_another_data_parallel_layout(runs):
    by_name, d = runs
    one, dp2 = by_name["one"][0]["second"], [r["second"] for r in by_name["dp2"]]
    for key in ("policy_loss", "kl", "entropy"):
        assert sum(m[key] for m in dp2) == pytest.approx(one[key], rel=1e-4, abs=1e-6), key
    assert dp2[0]["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)
    w_one, w_dp2 = torch.load(str(d / "one.pt") + ".second")["weights"], torch.load(d / "dp2.pt")["weights"]
    for name in w_one:
        torch.testing.assert_close(w_dp2[name], w_one[name], rtol=1e-4, atol=1e-5, msg=name)


def test_weight_metas_are_the_hf_model(runs, tiny_model):
    from transformers import AutoModelForCausalLM

    by_name, d = runs
    hf = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    metas = dict(by_name["one"][0]["metas"])
    assert metas == {k: tuple(v.shape) for k, v in hf.items()}
    assert torch.load(d / "one.pt")["weights"].keys() == hf.keys()


# -- uneven and virtual pipeline stages ----------------------------------------------------------------------

UNEVEN = {"num_layers_in_first_pipeline_stage": 1}  # 4 layers: 1 on the first stage, 3 on the last
VIRTUAL = {"virtual_pipeline_model_parallel_size": 2}  # 4 layers: chunks [0] [2] on stage 0, [1] [3] on stage 1


@pytest.mark.parametrize(
    "stages",
    [
        dict(num_layers=94, pp=12, first=6),  # AReaL's Qwen3-235B tau2 job: 6 + 10 x 8 + 8
        dict(num_layers=9, pp=4, last=3),
        dict(num_layers=12, pp=4, first=2, last=2, virtual=2),
        dict(num_layers=8, pp=4, virtual=2),
        dict(num_layers=7, pp=3, first=3),
    ],
)
def test_stages_are_where_megatron_core_puts_the_layers(stages):
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
    from rlc.core.pipeline_stages import Stages

    ours = Stages(**stages)
    config = TransformerConfig(
        num_layers=ours.num_layers,
        hidden_size=8,
        num_attention_heads=2,
        pipeline_model_parallel_size=ours.pp,
        num_layers_in_first_pipeline_stage=ours.first,
        num_layers_in_last_pipeline_stage=ours.last,
        virtual_pipeline_model_parallel_size=ours.virtual if ours.virtual > 1 else None,
        pipeline_dtype=torch.float32,
    )
    seen = []
    for pp_rank in range(ours.pp):
        for v in range(ours.virtual):
            vp = v if ours.virtual > 1 else None
            start = get_transformer_layer_offset(config, vp_stage=vp, pp_rank=pp_rank)
            count = get_num_layers_to_build(config, vp_stage=vp, pp_rank=pp_rank)
            assert ours.layers(pp_rank, v) == range(start, start + count), (pp_rank, v)
            seen += ours.layers(pp_rank, v)
    assert sorted(seen) == list(range(ours.num_layers))


def test_stages_that_do_not_split_are_refused():
    from rlc.core.pipeline_stages import Stages

    with pytest.raises(ValueError, match="89 layers left for the other 11 stages"):
        Stages(94, 12, first=5).layers(0)
    with pytest.raises(ValueError, match="virtual stages"):
        Stages(6, 2, first=3, virtual=2).layers(0)


@pytest.fixture(scope="module")
def four_layers(tiny_model, tmp_path_factory) -> str:
    """`rlc:tiny` with four decoder layers (seeded weights): room for uneven and virtual stages over two ranks."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM

    target = tmp_path_factory.mktemp("four-layers") / "model"
    shutil.copytree(tiny_model, target)
    config = AutoConfig.from_pretrained(tiny_model)
    config.num_hidden_layers = 4
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(target)
    return str(target)


@pytest.fixture(scope="module")
def stage_runs(four_layers, tmp_path_factory):
    d = tmp_path_factory.mktemp("megatron-stages")
    return {
        "fsdp": _run(1, four_layers, str(d / "fsdp.pt"), strategy="fsdp2"),
        "uneven": _run(2, four_layers, str(d / "uneven.pt"), pp=2, stages=UNEVEN),
        "virtual": _run(2, four_layers, str(d / "virtual.pt"), pp=2, ckpt=str(d / "ckpt"), mode="save", stages=VIRTUAL),
    }, d


@pytest.mark.parametrize(
    "layout,chunks",
    [("uneven", [[[0]], [[1, 2, 3]]]), ("virtual", [[[0], [2]], [[1], [3]]])],
)
def test_a_step_on_uneven_or_virtual_stages_matches_fsdp2(stage_runs, four_layers, layout, chunks):
    by_name, d = stage_runs
    assert [r["chunks"] for r in by_name[layout]] == chunks  # each rank's model chunks, as Megatron-Core built them
    _assert_same_step(by_name["fsdp"], d / "fsdp.pt", by_name[layout], d / f"{layout}.pt", four_layers)


def test_a_checkpoint_of_virtual_stages_restores_the_step(stage_runs, four_layers):
    from transformers import AutoModelForCausalLM

    by_name, d = stage_runs
    last = _collected(by_name["virtual"])[0]
    assert last["second"]["policy_loss"] != last["metrics"]["policy_loss"]
    for key in ("policy_loss", "kl", "entropy", "grad_norm"):
        assert last["again"][key] == pytest.approx(last["second"][key], rel=1e-6, abs=1e-8), key
    second, again = (torch.load(str(d / "virtual.pt") + s)["weights"] for s in (".second", ".again"))
    for name in second:
        torch.testing.assert_close(again[name], second[name], rtol=0, atol=1e-6, msg=name)
    hf = AutoModelForCausalLM.from_pretrained(four_layers).state_dict()
    assert dict(by_name["virtual"][0]["metas"]) == {k: tuple(v.shape) for k, v in hf.items()}


# -- LoRA -------------------------------------------------------------------------------------------------

LORA_TYPES = ("lora", "canonical_lora", "dora")


def _lora_rank(rank: int, world: int, port: int, q, model_path: str, out: str) -> None:
    """Per lora_type, on tp=2: one step, then the LoRA model's log-probs and its merged Hugging Face weights."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.runtime.workers.megatron_lora import LoraLinear
    from rlc.spec.model import default_model

    result = {}
    for lora_type in LORA_TYPES:
        spec = default_model().to_typed(
            {
                "version": 1,
                "trainer": {
                    "strategy": "megatron",
                    "algorithm": ALGORITHM,
                    "policy": {
                        "optimizer_config": {"lr": 5e-2},
                        "model": {"lora": {"rank": 4, "alpha": 8}},
                        "megatron_config": {"tensor_model_parallel_size": 2, "lora_config": {"lora_type": lora_type}},
                    },
                },
            }
        )
        worker = MegatronWorker(
            WorkerSettings("policy", model_path, micro_train_batch_size=4, micro_forward_batch_size=8),
            spec.trainer.policy,
            spec.trainer.algorithm,
            rank,
            world,
        )
        worker.setup("127.0.0.1", port)
        batch = _batch(64)
        trainable = {n for n, p in worker.chunks[0].named_parameters() if p.requires_grad}
        metrics = worker.train_mini_batch(
            dataclasses.replace(batch, old_logprobs=_old_logprobs(worker, batch, world)), totals(batch)
        )
        logp = worker.forward(batch)
        full = worker.full_state_dict()
        adapted = sum(isinstance(m, LoraLinear) for m in worker.chunks[0].modules())
        params = list(worker.chunks[0].parameters())
        grads = [p.main_grad for p in params if getattr(p, "main_grad", None) is not None]
        opts = getattr(worker.optimizer, "chained_optimizers", None) or [worker.optimizer]
        moments = [v for o in opts for s in o.optimizer.state.values() for k, v in s.items() if k.startswith("exp_avg")]
        if rank == 0:
            torch.save(full, f"{out}.{lora_type}")
        result[lora_type] = {
            "logp": logp.numpy(),
            "trainable": trainable,
            "adapted": adapted,
            "grad_norm": metrics["grad_norm"],
            "trainable_numel": sum(p.numel() for p in params if p.requires_grad),
            "grad_bytes": sum(g.numel() * g.element_size() for g in grads),
            "moment_bytes": sum(m.numel() * m.element_size() for m in moments),
        }
    q.put((rank, result))  # numpy: a tensor would be shared memory that dies with this process
    worker.shutdown()


@pytest.fixture(scope="module")
def lora_runs(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("megatron_lora")
    results = dict(enumerate(run_ranks(_lora_rank, 2, tiny_model, str(d / "merged"))))
    return results, d


@pytest.mark.parametrize("lora_type", LORA_TYPES)
def test_lora_model_is_its_merged_weights(lora_runs, tiny_model, lora_type):
    """The adapted Megatron model (tp=2) scores tokens as the plain Hugging Face model with its merged weights does:
    the adapters' tensor-parallel split, canonical_lora's per-projection layout and DoRA's norms are all right."""
    from rlc.runtime.algorithms.losses import token_log_probs
    from transformers import AutoModelForCausalLM

    results, d = lora_runs
    got = results[0][lora_type]
    assert got["adapted"] == 8  # qkv, proj, fc1, fc2 of both layers
    assert got["trainable"] and all(".lora_" in n or n.endswith("magnitude") for n in got["trainable"])
    assert got["grad_norm"] > 0
    merged = torch.load(str(d / "merged") + f".{lora_type}")
    start = AutoModelForCausalLM.from_pretrained(tiny_model)
    changed = [n for n, v in start.state_dict().items() if not torch.equal(v, merged[n])]
    assert changed and all(
        n.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
        for n in changed
    )  # only the adapted layers moved
    start.load_state_dict(merged)
    batch = _batch(64)
    attn = batch.attention_mask
    with torch.no_grad():
        logits = start(
            input_ids=batch.input_ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)
        ).logits
    want = token_log_probs(logits[:, batch.prompt_len - 1 : -1], batch.response_ids, 1.0)
    real = batch.loss_mask.bool()
    torch.testing.assert_close(torch.from_numpy(got["logp"])[real], want[real], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lora_type", LORA_TYPES)
def test_the_memory_estimate_trains_the_adapters_alone(lora_runs, tiny_model, lora_type):
    """The memory estimate's Megatron LoRA is what each tp=2 rank holds: its adapters (per lora_type) are the
    parameters that train, and only they get main gradients and Adam's moments; the frozen base has neither."""
    from rlc.compiler.memory import megatron_cost
    from rlc.compiler.model_size import model_info
    from rlc.spec.model import default_model

    shape = model_info(tiny_model).shape
    policy = {"model": {"lora": {"rank": 4, "alpha": 8}}}
    policy["megatron_config"] = {"tensor_model_parallel_size": 2, "lora_config": {"lora_type": lora_type}}
    spec = default_model().to_typed({"version": 1, "trainer": {"strategy": "megatron", "policy": policy}})
    cost = megatron_cost(spec, "policy", shape, 2)
    for got in lora_runs[0].values():
        mine = got[lora_type]
        assert mine["trainable_numel"] < shape.params // 10
        assert cost.train["grads"] == mine["grad_bytes"] == 4 * mine["trainable_numel"]  # fp32 main gradients
        # Adam's two fp32 moments of each adapter, plus (on a GPU) the fp32 master copy of its bf16 weights
        assert cost.optimizer["optimizer"] == 12 * mine["trainable_numel"] == 1.5 * mine["moment_bytes"]


def test_the_compilers_megatron_lora_names_are_the_runtimes():
    """RLC-E510 refuses target_modules by the names rlc's Megatron LoRA maps onto its layers (one table, in core)."""
    from rlc.compiler.rules.parallel import MEGATRON_LORA_NAMES
    from rlc.runtime.workers.megatron_lora import target_layers

    for name in MEGATRON_LORA_NAMES:
        assert target_layers(name), name  # every name the rule accepts puts adapters somewhere
    assert target_layers("qkv_proj,c_attn") == []  # names the rule refuses: the worker would find no layer


def test_the_compilers_megatron_config_fields_are_the_installed_megatron_cores():
    """RLC-E511 refuses transformer/optimizer kwargs by the field names of the Megatron-Core the runtime installs."""
    import dataclasses

    import megatron.core
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig
    from rlc.compiler.megatron_fields import MEGATRON_CORE, OPTIMIZER_CONFIG_FIELDS, TRANSFORMER_CONFIG_FIELDS

    assert megatron.core.__version__.startswith(MEGATRON_CORE + ".")
    assert TRANSFORMER_CONFIG_FIELDS == {f.name for f in dataclasses.fields(TransformerConfig) if f.init}
    assert OPTIMIZER_CONFIG_FIELDS == {f.name for f in dataclasses.fields(OptimizerConfig) if f.init}
