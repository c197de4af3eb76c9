"""The critic under Megatron-Core (strategy `megatron`) on the CPU, through `megatron_cpu`.

Two value-loss steps on the same rows under tensor, pipeline and context parallelism give
fsdp2's critic's losses, gradient norms, values, GAE advantages and updated weights; a checkpoint restores the step;
the Hugging Face export is fsdp2's critic's `critic.pt`.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from conftest import run_ranks  # noqa: E402
from test_megatron import _old_logprobs as _shared  # noqa: E402
from test_ulysses import _batch  # noqa: E402

LR = 1e-2
OPTIMIZER = {"lr": LR, "weight_decay": 0.0}  # Megatron decays no norms or biases, fsdp2's AdamW decays all: none


def _spec(strategy: str, tp: int, pp: int, cp: int):
    from rlc.spec.model import default_model

    critic: dict = {"optimizer_config": OPTIMIZER}
    if strategy == "megatron":
        critic["megatron_config"] = {
            "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": pp,
            "context_parallel_size": cp,
        }
    return default_model().to_typed({"version": 1, "trainer": {"strategy": strategy, "critic": critic}})


def _rank(rank: int, world: int, port: int, q, model_path: str, out: str, strategy: str, tp: int, pp: int, cp: int):
    """Step 1 (the head starts at zero: it alone moves), the values, step 2 against those values (the backbone moves
    too). With `out` + ".ckpt" (one rank): a checkpoint after step 1, step 2 again after loading it, and an export."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.common import WorkerSettings

    if strategy == "megatron":
        from rlc.runtime.workers.megatron_critic import MegatronCriticWorker as Worker
    else:
        from rlc.runtime.workers.fsdp import FSDPWorker as Worker
    spec = _spec(strategy, tp, pp, cp)
    settings = WorkerSettings("critic", model_path, micro_train_batch_size=2, micro_forward_batch_size=3)
    worker = Worker(settings, spec.trainer.critic, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    layout = worker.layout()
    from transformers import AutoConfig

    batch = _batch(AutoConfig.from_pretrained(model_path).vocab_size)
    mine = shards(batch, layout["dp_size"])[layout["dp_rank"]]
    saving = strategy == "megatron" and world == 1
    result: dict = {"layout": layout, "first": worker.train_mini_batch(mine, totals(batch))}
    if strategy == "megatron":  # this rank's weights, for the memory estimate
        result["params"] = sum(p.numel() for m in worker.chunks for p in m.parameters())
    if saving:
        worker.save_checkpoint(out + ".ckpt")
    values = _shared(worker, mine, world)
    result["values"] = values
    # Old values off the current ones, so that the value clip takes part.
    noise = 0.3 * torch.sin(torch.arange(values.numel(), dtype=torch.float32)).view(values.shape)
    second = dataclasses.replace(mine, old_values=values + noise)
    result["second"] = worker.train_mini_batch(second, totals(batch))
    full = worker.full_state_dict()
    if saving:
        worker.load_checkpoint(out + ".ckpt")
        result["again"] = worker.train_mini_batch(second, totals(batch))
        worker.export_hf(out + ".export", model_path)
    if rank == 0:
        torch.save(full, out)
    q.put((rank, result))
    worker.shutdown()


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("megatron_critic")
    layouts = {"fsdp": ("fsdp2", 1, 1, 1, 1), "one": ("megatron", 1, 1, 1, 1), "tp2": ("megatron", 2, 2, 1, 1)}
    layouts.update(pp2=("megatron", 2, 1, 2, 1), cp2=("megatron", 2, 1, 1, 2))
    return {
        name: run_ranks(_rank, world, tiny_model, str(d / name), strategy, tp, pp, cp)
        for name, (strategy, world, tp, pp, cp) in layouts.items()
    }, d


def _collected(results: list[dict]) -> dict:
    """What the driver takes from a run: the collecting ranks' results (one data-parallel group here)."""
    got = [r for r in results if r["layout"]["collect"]]
    assert len(got) == 1
    return got[0]


@pytest.mark.parametrize("layout", ["one", "tp2", "pp2", "cp2"])
def test_megatron_critic_matches_fsdp2(runs, layout, tiny_model):
    from rlc.runtime.algorithms.advantages import gae_advantages

    by_name, d = runs
    ref, got = by_name["fsdp"][0], _collected(by_name[layout])
    for step in ("first", "second"):
        for key in ("critic_loss", "grad_norm"):
            assert got[step][key] == pytest.approx(ref[step][key], rel=1e-4, abs=1e-7), (step, key)
    batch = _batch(64)
    real = batch.loss_mask.bool()
    assert ref["values"][real].abs().min() > 0  # the first step made the values depend on the rows
    torch.testing.assert_close(got["values"][real], ref["values"][real], rtol=1e-4, atol=1e-5)
    rewards = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1))
    advantages, returns = gae_advantages(rewards, got["values"], batch.loss_mask, gamma=1.0, lambd=0.95)
    want = gae_advantages(rewards, ref["values"], batch.loss_mask, gamma=1.0, lambd=0.95)
    torch.testing.assert_close(advantages, want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(returns, want[1], rtol=1e-4, atol=1e-5)
    w_ref, w = torch.load(d / "fsdp"), torch.load(d / layout)
    assert w.keys() == w_ref.keys()
    for name in w_ref:
        # Two Adam steps of +-lr where a gradient is far above eps; where one nearly cancels out (|g| ~ eps) the
        # order the ranks sum in decides its sign (see test_megatron.py), so those elements may differ by 2 lr.
        close = (w[name] - w_ref[name]).abs() < 1e-4
        assert close.float().mean() > 0.95, name
        assert ((w[name] - w_ref[name]).abs() <= 4 * LR + 1e-5).all(), name


def test_megatron_critic_checkpoint_restores_the_step(runs):
    by_name, _ = runs
    one = by_name["one"][0]
    assert one["second"]["critic_loss"] != one["first"]["critic_loss"]
    for key in ("critic_loss", "grad_norm"):
        assert one["again"][key] == pytest.approx(one["second"][key], rel=1e-6, abs=1e-9), key


def test_megatron_critic_export_loads_as_fsdp2s_value_model(runs, tiny_model):
    """`critic.pt` is fsdp2's critic's: `ValueModel` loads it whole; it holds the weights of the restored step."""
    from rlc.runtime.workers.fsdp import ValueModel
    from transformers import AutoModelForCausalLM

    by_name, d = runs
    state = torch.load(str(d / "one") + ".export/critic.pt")
    model = ValueModel(AutoModelForCausalLM.from_pretrained(tiny_model), "value_head")
    model.load_state_dict(state)  # strict: every key, none extra
    # The export follows the checkpoint's second step, as the weights saved after the first run's second step.
    saved = torch.load(d / "one")
    for name, tensor in saved.items():
        torch.testing.assert_close(state[name], tensor, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("layout", ["one", "tp2", "pp2"])
def test_the_memory_estimate_counts_the_megatron_critics_weights(runs, tiny_model, layout):
    """The estimate's weights of a Megatron critic are its largest rank's: the decoder and one embedding (no vocabulary
    head), to within the value head it leaves out and the norms every tensor rank holds whole (it splits them)."""
    from rlc.compiler.memory import megatron_cost
    from rlc.compiler.model_size import model_info

    by_name, _ = runs
    tp, pp = {"one": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}[layout]
    spec = _spec("megatron", tp, pp, 1)
    shape = model_info(tiny_model).shape
    estimated = megatron_cost(spec, "critic", shape, tp * pp).state["weights"] // (2 if spec.trainer.bf16 else 4)
    largest = max(r["params"] for r in by_name[layout])
    norms = (2 * shape.layers + 1) * shape.hidden
    assert largest - norms - shape.hidden - 1 <= estimated <= largest
