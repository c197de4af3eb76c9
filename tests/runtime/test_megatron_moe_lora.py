"""LoRA on a mixture-of-experts model under the megatron strategy (AReaL's gsm8k_grpo_megatron_lora_moe): adapters on
attention and on every routed expert's linear_fc1 / linear_fc2, the base frozen, trained on one rank and on two
expert-parallel ranks (each expert's adapters with their expert), synced and exported merged.
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_megatron_moe import EP2, moe_model  # noqa: E402, F401  (moe_model: the tiny Qwen3-MoE fixture)

LR = 5e-2
LORA = {"rank": 4, "alpha": 8, "target_modules": "linear_qkv,linear_proj,linear_fc1,linear_fc2"}


def _lora_moe_rank(rank: int, world: int, port: int, q, model_path: str, out: str, mc: dict) -> None:
    """One GRPO step with LoRA; this rank's adapters (by global Megatron name), whether the base weights stayed as
    loaded, and rank 0's merged Hugging Face weights to `out`."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers import megatron_experts as mx
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.runtime.workers.megatron_lora import LoraLinear
    from rlc.spec.model import default_model
    from test_fsdp import _batch_and_noise
    from test_megatron import ALGORITHM, _old_logprobs

    policy = {"optimizer_config": {"lr": LR}, "model": {"lora": LORA}, "megatron_config": mc}
    spec = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": "megatron", "policy": policy, "algorithm": ALGORITHM}}
    )
    settings = WorkerSettings("policy", model_path, micro_train_batch_size=2, micro_forward_batch_size=3)
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    layout = worker.layout()
    batch, noise = _batch_and_noise(transformers.AutoConfig.from_pretrained(model_path).vocab_size)
    mine = shards(batch, layout["dp_size"])[layout["dp_rank"]]
    mine_noise = noise.chunk(layout["dp_size"])[layout["dp_rank"]]
    chunk = worker.chunks[0]
    adapted = {n: m for n, m in chunk.named_modules() if isinstance(m, LoraLinear)}
    bases = {n: m.base.weight.detach().clone() for n, m in adapted.items()}
    trainable = sorted(n for n, p in chunk.named_parameters() if p.requires_grad)
    place = worker._placement()["experts"]
    first = place.ep_rank * (worker.arch.experts.num_experts // place.ep_size)  # the rank's first expert
    with torch.no_grad():  # A's random start drawn per adapter, not from the rank's RNG (which the layout moves)
        for n, m in adapted.items():
            seed = zlib.crc32(mx.global_expert_name(f"{n}.weight", first).encode())
            m.lora_A[0].copy_(torch.randn(m.lora_A[0].shape, generator=torch.Generator().manual_seed(seed)) * 0.1)
    old = _old_logprobs(worker, mine, world)
    metrics = worker.train_mini_batch(dataclasses.replace(mine, old_logprobs=old + mine_noise), totals(batch))
    full = worker.full_state_dict()
    adapters = {
        mx.global_expert_name(f"{n}.weight", first): (m.lora_A[0].detach().numpy(), m.lora_B[0].detach().numpy())
        for n, m in adapted.items()
    }
    result = {
        "metrics": metrics,
        "trainable": trainable,
        "adapters": adapters,
        "base_unchanged": all(torch.equal(m.base.weight, bases[n]) for n, m in adapted.items()),
    }
    if rank == 0:
        torch.save(full, out)
    q.put((rank, result))  # numpy: a tensor would be shared memory that dies with this process
    worker.shutdown()


@pytest.fixture(scope="module")
def lora_moe_runs(moe_model, tmp_path_factory):  # noqa: F811
    pytest.importorskip("megatron.core")
    from conftest import run_ranks

    d = tmp_path_factory.mktemp("megatron-moe-lora")
    return {
        "one": run_ranks(_lora_moe_rank, 1, moe_model, str(d / "one.pt"), {}),
        "ep2": run_ranks(_lora_moe_rank, 2, moe_model, str(d / "ep2.pt"), EP2),
    }, d


def test_adapters_sit_on_attention_and_every_expert_and_alone_train(lora_moe_runs, moe_model):  # noqa: F811
    by_name, _ = lora_moe_runs
    cfg = transformers.AutoConfig.from_pretrained(moe_model)
    for layout, ranks in by_name.items():
        names = {n for r in ranks for n in r["adapters"]}
        for layer in range(cfg.num_hidden_layers):
            head = f"decoder.layers.{layer}."
            assert {head + "self_attention.linear_qkv.weight", head + "self_attention.linear_proj.weight"} <= names
            for e in range(cfg.num_experts):
                for fc in (1, 2):
                    assert f"{head}mlp.experts.local_experts.{e}.linear_fc{fc}.weight" in names, (layout, layer, e)
        for r in ranks:
            assert r["trainable"] and all(".lora_" in n for n in r["trainable"]), layout
            assert r["base_unchanged"], layout
    # each expert-parallel rank holds its two experts' adapters, not the others'
    local = [{n for n in r["adapters"] if ".local_experts." in n} for r in by_name["ep2"]]
    assert len(local[0]) == len(local[1]) == cfg.num_hidden_layers * 2 * 2 and not local[0] & local[1]


def test_expert_parallel_step_equals_one_rank(lora_moe_runs):
    by_name, d = lora_moe_runs
    one, ep2 = by_name["one"][0], by_name["ep2"]
    # each data-parallel rank reports its share of the loss; the gradient norm is the whole step's
    assert sum(r["metrics"]["policy_loss"] for r in ep2) == pytest.approx(one["metrics"]["policy_loss"], rel=1e-4)
    assert ep2[0]["metrics"]["grad_norm"] == pytest.approx(one["metrics"]["grad_norm"], rel=1e-4)
    strong = total = 0
    for r in ep2:
        for name, (a, b) in r["adapters"].items():
            want_a, want_b = one["adapters"][name]
            torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(want_a), rtol=1e-4, atol=1e-5)
            # Adam's first step moves B by +-lr where its gradient is well above eps; where a gradient nearly
            # cancels out the order the ranks sum in decides the sign, so those elements are not compared.
            clear = abs(want_b) > 0.999 * LR
            torch.testing.assert_close(torch.from_numpy(b[clear]), torch.from_numpy(want_b[clear]), rtol=0, atol=1e-5)
            strong, total = strong + int(clear.sum()), total + clear.size
    assert strong > 0.9 * total
    merged_one, merged_ep2 = torch.load(d / "one.pt"), torch.load(d / "ep2.pt")
    assert merged_one.keys() == merged_ep2.keys()
    for name, t in merged_one.items():  # B's few sign-ambiguous elements move a merged weight by at most ~2 lr|A|
        assert (merged_ep2[name] - t).abs().gt(1e-4).float().mean() < 0.1, name


def test_exported_experts_are_base_plus_scaled_adapters(lora_moe_runs, moe_model):  # noqa: F811
    """Transformers' fused expert tensors of the export are the loaded ones plus alpha/rank * B @ A, per expert."""
    by_name, d = lora_moe_runs
    base = transformers.AutoModelForCausalLM.from_pretrained(moe_model).state_dict()
    merged = torch.load(d / "ep2.pt")
    adapters = {n: ab for r in by_name["ep2"] for n, ab in r["adapters"].items()}
    scale = LORA["alpha"] / LORA["rank"]
    cfg = transformers.AutoConfig.from_pretrained(moe_model)
    for layer in range(cfg.num_hidden_layers):
        gate_up, down = f"model.layers.{layer}.mlp.experts.gate_up_proj", f"model.layers.{layer}.mlp.experts.down_proj"
        assert not torch.equal(merged[gate_up], base[gate_up]) and not torch.equal(merged[down], base[down])
        for e in range(cfg.num_experts):
            for fc, hf in ((1, gate_up), (2, down)):
                a, b = adapters[f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc{fc}.weight"]
                delta = scale * torch.from_numpy(b) @ torch.from_numpy(a)  # Megatron's [out, in]
                want = base[hf][e] + (delta if base[hf][e].shape == delta.shape else delta.T)
                torch.testing.assert_close(merged[hf][e], want, rtol=1e-4, atol=1e-5)
