"""Fake-INT4 QAT (`model.fake_int4_qat`): the quantized values against SkyRL 0.4's own function and a per-group
formula written out here, the straight-through gradient, and the forward hook on a Megatron-Core MoE model's
routed experts (the same model with its expert weights replaced by their quantized values gives the same logits
and gradients)."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import run_ranks  # noqa: E402
from rlc.core.job import FakeInt4Qat  # noqa: E402
from rlc.runtime.workers.qat import fake_int4, fake_int4_values, install  # noqa: E402

CONVENTIONS = [(7.5, -8.0), (7.0, -7.0)]  # llm-compressor RTN; Kimi / Miles


def _skyrls():
    """SkyRL 0.4's fake_int4_qat module, loaded from its file (its package's __init__ needs more than torch)."""
    spec = importlib.util.find_spec("skyrl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("skyrl is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / (
        "backends/skyrl_train/workers/megatron/quantization/fake_int4_qat.py"
    )
    if not path.exists():
        pytest.skip(f"{path} is not there")
    loaded = importlib.util.spec_from_file_location("skyrl_fake_int4_qat", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def _by_hand(w: torch.Tensor, group: int, divisor: float, q_min: float) -> torch.Tensor:
    """Group by group, element by element: scale = dtype(float32(amax) / divisor), code = clamp(round(w / scale))."""
    out = torch.zeros_like(w)
    for r in range(w.shape[0]):
        for start in range(0, w.shape[1], group):
            block = w[r, start : start + group]
            amax = max(abs(float(x)) for x in block.float())
            scale = torch.tensor(amax, dtype=torch.float32).div(divisor).to(w.dtype)
            for j, x in enumerate(block):
                if float(scale) == 0.0:
                    continue
                code = torch.clamp(torch.round(x / scale), q_min, 7.0)
                out[r, start + j] = code * scale
    return out


def _weight(rows, cols, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(rows, cols, generator=g) * 0.05).to(dtype)
    w[0, :8] = 0  # an all-zero group (group size 8)
    w[1, 3] = 0.4  # an outlier: the rest of its group codes to few levels
    return w


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("divisor", "q_min"), CONVENTIONS)
@pytest.mark.parametrize(("cols", "group"), [(64, 32), (40, 8), (45, 8)])
def test_values_are_skyrls_and_the_per_group_formula(dtype, divisor, q_min, cols, group):
    w = _weight(6, cols, dtype)
    ours = fake_int4_values(w, group, divisor, q_min)
    assert ours.dtype == dtype and ours.shape == w.shape
    assert torch.equal(ours, _by_hand(w, group, divisor, q_min))
    theirs = _skyrls().fake_int4_quantize_ste(w, group, divisor, q_min)
    assert torch.equal(ours, theirs)
    # on the grid: each group's values are integer multiples of its scale, at most 7 (and -q_min) of them
    assert torch.equal(ours[0, :8], torch.zeros(8, dtype=dtype))
    assert not torch.equal(ours, w)


def test_the_gradient_passes_straight_through():
    w = _weight(4, 64, torch.float32).requires_grad_(True)
    upstream = torch.randn(4, 64)
    (fake_int4(w, 32, 7.5, -8) * upstream).sum().backward()
    assert torch.equal(w.grad, upstream)
    master = torch.zeros(4, 64)
    w2 = _weight(4, 64, torch.float32).requires_grad_(True)
    w2.main_grad = master
    assert fake_int4(w2, 32, 7.5, -8).main_grad is master  # Megatron's fused accumulation finds the buffer


def _megatron_rank(rank: int, world: int, port: int, q) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer import TransformerConfig
    from rlc.runtime.workers import megatron_cpu

    megatron_cpu.enable()
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):  # Megatron-Core 0.16 without Transformer Engine leaves it unset
        moe_utils.te_general_gemm = None
    with megatron_cpu.active():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        ps.initialize_model_parallel()
        model_parallel_cuda_manual_seed(0)
        config = TransformerConfig(
            num_layers=2,
            hidden_size=64,
            ffn_hidden_size=96,
            num_attention_heads=4,
            num_moe_experts=4,
            moe_router_topk=2,
            moe_ffn_hidden_size=64,
            moe_token_dispatcher_type="allgather",  # alltoall makes a CUDA stream
            use_cpu_initialization=True,
            params_dtype=torch.float32,
            add_bias_linear=False,
            gated_linear_unit=True,
            init_method_std=0.05,
            hidden_dropout=0.0,
            attention_dropout=0.0,
        )
        spec = get_gpt_layer_local_spec(num_experts=4)

        def build():
            built = GPTModel(config, spec, vocab_size=50, max_sequence_length=16)
            if models:
                with torch.no_grad():
                    for p, master in zip(built.parameters(), models[0].parameters()):
                        p.copy_(master)
            models.append(built)
            return built

        models: list = []
        model, reference, plain = build(), build(), build()

        found = install([model], FakeInt4Qat(16, 7.5, -8.0))
        experts = {n for n, p in model.named_parameters() if ".experts." in n}
        with torch.no_grad():
            for name, p in reference.named_parameters():
                if name in experts:
                    p.copy_(fake_int4_values(p, 16, 7.5, -8.0))
        ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
        position = torch.arange(12)[None].expand(2, -1)
        out = {}
        for key, m in (("hooked", model), ("quantized", reference)):
            logits = m(ids, position, None)
            (logits.float() ** 2).mean().backward()
            out[key] = (logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        out["unquantized"] = plain(ids, position, None).detach()
        out["masters_unchanged"] = all(
            torch.equal(p, q) for (n, p), q in zip(model.named_parameters(), plain.parameters())
        )
        q.put((rank, (found, sorted(experts), out)))
    dist.destroy_process_group()


def test_the_hook_quantizes_a_megatron_moe_models_routed_experts_only():
    pytest.importorskip("megatron.core")
    found, experts, out = run_ranks(_megatron_rank, 1)[0]
    assert found == 2 * 4 * 2  # layers x experts x (fc1, fc2)
    assert len(experts) == found
    hooked, hooked_grads = out["hooked"]
    quantized, quantized_grads = out["quantized"]
    torch.testing.assert_close(hooked, quantized, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(hooked, out["unquantized"], rtol=1e-4, atol=1e-4)  # the quantization shows
    assert out["masters_unchanged"]  # the masters train; the quantized copies are made in each forward
    assert hooked_grads.keys() == quantized_grads.keys() and set(experts) <= hooked_grads.keys()
    for name in hooked_grads:  # straight through: the gradient at the quantized weights, for every parameter
        torch.testing.assert_close(hooked_grads[name], quantized_grads[name], rtol=1e-5, atol=1e-7)
    assert math.isfinite(float(hooked.abs().sum()))


def test_a_model_without_experts_is_refused():
    with pytest.raises(RuntimeError, match="has none"):
        install([torch.nn.Sequential(torch.nn.Linear(4, 4))], FakeInt4Qat(32, 7.5, -8.0))


def _masters_rank(rank: int, world: int, port: int, q, model_path: str, masters: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model

    spec = default_model().to_typed({"version": 1, "trainer": {"strategy": "megatron"}})
    settings = WorkerSettings("policy", model_path, weights_path=masters)
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    q.put((rank, {k: v.numpy() for k, v in worker.full_state_dict().items()}))
    worker.shutdown()


def test_the_megatron_worker_loads_its_weights_from_bf16_base_path(tiny_model, tmp_path):
    """model.path names what the engines serve; fake_int4_qat.bf16_base_path the checkpoint the trainer loads."""
    pytest.importorskip("megatron.core")
    from transformers import AutoModelForCausalLM

    masters = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        for p in masters.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.01)
    masters.save_pretrained(tmp_path)
    loaded = run_ranks(_masters_rank, 1, tiny_model, str(tmp_path))[0]
    served = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    for name, value in masters.state_dict().items():
        if name in loaded:
            torch.testing.assert_close(torch.from_numpy(loaded[name]), value, rtol=0, atol=1e-6)
            assert not torch.equal(torch.from_numpy(loaded[name]), served[name])
    assert len(loaded) > 10
