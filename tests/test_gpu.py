"""The CUDA path: FSDP2 on nccl with bf16, the hf engine on the GPU, weight sync, colocated offload/backload.

Runs only where CUDA is (`pytest -m gpu`); each test writes what it measured to $RLC_GPU_REPORT when set.
"""

from __future__ import annotations

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "7"},
    {"question": "A box holds 12 eggs. How many eggs are in 2 boxes?", "answer": "24"},
    {"question": "Sara reads 5 pages a day. How many pages does she read in 6 days?", "answer": "30"},
    {"question": "There are 20 birds and 8 fly away. How many are left?", "answer": "12"},
]


def _report(name: str, values: dict) -> None:
    path = os.environ.get("RLC_GPU_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"test": name, "device": torch.cuda.get_device_name(0), "torch": torch.__version__, **values}) + "\n")


def _spec(**algorithm):
    from rlc.spec.model import default_model

    return default_model().to_typed({"version": 1, "trainer": {
        "policy": {"optimizer_config": {"lr": 1e-4}}, "algorithm": {"use_kl_loss": False, **algorithm}}})


@pytest.fixture(scope="module")
def worker(tiny_model):
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings, free_address

    spec = _spec()
    settings = WorkerSettings("policy", tiny_model, device="cuda", bf16=True, gradient_checkpointing=True,
                              micro_train_batch_size=16, micro_forward_batch_size=32, total_optimizer_steps=10)
    w = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)
    w.setup("127.0.0.1", free_address()[1])
    yield w
    w.shutdown()


def test_grpo_steps_on_gsm8k_with_the_hf_engine(worker, tiny_model):
    from transformers import AutoTokenizer

    from rlc.runtime.algorithms.advantages import grpo_advantages
    from rlc.runtime.batch import Rollout, to_batch, totals
    from rlc.runtime.driver import encode_prompt
    from rlc.runtime.envs import make
    from rlc.runtime.envs.gsm8k import INSTRUCTION
    from rlc.runtime.inference.hf import HFEngine, Sampling

    tok = AutoTokenizer.from_pretrained(tiny_model)
    engine = HFEngine(tiny_model, dtype="bfloat16", device="cuda", tokenizer=tok)
    env = make("gsm8k")
    rows = [{"prompt": [{"role": "user", "content": f"{r['question']} {INSTRUCTION}"}], "answer": r["answer"]} for r in GSM8K_ROWS]
    prompts = [encode_prompt(tok, env.prompt(r)) for r in rows]
    sampling = Sampling(max_generate_length=32, temperature=1.0, top_p=0.95)
    timings, diffs = [], []
    for step in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sampling, n=8, seed=step)
        rollouts = [Rollout(prompts[g], c.token_ids, c.logprobs, c.finish_reason,
                            env.reward(rows[g], tok.decode(c.token_ids, skip_special_tokens=True), c.finish_reason == "stop"), g)
                    for g, cs in enumerate(outs) for c in cs]
        batch = to_batch(rollouts, tok.pad_token_id)
        batch["old_logprobs"] = worker.forward(batch)
        batch["advantages"], _ = grpo_advantages(batch["token_rewards"], batch["loss_mask"], batch["group"])
        metrics = worker.train_mini_batch(batch, totals(batch))
        assert metrics["grad_norm"] == metrics["grad_norm"]  # not NaN
        version = engine.update_weights(worker.full_state_dict("bfloat16"), step + 1)
        assert version == step + 1
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - t0)
        real = batch["loss_mask"].bool()
        diffs.append(float((batch["old_logprobs"] - batch["rollout_logprobs"]).abs()[real].mean()))
    # bf16 engine vs bf16-compute trainer: the same tokens score alike.
    assert max(diffs) < 0.1, diffs
    _report("grpo_gsm8k_hf_engine", {"steps": 4, "rollouts_per_step": 32, "step_s": [round(t, 3) for t in timings],
                                     "mean_abs_logprob_diff": [round(d, 5) for d in diffs]})


def test_colocated_offload_and_backload(worker):
    from rlc.runtime.batch import Rollout, to_batch, totals

    ro = [Rollout([5, 6, 7, 8], [9, 10, 11], [-1.0] * 3, "length", float(i % 2), i // 2) for i in range(8)]
    batch = to_batch(ro, 0)
    batch["old_logprobs"] = worker.forward(batch)
    batch["advantages"] = torch.ones_like(batch["loss_mask"]) * torch.tensor([1.0, -1.0] * 4)[:, None]
    worker.train_mini_batch(batch, totals(batch))  # optimizer state exists now
    torch.cuda.synchronize()
    on_gpu = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    worker.offload(model=True, optimizer=True)
    offload_s = time.perf_counter() - t0
    off = torch.cuda.memory_allocated()
    assert off < on_gpu
    assert all(p.device.type == "cpu" for p in worker.model.parameters())
    t0 = time.perf_counter()
    worker.backload(model=True, optimizer=True)
    backload_s = time.perf_counter() - t0
    assert all(p.device.type == "cuda" for p in worker.model.parameters())
    again = worker.train_mini_batch(batch, totals(batch))  # the optimizer still steps the same parameters
    assert again["grad_norm"] == again["grad_norm"]
    _report("colocate_offload_backload", {"allocated_before_MB": round(on_gpu / 2**20, 2), "allocated_offloaded_MB": round(off / 2**20, 2),
                                          "offload_s": round(offload_s, 4), "backload_s": round(backload_s, 4)})


def test_engine_sleep_and_wake_on_the_gpu(tiny_model):
    from transformers import AutoTokenizer

    from rlc.runtime.inference.hf import HFEngine, Sampling

    tok = AutoTokenizer.from_pretrained(tiny_model)
    engine = HFEngine(tiny_model, dtype="float32", device="cuda", tokenizer=tok)
    weights = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    prompt = [tok("copy the digit 3:").input_ids]
    before = engine.generate(prompt, Sampling(max_generate_length=6, temperature=0), n=1)
    engine.sleep(level=2)
    assert not engine.weights_on
    with pytest.raises(RuntimeError):
        engine.generate(prompt, Sampling(max_generate_length=6, temperature=0))
    engine.wake_up(["weights"])
    engine.update_weights(weights, 1)
    after = engine.generate(prompt, Sampling(max_generate_length=6, temperature=0), n=1)
    assert after[0][0].token_ids == before[0][0].token_ids


def test_megatron_loss_matches_fsdp2_on_a_fixed_batch(tiny_model):
    """strategy megatron on one GPU (tp=1, Megatron's CUDA path, no megatron_cpu): its GRPO loss and gradient norm on a
    fixed batch equal fsdp2's (fp32 on both sides), then a few more steps train."""
    pytest.importorskip("megatron.core")
    from test_fsdp import _batch

    from rlc.runtime.batch import totals
    from rlc.runtime.workers.common import WorkerSettings, free_address
    from rlc.runtime.workers.fsdp import FSDPWorker
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model

    def spec(strategy):
        return default_model().to_typed({"version": 1, "trainer": {"strategy": strategy, "policy": {
            "optimizer_config": {"lr": 1e-3, "weight_decay": 0.0}}, "algorithm": {"use_kl_loss": True, "kl_loss_coef": 0.1}}})

    settings = dict(device="cuda", micro_train_batch_size=4, micro_forward_batch_size=8, total_optimizer_steps=8)
    fsdp_spec, meg_spec = spec("fsdp2"), spec("megatron")
    fsdp = FSDPWorker(WorkerSettings("policy", tiny_model, **settings), fsdp_spec.trainer.policy, fsdp_spec.trainer.algorithm, 0, 1)
    fsdp.setup("127.0.0.1", free_address()[1])
    meg = MegatronWorker(WorkerSettings("policy", tiny_model, **settings), meg_spec.trainer.policy, meg_spec.trainer.algorithm, 0, 1)
    meg.setup("127.0.0.1", free_address()[1])
    batch = _batch(64)
    old = fsdp.forward(batch)
    torch.testing.assert_close(meg.forward(batch)[batch["loss_mask"].bool()], old[batch["loss_mask"].bool()], rtol=1e-3, atol=1e-3)
    batch["old_logprobs"] = old + batch["noise"]
    a, b = fsdp.train_mini_batch(batch, totals(batch)), meg.train_mini_batch(batch, totals(batch))
    for key in ("policy_loss", "kl", "entropy"):
        assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), key
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    losses = [b["policy_loss"]]
    for _ in range(3):
        losses.append(meg.train_mini_batch(batch, totals(batch))["policy_loss"])
    assert losses[-1] < losses[0]  # the same advantages again and again: the policy loss goes down
    _report("megatron_vs_fsdp2", {"fsdp2_policy_loss": a["policy_loss"], "megatron_policy_loss": b["policy_loss"],
                                  "fsdp2_grad_norm": a["grad_norm"], "megatron_grad_norm": b["grad_norm"],
                                  "megatron_losses": losses})
