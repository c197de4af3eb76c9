"""LoRA on Qwen3.5's hybrid layers under the megatron strategy: adapters on the gated attention (its linear_qkv's
[q, gate, k, v] rows), the Gated DeltaNet's in_proj / out_proj and the MLP, the base frozen.

Megatron's `lora` adapter of a fused layer shares one A over the projections it fuses; PEFT gives each projection
its own. Started from the same A on every projection (B is zero, so A's first gradient is too), one step of
Megatron on one or two tensor ranks gives fsdp2+PEFT's step: its loss, the adapters it exports unmerged under
PEFT's names, and the merged weights. On Qwen3.5-MoE the routed and shared experts take adapters too.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import zlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytest.importorskip("peft")

from conftest import run_ranks  # noqa: E402
from test_megatron_qwen35 import _hf, qwen35, qwen35_moe_text  # noqa: E402, F401 (the tiny Qwen3.5 fixtures)

LR = 5e-2
LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}
# a Hugging Face projection -> the Megatron layer that fuses it (whose A it shares)
FUSED_BY = {
    "q_proj": "linear_qkv",
    "k_proj": "linear_qkv",
    "v_proj": "linear_qkv",
    "o_proj": "linear_proj",
    "gate_proj": "linear_fc1",
    "up_proj": "linear_fc1",
    "down_proj": "linear_fc2",
    "in_proj_qkv": "in_proj",
    "in_proj_z": "in_proj",
    "in_proj_b": "in_proj",
    "in_proj_a": "in_proj",
    "out_proj": "out_proj",
}


def _start_a(layer: int, fused: str, shape: tuple[int, int]) -> torch.Tensor:
    """The A both strategies start a layer's adapter from (whole input), drawn from its name alone."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{layer}.{fused}".encode()))
    return torch.randn(shape, generator=g) * 0.1


def _seed_megatron(worker) -> None:
    from rlc.runtime.workers.megatron_lora import LoraLinear

    for name, m in worker.chunks[0].named_modules():
        if not isinstance(m, LoraLinear):
            continue
        a = m.lora_A[0]
        layer, leaf = int(name.split(".")[2]), name.rsplit(".", 1)[-1]
        split = m.style == "row" and worker.tp > 1  # a row-parallel layer's A holds this rank's input slice
        whole = _start_a(layer, leaf, (a.shape[0], a.shape[1] * (worker.tp if split else 1)))
        a.data.copy_(whole.chunk(worker.tp, 1)[worker.tp_rank] if split else whole)


def _seed_peft(worker) -> None:
    for name, p in worker.model.named_parameters():
        if ".lora_A." not in name:
            continue
        module = name.split(".lora_A.")[0]
        layer, projection = int(module.split(".layers.")[1].split(".")[0]), module.rsplit(".", 1)[-1]
        local = p.to_local() if hasattr(p, "to_local") else p  # one rank: the whole tensor
        local.data.copy_(_start_a(layer, FUSED_BY[projection], tuple(p.shape)))


def _lora_rank(
    rank: int, world: int, port: int, q, model_path: str, strategy: str, tp: int, merge: bool, lora_type: str = "lora"
) -> None:
    """One GRPO step with LoRA: metrics, the exported adapters (unmerged, PEFT's names) and merged weights, whether
    the base weights stayed as loaded and which parameters trained."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.spec.model import default_model
    from test_fsdp import _batch_and_noise
    from test_megatron import ALGORITHM, _old_logprobs

    policy: dict = {"optimizer_config": {"lr": LR, "weight_decay": 0.0}, "model": {"lora": LORA}}
    if strategy == "megatron":
        from rlc.runtime.workers.megatron import MegatronWorker as Worker

        policy["megatron_config"] = {
            "tensor_model_parallel_size": tp,
            "lora_config": {"merge_lora": merge, "lora_type": lora_type},
        }
    else:
        from rlc.runtime.workers.fsdp import FSDPWorker as Worker
    spec = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": strategy, "policy": policy, "algorithm": ALGORITHM}}
    )
    settings = WorkerSettings("policy", model_path, micro_train_batch_size=4, micro_forward_batch_size=8)
    worker = Worker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    model = worker.chunks[0] if strategy == "megatron" else worker.model
    with torch.no_grad():
        _seed_megatron(worker) if strategy == "megatron" else _seed_peft(worker)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    batch, noise = _batch_and_noise(transformers.AutoConfig.from_pretrained(model_path).vocab_size)
    old = _old_logprobs(worker, batch, world)
    metrics = worker.train_mini_batch(dataclasses.replace(batch, old_logprobs=old + noise), totals(batch))
    adapters = worker.full_state_dict(adapters_only=True) if not merge else None
    if strategy == "megatron":
        merged = worker.full_state_dict()
    else:  # PEFT's merge (merge_and_unload) of fsdp2's adapters, as fsdp2 exports the model
        with tempfile.TemporaryDirectory() as d:
            worker.export_hf(d, model_path)
            merged = _hf(d).state_dict() if rank == 0 else {}
    result = {
        "metrics": metrics,
        "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad),
        "base_unchanged": all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen),
        "logp": worker.forward(batch).numpy(),
        "trainable_numel": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    if rank == 0:
        result["adapters"] = {k: v.numpy() for k, v in (adapters or {}).items()}
        result["merged"] = {k: v.numpy() for k, v in merged.items()}
    if lora_type == "canonical_lora":
        result["pieces"] = _piece_rows(worker)
    q.put((rank, result))  # numpy: a tensor would be shared memory that dies with this process
    worker.shutdown()


def _piece_rows(worker) -> dict:
    """canonical_lora: for each adapter of a DeltaNet's in_proj and a gated attention's linear_qkv, the Hugging Face
    weights that move, and the share of their rows that does, when that adapter's B alone is not zero."""
    from rlc.runtime.workers.megatron_lora import LoraLinear

    modules = [
        worker.chunks[0].get_submodule(n)
        for n in ("decoder.layers.0.self_attention.in_proj", "decoder.layers.1.self_attention.linear_qkv")
    ]
    assert all(isinstance(m, LoraLinear) for m in modules)
    with torch.no_grad():
        for m in modules:
            for b in m.lora_B:
                b.zero_()
    start = worker.full_state_dict()
    out = {}
    for m, name in zip(modules, ("in_proj", "linear_qkv")):
        for j, b in enumerate(m.lora_B):
            with torch.no_grad():
                b.copy_(torch.randn(b.shape))
            moved = {k: (v - start[k]).abs().sum(-1) for k, v in worker.full_state_dict().items()}
            out[(name, j)] = {k: float((rows > 0).float().mean()) for k, rows in moved.items() if rows.any()}
            with torch.no_grad():
                b.zero_()
    return out


@pytest.fixture(scope="module")
def steps(qwen35):  # noqa: F811
    return {
        "fsdp": run_ranks(_lora_rank, 1, qwen35, "fsdp2", 1, False)[0],
        "tp1": run_ranks(_lora_rank, 1, qwen35, "megatron", 1, False)[0],
        "tp2": run_ranks(_lora_rank, 2, qwen35, "megatron", 2, False),
    }


def test_adapters_sit_on_every_hybrid_projection_and_alone_train(steps, qwen35):  # noqa: F811
    names = set(steps["fsdp"]["adapters"])
    assert set(steps["tp1"]["adapters"]) == names  # Megatron exports PEFT's names for PEFT's modules
    projections = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names}
    assert projections == set(FUSED_BY)
    for got in (steps["tp1"], *steps["tp2"]):
        assert got["trainable"] and all(".lora_" in n for n in got["trainable"])
        assert got["base_unchanged"]


def test_the_memory_estimate_counts_the_hybrids_adapters(steps, qwen35):  # noqa: F811
    """The compiler's count of one rank's adapters (gated attention, Gated DeltaNet, MLP) is what each rank trains."""
    from rlc.compiler.megatron_adapters import stage_adapters
    from rlc.compiler.model_size import model_info

    shape = model_info(qwen35).shape
    for tp, got in ((1, steps["tp1"]), (2, steps["tp2"][0])):
        count = stage_adapters(shape, LORA["rank"], LORA["target_modules"], None, "lora", shape.layers, tp)
        assert count.total == got["trainable_numel"], tp


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_megatron_lora_step_equals_fsdp2_peft(steps, layout):
    ref, got = steps["fsdp"], steps[layout]
    got = got if isinstance(got, dict) else got[0]
    for key in ("policy_loss", "kl", "entropy"):
        assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-4, abs=1e-6), key
    assert got["metrics"]["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=1e-4)
    strong = total = 0
    for name, want in ref["adapters"].items():
        have = got["adapters"][name]
        if ".lora_A." in name:  # no gradient yet (B was zero): the shared start
            torch.testing.assert_close(torch.from_numpy(have), torch.from_numpy(want), rtol=0, atol=1e-6, msg=name)
            continue
        # Adam's first step moves B by +-lr where its gradient is well above eps; where one nearly cancels out,
        # the order of the sums decides the sign, so those elements are not compared.
        clear = abs(want) > 0.999 * LR
        torch.testing.assert_close(torch.from_numpy(have[clear]), torch.from_numpy(want[clear]), rtol=0, atol=1e-5)
        strong, total = strong + int(clear.sum()), total + clear.size
    assert strong > 0.9 * total
    # the merged weights the engines load: PEFT's merge of its adapters, but for B's few sign-ambiguous elements
    assert got["merged"].keys() == ref["merged"].keys()
    for name, want in ref["merged"].items():
        diff = abs(got["merged"][name] - want) > 1e-4
        assert diff.mean() < 0.1, name
    torch.testing.assert_close(torch.from_numpy(got["logp"]), torch.from_numpy(ref["logp"]), rtol=1e-3, atol=1e-3)


def test_merged_export_is_base_plus_scaled_adapters(steps, qwen35):  # noqa: F811
    """Each exported weight is the loaded one plus alpha/rank * B @ A of its exported adapter (none: unchanged)."""
    base = _hf(qwen35).state_dict()
    got = steps["tp2"][0]
    scale = LORA["alpha"] / LORA["rank"]
    adapted = 0
    for name, w in got["merged"].items():
        a = got["adapters"].get("base_model.model." + name.removesuffix(".weight") + ".lora_A.default.weight")
        if a is None:
            assert torch.equal(torch.from_numpy(w), base[name]), name
            continue
        b = got["adapters"]["base_model.model." + name.removesuffix(".weight") + ".lora_B.default.weight"]
        want = base[name] + scale * torch.from_numpy(b) @ torch.from_numpy(a)
        torch.testing.assert_close(torch.from_numpy(w), want, rtol=1e-4, atol=1e-5, msg=name)
        adapted += 1
    assert adapted == len(got["adapters"]) // 2


def test_qwen35_moe_lora_model_is_its_merged_weights(qwen35_moe_text):  # noqa: F811
    """Qwen3.5-MoE on one rank: adapters on attention, the DeltaNet, every routed expert and the shared expert; after
    a step the Megatron model's log-probs are those of the Hugging Face model with the merged weights. As
    canonical_lora (an adapter per Hugging Face projection), this also holds each projection's rows where the fused
    layers keep them: q_proj's q and gate heads, in_proj_qkv / z / b / a per key-head group."""
    from rlc.runtime.algorithms.losses import token_log_probs
    from test_fsdp import _batch_and_noise

    (got,) = run_ranks(_lora_rank, 1, qwen35_moe_text, "megatron", 1, True, "canonical_lora")
    assert got["base_unchanged"] and all(".lora_" in n for n in got["trainable"])
    leaves = {n.split(".lora_")[0] for n in got["trainable"]}
    for expected in (
        "decoder.layers.0.self_attention.in_proj",
        "decoder.layers.0.self_attention.out_proj",
        "decoder.layers.1.self_attention.linear_qkv",
        "decoder.layers.1.self_attention.linear_proj",
        "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1",
        "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2",
        "decoder.layers.1.mlp.shared_experts.linear_fc1",
        "decoder.layers.1.mlp.shared_experts.linear_fc2",
    ):
        assert expected in leaves, expected
    # each canonical adapter moves its own projection's rows, all of them (q_proj: q and gate heads)
    for j, proj in enumerate(("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")):
        assert got["pieces"][("in_proj", j)] == {f"model.layers.0.linear_attn.{proj}.weight": 1.0}, proj
    for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        assert got["pieces"][("linear_qkv", j)] == {f"model.layers.1.self_attn.{proj}.weight": 1.0}, proj
    hf = _hf(qwen35_moe_text)
    base = {k: v.clone() for k, v in hf.state_dict().items()}
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in got["merged"].items()})
    changed = {k for k, v in hf.state_dict().items() if not torch.equal(v, base[k])}
    assert {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.0.linear_attn.in_proj_qkv.weight"} <= changed
    batch, _ = _batch_and_noise(hf.config.vocab_size)
    attn = batch.attention_mask
    with torch.no_grad():
        logits = hf.eval()(batch.input_ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    want = token_log_probs(logits[:, batch.prompt_len - 1 : -1], batch.response_ids, 1.0)
    real = batch.loss_mask.bool()
    torch.testing.assert_close(torch.from_numpy(got["logp"])[real], want[real], rtol=1e-4, atol=1e-4)
