"""Megatron LoRA synced unmerged (`lora_config.merge_lora: false`): on tp=2, the adapters the policy sends under
PEFT's Hugging Face names, put on the Hugging Face model as an engine does (PEFT, on the projections
`megatron_lora_projections` names), give the logits of the model with the merged weights the policy sends
otherwise."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")
pytest.importorskip("peft")

from conftest import run_ranks  # noqa: E402
from test_fsdp import _batch  # noqa: E402

TARGETS = ("all-linear", "q_proj,down_proj")  # every layer; qkv (all three projections) and fc2 only


def _rank(rank: int, world: int, port: int, q, model_path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.runtime.workers.megatron_lora import LoraLinear
    from rlc.spec.model import default_model

    out = {}
    for targets in TARGETS:
        spec = default_model().to_typed(
            {
                "version": 1,
                "trainer": {
                    "strategy": "megatron",
                    "policy": {
                        "model": {"lora": {"rank": 4, "alpha": 8, "target_modules": targets}},
                        "megatron_config": {"tensor_model_parallel_size": 2, "lora_config": {"merge_lora": False}},
                    },
                },
            }
        )
        worker = MegatronWorker(
            WorkerSettings("policy", model_path), spec.trainer.policy, spec.trainer.algorithm, rank, world
        )
        worker.setup("127.0.0.1", port)
        with torch.no_grad():  # adapters that change the model (B starts at zero): a column-parallel layer's B is
            # each rank's own shard, a row-parallel one's is the same on every rank
            for m in worker.chunks[0].modules():
                if isinstance(m, LoraLinear):
                    g = torch.Generator().manual_seed(rank if m.style == "column" else 7)
                    m.lora_B[0].copy_(torch.randn(m.lora_B[0].shape, generator=g) * 0.2)
        adapters = worker.full_state_dict(adapters_only=True)
        merged = worker.full_state_dict()
        halved = worker.full_state_dict("bfloat16", adapters_only=True)
        if rank == 0:
            out[targets] = {
                "adapters": {k: v.numpy() for k, v in adapters.items()},
                "merged": {k: v.numpy() for k, v in merged.items()},
                "dtypes": {str(v.dtype) for v in halved.values()},
                "lora": spec.trainer.policy.model.lora,
                "strategy": spec.trainer.strategy,
            }
    q.put((rank, out))
    worker.shutdown()


@pytest.fixture(scope="module")
def synced(tiny_model):
    return run_ranks(_rank, 2, tiny_model)[0]


@pytest.mark.parametrize("targets", TARGETS)
def test_the_engines_adapters_give_the_merged_models_logits(synced, tiny_model, targets):
    from rlc.runtime.sections import engine_lora
    from rlc.runtime.weights.lora import adapter_names, with_lora
    from transformers import AutoModelForCausalLM

    got = synced[targets]
    assert got["dtypes"] == {"torch.bfloat16"}

    class Trainer:  # the sections' reading of trainer.*
        strategy = got["strategy"]

        class policy:  # noqa: N801
            class model:  # noqa: N801
                lora = got["lora"]

    lora = engine_lora(Trainer)
    # all-linear: the dense layers' 7 projections and a Gated DeltaNet's 5 (Qwen3.5's; this model has none)
    expected_modules = {"all-linear": 12, "q_proj,down_proj": 4}[targets]
    assert len(lora.target_modules.split("|")) == expected_modules
    engine = with_lora(AutoModelForCausalLM.from_pretrained(tiny_model), lora)
    names = adapter_names(engine.state_dict())
    adapters = {k: torch.from_numpy(v) for k, v in got["adapters"].items()}
    assert sorted(adapters) == sorted(names)  # every adapter the engine has, and nothing else
    engine.load_state_dict(adapters, strict=False)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    start = {k: v.clone() for k, v in plain.state_dict().items()}
    plain.load_state_dict({k: torch.from_numpy(v) for k, v in got["merged"].items()})
    changed = {k.rsplit(".", 2)[-2] for k, v in plain.state_dict().items() if not torch.equal(v, start[k])}
    want = {"all-linear": {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}
    assert changed == want.get(targets, {"q_proj", "k_proj", "v_proj", "down_proj"})
    batch = _batch(64)
    attn = batch.attention_mask
    kwargs = dict(input_ids=batch.input_ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0))
    with torch.no_grad():
        torch.testing.assert_close(engine(**kwargs).logits, plain(**kwargs).logits, rtol=1e-4, atol=1e-4)
