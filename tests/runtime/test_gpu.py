"""The CUDA path: FSDP2 on nccl with bf16, the hf engine on the GPU, weight sync, colocated offload/backload.

Runs only where CUDA is (`pytest -m gpu`); each test writes what it measured to $RLC_GPU_REPORT when set.
"""

from __future__ import annotations

import json
import math
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
            f.write(
                json.dumps(
                    {"test": name, "device": torch.cuda.get_device_name(0), "torch": torch.__version__, **values}
                )
                + "\n"
            )


def _spec(**algorithm):
    from rlc.spec.model import default_model

    return default_model().to_typed(
        {
            "version": 1,
            "trainer": {"policy": {"optimizer_config": {"lr": 1e-4}}, "algorithm": {"use_kl_loss": False, **algorithm}},
        }
    )


@pytest.fixture(scope="module")
def worker(tiny_model):
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings, free_address

    spec = _spec()
    settings = WorkerSettings(
        "policy",
        tiny_model,
        device="cuda",
        bf16=True,
        gradient_checkpointing=True,
        micro_train_batch_size=16,
        micro_forward_batch_size=32,
        total_optimizer_steps=10,
    )
    w = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)
    w.setup("127.0.0.1", free_address()[1])
    yield w
    w.shutdown()


def test_grpo_steps_on_gsm8k_with_the_hf_engine(worker, tiny_model):
    from rlc.runtime.algorithms.advantages import grpo_advantages
    from rlc.runtime.batch import Rollout, to_batch, totals
    from rlc.runtime.driver import encode_prompt
    from rlc.runtime.envs import gym
    from rlc.runtime.envs.gsm8k import INSTRUCTION
    from rlc.runtime.generator import gym_extras
    from rlc.runtime.inference.base import Sampling
    from rlc.runtime.inference.hf import HFEngine
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    engine = HFEngine(tiny_model, dtype="bfloat16", device="cuda", tokenizer=tok)
    rows = [
        {"prompt": [{"role": "user", "content": f"{r['question']} {INSTRUCTION}"}], "answer": r["answer"]}
        for r in GSM8K_ROWS
    ]
    prompts = [encode_prompt(tok, r["prompt"]) for r in rows]
    sampling = Sampling(max_generate_length=32, temperature=1.0, top_p=0.95)
    timings, diffs = [], []
    for step in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, sampling, n=8, seed=step)
        rollouts = [
            Rollout(
                prompts[g],
                c.token_ids,
                c.logprobs,
                c.finish_reason,
                gym.make("gsm8k", None, gym_extras(rows[g], 1)).step(tok.decode(c.token_ids, skip_special_tokens=True))[
                    "reward"
                ],
                g,
            )
            for g, cs in enumerate(outs)
            for c in cs
        ]
        batch = to_batch(rollouts, tok.pad_token_id)
        batch.old_logprobs = worker.forward(batch)
        batch.advantages, _ = grpo_advantages(batch.token_rewards, batch.loss_mask, batch.group)
        metrics = worker.train_mini_batch(batch, totals(batch))
        assert metrics["grad_norm"] == metrics["grad_norm"]  # not NaN
        version = engine.update_weights(worker.full_state_dict("bfloat16"), step + 1)
        assert version == step + 1
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - t0)
        real = batch.loss_mask.bool()
        diffs.append(float((batch.old_logprobs - batch.rollout_logprobs).abs()[real].mean()))
    # bf16 engine vs bf16-compute trainer: the same tokens score alike.
    assert max(diffs) < 0.1, diffs
    _report(
        "grpo_gsm8k_hf_engine",
        {
            "steps": 4,
            "rollouts_per_step": 32,
            "step_s": [round(t, 3) for t in timings],
            "mean_abs_logprob_diff": [round(d, 5) for d in diffs],
        },
    )


def test_colocated_offload_and_backload(worker):
    from rlc.runtime.batch import Rollout, to_batch, totals

    ro = [Rollout([5, 6, 7, 8], [9, 10, 11], [-1.0] * 3, "length", float(i % 2), i // 2) for i in range(8)]
    batch = to_batch(ro, 0)
    batch.old_logprobs = worker.forward(batch)
    batch.advantages = torch.ones_like(batch.loss_mask) * torch.tensor([1.0, -1.0] * 4)[:, None]
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
    _report(
        "colocate_offload_backload",
        {
            "allocated_before_MB": round(on_gpu / 2**20, 2),
            "allocated_offloaded_MB": round(off / 2**20, 2),
            "offload_s": round(offload_s, 4),
            "backload_s": round(backload_s, 4),
        },
    )


def test_engine_sleep_and_wake_on_the_gpu(tiny_model):
    from rlc.runtime.inference.base import Sampling
    from rlc.runtime.inference.hf import HFEngine
    from transformers import AutoTokenizer

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
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.fsdp import FSDPWorker
    from test_fsdp import _batch_and_noise

    kl = {"use_kl_loss": True, "kl_loss_coef": 0.1}
    fsdp = _policy_worker(
        FSDPWorker,
        tiny_model,
        "fsdp2",
        {"optimizer_config": {"lr": 1e-3, "weight_decay": 0.0}},
        bf16=False,
        algorithm=kl,
    )
    meg = _megatron(tiny_model, {}, bf16=False, algorithm=kl)
    batch, noise = _batch_and_noise(64)
    old = fsdp.forward(batch)
    torch.testing.assert_close(
        meg.forward(batch)[batch.loss_mask.bool()], old[batch.loss_mask.bool()], rtol=1e-3, atol=1e-3
    )
    batch.old_logprobs = old + noise
    a, b = fsdp.train_mini_batch(batch, totals(batch)), meg.train_mini_batch(batch, totals(batch))
    for key in ("policy_loss", "kl", "entropy"):
        assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), key
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    # Three more steps on the same batch from the updated weights: both strategies take the same path.
    fsdp_steps, meg_steps = [a], [b]
    for _ in range(3):
        fsdp_steps.append(fsdp.train_mini_batch(batch, totals(batch)))
        meg_steps.append(meg.train_mini_batch(batch, totals(batch)))
    for x, y in zip(fsdp_steps, meg_steps):
        assert y["policy_loss"] == pytest.approx(x["policy_loss"], rel=1e-2, abs=1e-4)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-2)
    assert meg_steps[-1]["policy_loss"] < meg_steps[0]["policy_loss"]  # the same advantages again: the loss goes down
    _report(
        "megatron_vs_fsdp2",
        {
            key: {"fsdp2": [m[key] for m in fsdp_steps], "megatron": [m[key] for m in meg_steps]}
            for key in ("policy_loss", "grad_norm", "kl", "entropy")
        },
    )


def _policy_worker(cls, tiny_model, strategy: str, policy: dict, *, bf16: bool, algorithm: dict):
    """A one-rank policy worker of `cls` on the GPU, micro-batches of 4 rows (8 for forward passes)."""
    from rlc.runtime.workers.common import WorkerSettings, free_address
    from rlc.spec.model import default_model

    spec = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": strategy, "policy": policy, "algorithm": algorithm}}
    )
    settings = WorkerSettings(
        "policy",
        tiny_model,
        device="cuda",
        bf16=bf16,
        micro_train_batch_size=4,
        micro_forward_batch_size=8,
        total_optimizer_steps=16,
    )
    worker = cls(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)
    worker.setup("127.0.0.1", free_address()[1])
    return worker


def _megatron(
    tiny_model,
    strategy_config: dict,
    *,
    bf16: bool,
    lora: dict | None = None,
    lr: float = 1e-3,
    algorithm: dict | None = None,
):
    from rlc.runtime.workers.megatron import MegatronWorker

    policy = {"optimizer_config": {"lr": lr, "weight_decay": 0.0}, "megatron_config": strategy_config}
    if lora:
        policy["model"] = {"lora": lora}
    return _policy_worker(
        MegatronWorker, tiny_model, "megatron", policy, bf16=bf16, algorithm=algorithm or {"use_kl_loss": False}
    )


def _hf_logprobs(tiny_model, state: dict, batch: dict) -> torch.Tensor:
    """The batch's response log-probs under the plain Hugging Face model holding `state`, fp32 on the GPU."""
    from rlc.runtime.algorithms.losses import token_log_probs
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    lm.load_state_dict(state, strict=False)  # a tied model's state has no lm_head
    lm.to("cuda").eval()
    attn = batch.attention_mask.cuda()
    with torch.no_grad():
        logits = lm(
            input_ids=batch.input_ids.cuda(), attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)
        ).logits
    return token_log_probs(logits[:, batch.prompt_len - 1 : -1].float(), batch.response_ids.cuda(), 1.0).cpu()


def _initial_state(tiny_model) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()


def _long_batch(rows: int = 8, prompt: int = 40, response: int = 24):
    """Rows of 64 tokens whose prompts are left-padded by different amounts (as the driver pads them)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 64, (rows, prompt + response), generator=g)
    attention = torch.ones(rows, prompt + response, dtype=torch.long)
    for r in range(rows):
        attention[r, : 3 * r] = 0
    from rlc.runtime.batch import TrainBatch

    return TrainBatch(
        input_ids=ids,
        attention_mask=attention,
        response_ids=ids[:, prompt:],
        loss_mask=torch.ones(rows, response),
        rollout_logprobs=torch.zeros(rows, response),
        token_rewards=torch.zeros(rows, response),
        group=torch.arange(rows),
        prompt_len=prompt,
    )


def test_megatron_bf16_checkpoint_offload_export_and_profiler_on_the_gpu(tiny_model, tmp_path):
    """The megatron worker's CUDA lifecycle in bf16 (Float16Module, fp32 main weights in the distributed optimizer):
    a dist_checkpointing checkpoint restores the next step, offload frees the GPU and backload resumes training,
    the exported Hugging Face weights score tokens as the Megatron model does, the profiler traces CUDA kernels."""
    pytest.importorskip("megatron.core")
    from rlc.runtime.batch import totals
    from test_fsdp import _batch_and_noise

    prof = tmp_path / "prof"
    meg = _megatron(
        tiny_model,
        {"empty_cuda_cache": True, "torch_profiler_config": {"enable": True, "ranks": [0], "save_path": str(prof)}},
        bf16=True,
    )
    # Rows as long as real ones (past the 16 keys where Megatron would pick a fused softmax), left-padded: the
    # padding mask must be applied in bf16 on the GPU.
    long = _long_batch()
    long_diff = (meg.forward(long) - _hf_logprobs(tiny_model, _initial_state(tiny_model), long)).abs()[
        long.loss_mask.bool()
    ]
    assert long_diff.mean() < 0.02, long_diff.mean()
    batch, noise = _batch_and_noise(64)
    real = batch.loss_mask.bool()
    batch.old_logprobs = meg.forward(batch) + noise
    timings, metrics = [], []
    for _ in range(2):
        t0 = time.perf_counter()
        metrics.append(meg.train_mini_batch(batch, totals(batch)))
        torch.cuda.synchronize()
        timings.append(time.perf_counter() - t0)
    meg.save_checkpoint(str(tmp_path / "ckpt"))
    third = meg.train_mini_batch(batch, totals(batch))
    meg.load_checkpoint(str(tmp_path / "ckpt"))
    again = meg.train_mini_batch(batch, totals(batch))
    assert again["policy_loss"] == pytest.approx(third["policy_loss"], rel=1e-4, abs=1e-6)
    assert again["grad_norm"] == pytest.approx(third["grad_norm"], rel=1e-3)

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    meg.offload()
    offloaded = torch.cuda.memory_allocated()
    assert offloaded < before
    meg.backload()
    resumed = meg.train_mini_batch(batch, totals(batch))
    assert math.isfinite(resumed["grad_norm"]) and resumed["grad_norm"] > 0

    logp = meg.forward(batch)
    want = _hf_logprobs(tiny_model, meg.full_state_dict(), batch)
    diff = (logp[real] - want[real]).abs()
    assert diff.mean() < 0.02, diff.mean()  # bf16 forward against the exported weights in fp32

    traces = sorted(prof.glob("policy_rank0_step*.json"))
    # one per optimizer step, named by the step it made: the restored step's trace replaced the first try's
    assert [t.name for t in traces] == [f"policy_rank0_step{n}.json" for n in (1, 2, 3, 4)]
    assert '"cat": "kernel"' in traces[-1].read_text()  # CUDA kernels were traced
    _report(
        "megatron_bf16_lifecycle",
        {
            "step_s": [round(t, 3) for t in timings],
            "policy_loss": [m["policy_loss"] for m in metrics],
            "restored_step_policy_loss": [third["policy_loss"], again["policy_loss"]],
            "allocated_MB": [round(before / 2**20, 2), round(offloaded / 2**20, 2)],
            "export_mean_abs_logprob_diff": float(diff.mean()),
            "export_max_abs_logprob_diff": float(diff.max()),
            "long_rows_mean_abs_logprob_diff_vs_hf": float(long_diff.mean()),
        },
    )


def test_megatron_lora_on_the_gpu(tiny_model):
    """LoRA on Megatron's parallel layers on CUDA: only adapters train, and the merged weights sent to engines
    score tokens as the adapted model does."""
    pytest.importorskip("megatron.core")
    from rlc.runtime.batch import totals
    from test_fsdp import _batch_and_noise

    meg = _megatron(
        tiny_model, {"lora_config": {"lora_type": "lora"}}, bf16=False, lora={"rank": 4, "alpha": 8}, lr=5e-2
    )
    batch, noise = _batch_and_noise(64)
    real = batch.loss_mask.bool()
    batch.old_logprobs = meg.forward(batch) + noise
    metrics = [meg.train_mini_batch(batch, totals(batch)) for _ in range(3)]
    assert all(".lora_" in n for n, p in meg.chunks[0].named_parameters() if p.requires_grad)
    logp = meg.forward(batch)
    want = _hf_logprobs(tiny_model, meg.full_state_dict(), batch)
    torch.testing.assert_close(logp[real], want[real], rtol=1e-3, atol=1e-3)
    _report(
        "megatron_lora",
        {
            "policy_loss": [m["policy_loss"] for m in metrics],
            "max_abs_logprob_diff_vs_merged": float((logp[real] - want[real]).abs().max()),
        },
    )
