"""Megatron LoRA on a mixture-of-experts model synced unmerged (`lora_config.merge_lora: false`): the adapters the
policy sends (attention's, the shared expert's and every routed expert's, gathered over the expert-parallel ranks),
put on the Hugging Face model as the hf engine does (PEFT, each routed expert's adapters on the fused expert
parameters), give the logits of the model with the merged weights the policy sends otherwise. On a tiny Qwen3-MoE
over two expert-parallel ranks and a tiny Qwen3.5-MoE on one."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytest.importorskip("peft")

from conftest import run_ranks  # noqa: E402
from test_megatron_moe import moe_model  # noqa: E402, F401 (the tiny Qwen3-MoE fixture)
from test_megatron_qwen35 import _hf, qwen35_moe_text  # noqa: E402, F401 (the tiny Qwen3.5-MoE fixture)

LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}


def _rank(rank: int, world: int, port: int, q, model_path: str, mc: dict) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.runtime.workers.megatron_lora import LoraLinear
    from rlc.spec.model import default_model

    megatron = {"lora_config": {"merge_lora": False}, **mc}
    spec = default_model().to_typed(
        {
            "version": 1,
            "trainer": {"strategy": "megatron", "policy": {"model": {"lora": LORA}, "megatron_config": megatron}},
        }
    )
    worker = MegatronWorker(
        WorkerSettings("policy", model_path), spec.trainer.policy, spec.trainer.algorithm, rank, world
    )
    worker.setup("127.0.0.1", port)
    with torch.no_grad():  # adapters that change the model (B starts at zero), each expert's its own
        for n, m in worker.chunks[0].named_modules():
            if isinstance(m, LoraLinear):
                g = torch.Generator().manual_seed(rank * 1000 + len(n) * 7 + sum(map(ord, n)))
                m.lora_B[0].copy_(torch.randn(m.lora_B[0].shape, generator=g) * 0.3)
    adapters = worker.full_state_dict(adapters_only=True)
    merged = worker.full_state_dict()
    out = None
    if rank == 0:
        out = {
            "adapters": {k: v.numpy() for k, v in adapters.items()},
            "merged": {k: v.numpy() for k, v in merged.items()},
            "lora": spec.trainer.policy.model.lora,
            "strategy": spec.trainer.strategy,
        }
    q.put((rank, out))
    worker.shutdown()


def _engine_equals_merged(got: dict, base: torch.nn.Module, fresh: torch.nn.Module) -> None:
    """PEFT on `base` with the synced adapters (the hf engine's adapters) against `fresh` given the merged weights."""
    from rlc.runtime.sections import engine_lora
    from rlc.runtime.weights.lora import adapter_names, with_lora
    from test_fsdp import _batch

    class Trainer:  # the sections' reading of trainer.*
        strategy = got["strategy"]

        class policy:  # noqa: N801
            class model:  # noqa: N801
                lora = got["lora"]

    engine = with_lora(base, engine_lora(Trainer))
    adapters = {k: torch.from_numpy(v) for k, v in got["adapters"].items()}
    assert sorted(adapters) == sorted(adapter_names(engine.state_dict()))  # every adapter the engine has, no other
    assert any(".mlp.experts." in k for k in adapters)
    engine.load_state_dict(adapters, strict=False)
    start = {k: v.clone() for k, v in fresh.state_dict().items()}
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in got["merged"].items()}, strict=False)
    changed = {k for k, v in fresh.state_dict().items() if not torch.equal(v, start[k])}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in changed)
    assert any(k.endswith("mlp.experts.down_proj") for k in changed)
    batch = _batch(64)
    attn = batch.attention_mask
    kwargs = dict(input_ids=batch.input_ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0))
    with torch.no_grad():
        torch.testing.assert_close(engine.eval()(**kwargs).logits, fresh.eval()(**kwargs).logits, rtol=1e-4, atol=1e-4)


def _vllm_layout_is_base_plus_adapters(got: dict, base: dict) -> None:
    """The adapter directory the vLLM engine writes: each expert's gate_proj / up_proj / down_proj adapters, with the
    base expert weights, give the merged export's experts (base + alpha / r * B @ A)."""
    from rlc.runtime.sections import engine_lora
    from rlc.runtime.weights.lora import per_expert

    class Trainer:
        strategy = got["strategy"]

        class policy:  # noqa: N801
            class model:  # noqa: N801
                lora = got["lora"]

    lora = engine_lora(Trainer)
    split = per_expert({k: torch.from_numpy(v) for k, v in got["adapters"].items()}, lora.target_parameters, lora.rank)
    scale = lora.alpha / lora.rank
    checked = 0
    for name, merged in got["merged"].items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        module = "base_model.model." + name.rpartition(".")[0]
        for e in range(merged.shape[0]):
            projs = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
            delta = torch.cat(
                [
                    split[f"{module}.{e}.{p}.lora_B.default.weight"] @ split[f"{module}.{e}.{p}.lora_A.default.weight"]
                    for p in projs
                ]
            )
            torch.testing.assert_close(base[name][e] + scale * delta, torch.from_numpy(merged[e]), rtol=1e-5, atol=1e-6)
            checked += 1
    assert checked == 2 * 2 * 4  # layers x fused parameters x experts
    assert not any(".experts.lora_" in k or ".base_layer." in k for k in split)


def test_qwen3_moe_adapters_over_two_expert_ranks_give_the_merged_models_logits(moe_model):  # noqa: F811
    got = run_ranks(_rank, 2, moe_model, {"expert_model_parallel_size": 2})[0]
    load = transformers.AutoModelForCausalLM.from_pretrained
    base = load(moe_model, dtype=torch.float32)
    _vllm_layout_is_base_plus_adapters(got, {k: v.clone() for k, v in base.state_dict().items()})
    _engine_equals_merged(got, base, load(moe_model, dtype=torch.float32))


def test_qwen35_moe_adapters_give_the_merged_models_logits(qwen35_moe_text):  # noqa: F811
    (got,) = run_ranks(_rank, 1, qwen35_moe_text, {})
    assert any(".shared_expert." in k for k in got["adapters"])
    _engine_equals_merged(got, _hf(qwen35_moe_text), _hf(qwen35_moe_text))
