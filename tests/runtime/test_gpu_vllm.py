"""The vllm engine on CUDA, in this process and without Ray: rlc's `VLLMEngine` with the compiler's arguments for a
colocated one-GPU job (sleep mode on, weights by CUDA IPC), and an FSDP2 policy rank (bf16, nccl) on the same GPU.

It is what kit B proves on a lent H100 (docs/gpu.md): sampling as the spec says, the engine's log-probs against the
trainer's on the same tokens, sleep and wake at levels 1 and 2 (GPU memory released, the same greedy output after),
a weight update over CUDA IPC into the sleeping engine in the colocation state machine's order (SkyRL's: weights
woken, loaded bucket by bucket, then the KV cache), log-probs that follow the new weights, and rlc's engine's
tokens/s against vLLM's own `LLM.generate` on the same prompts. Each test writes what it measured to
$RLC_GPU_REPORT. vLLM's engine core runs in its own process (VLLM_ENABLE_V1_MULTIPROCESSING on), as the driver's
Ray actor is one apart from the trainer: a CUDA IPC handle cannot be opened in the process that made it.
Skipped without CUDA (and vLLM); `RLC_GPU_VLLM_ATTENTION=TRITON_ATTN` picks vLLM's attention backend.
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_gpu import _report  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TEMPERATURE = 1.0
MODEL = "rlc:small"  # head size 64 (FlashAttention 3 and Triton attention take it), ~30M parameters
IPC_GB = 0.002  # buckets of 2 MiB: the ~60 MB of bf16 weights travel in tens of them
# bf16 in both (vLLM's kernels against torch's): the bound test_gpu.py holds the hf engine to.
LOGPROB_TOLERANCE = 0.1
PROMPTS = ["copy the digit 3:", "copy the digit 7:", "what is 2 plus 5?", "Question: how many apples"]


def _spec():
    from rlc.spec.model import default_model

    init = {"attention_backend": os.environ["RLC_GPU_VLLM_ATTENTION"]} if "RLC_GPU_VLLM_ATTENTION" in os.environ else {}
    return default_model().to_typed(
        {
            "version": 1,
            "cluster": {"accelerator": "H100", "gpus_per_node": 1},
            "trainer": {
                "policy": {"model": {"path": MODEL}},
                "placement": {"colocate_all": True},
                "algorithm": {"temperature": TEMPERATURE},
                "max_prompt_length": 64,
                "use_sample_packing": False,  # padded micro-batches: no flash-attn package on the device
                "micro_forward_batch_size_per_gpu": 16,
            },
            "generator": {
                "inference_engine": {
                    "backend": "vllm",
                    "model_dtype": "bfloat16",
                    "gpu_memory_utilization": 0.3,
                    "vllm_v1_disable_multiproc": False,
                    "weight_transfer_threshold_cuda_ipc_GB": IPC_GB,
                    "engine_init_kwargs": init,
                },
                "n_samples_per_prompt": 4,
                "sampling_params": {"max_generate_length": 32, "temperature": TEMPERATURE},
            },
        }
    )


def _sampling(**fields):
    from rlc.compiler.decide import sampling

    spec = _spec()
    params = dataclasses.replace(spec.generator.sampling_params, **fields)
    return sampling(params)


@pytest.fixture(scope="module")
def model(rlc_cache):
    from rlc.runtime.models import local_path
    from transformers import AutoTokenizer

    path = local_path(MODEL)
    return path, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def trainer(model):
    """Policy rank 0 of 1 on the GPU (FSDP2, bf16, nccl), built before the engine as the driver builds them."""
    from rlc.compiler.decide import worker_settings
    from rlc.runtime.workers.fsdp import FSDPWorker, free_address

    spec = _spec()
    settings = dataclasses.replace(worker_settings(spec, "policy", "cuda", None), model_path=model[0])
    worker = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)
    worker.setup("127.0.0.1", free_address()[1])
    yield worker
    worker.shutdown()


@pytest.fixture(scope="module")
def engine(model, trainer):
    """The engine as the driver builds it, with the compiler's arguments for this job."""
    pytest.importorskip("vllm")
    from rlc.compiler.decide import vllm_args
    from rlc.runtime.inference.vllm import VLLMEngine, engine_kwargs

    path, tok = model
    args = vllm_args(_spec(), "cuda", [0])
    assert args.enable_sleep_mode and args.env == {}
    t0 = time.perf_counter()
    built = VLLMEngine(
        path,
        dtype=args.dtype,
        device="cuda",
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        engine_args=engine_kwargs(args, model=path),
        env=args.env,
    )
    _report("vllm_engine_start", {"start_s": round(time.perf_counter() - t0, 2), "engine_args": _plain(args)})
    return built


def _plain(args) -> dict:
    return {k: v for k, v in dataclasses.asdict(args).items() if isinstance(v, (int, float, str, bool, type(None)))}


@pytest.fixture(scope="module")
def prompts(model):
    return [model[1](p, add_special_tokens=False).input_ids for p in PROMPTS]


def _gap(trainer, prompts, groups, pad_id: int) -> tuple[float, float]:
    """Mean and largest |engine log-prob - trainer log-prob| over the sampled tokens."""
    from rlc.runtime.batch import Rollout, to_batch

    rollouts = [
        Rollout(p, c.token_ids, c.logprobs, c.finish_reason, 0.0, i)
        for i, (p, group) in enumerate(zip(prompts, groups))
        for c in group
    ]
    batch = to_batch(rollouts, pad_id)
    diff = (trainer.forward(batch) - batch.rollout_logprobs).abs()[batch.loss_mask.bool()]
    return float(diff.mean()), float(diff.max())


def _ids(groups) -> list[list[list[int]]]:
    return [[c.token_ids for c in group] for group in groups]


def _free_gpu_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def _apply(actions, trainer, engine, send) -> list[str]:
    """Carry out the colocation state machine's actions in order, as the driver's `_apply` does through Ray."""
    for act in actions:
        if act.op == "send_weights":
            send()
        elif act.target == "engines":
            args = {"sleep": (2,), "wake_up": (list(act.tags),), "reset_prefix_cache": ()}[act.op]
            getattr(engine, act.op)(*args)
        else:
            getattr(trainer, act.op)(model=act.model, optimizer=act.optimizer)
    return [str(a) for a in actions]


def _send_ipc(trainer, engine, version: int) -> int:
    """The policy's bf16 weights into the engine bucket by bucket (weights.updates.CudaIpc.send's loop);
    returns the number of buckets."""
    from rlc.compiler.decide import weight_sync

    sync = weight_sync(_spec(), "cuda")
    assert sync.transport == "ipc" and sync.ipc_threshold_bytes == int(IPC_GB * 2**30)
    trainer.start_ipc_weights("bfloat16", sync.ipc_threshold_bytes)
    buckets = 0
    while (bucket := trainer.next_ipc_bucket()) is not None:
        engine.update_weights_ipc(*bucket)
        buckets += 1
    assert engine.finish_weight_update(version) == version
    return buckets


def test_the_engine_samples_as_the_spec_says(engine, prompts):
    s = _sampling()
    out = engine.generate(prompts, s, n=4, seed=3)
    assert [len(group) for group in out] == [4] * len(prompts)
    for group in out:
        for c in group:
            assert 0 < len(c.token_ids) <= s.max_generate_length
            assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason in ("stop", "length")
    again = engine.generate(prompts, s, n=4, seed=3)
    assert _ids(again) == _ids(out)  # seeded
    assert _ids(engine.generate(prompts, s, n=4, seed=4)) != _ids(out)
    greedy = engine.generate(prompts, _sampling(temperature=0.0), n=2)
    assert all(g[0].token_ids == g[1].token_ids for g in greedy)  # greedy samples of one prompt agree


def test_engine_logprobs_are_the_trainers(engine, trainer, model, prompts):
    out = engine.generate(prompts, _sampling(), n=4, seed=1)
    mean, largest = _gap(trainer, prompts, out, model[1].pad_token_id)
    assert mean < LOGPROB_TOLERANCE, (mean, largest)
    _report("vllm_logprobs_vs_fsdp2", {"mean_abs_diff": round(mean, 5), "max_abs_diff": round(largest, 5)})


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_releases_the_gpu_and_wake_up_restores_the_same_greedy_output(engine, trainer, prompts, level):
    """Level 1 keeps the weights in CPU memory; level 2 drops them, so waking takes a weight sync, done here in the
    colocation state machine's order with the trainer's (unchanged) weights."""
    from rlc.runtime.colocation import Colocation

    greedy = _sampling(temperature=0.0)
    before = engine.generate(prompts, greedy)
    awake = _free_gpu_bytes()
    t0 = time.perf_counter()
    engine.sleep(level=level)
    sleep_s = time.perf_counter() - t0
    asleep = _free_gpu_bytes()
    assert asleep - awake > 2**30, (awake, asleep)  # the KV cache of 30% of the GPU, at least
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, greedy)
    t0 = time.perf_counter()
    if level == 1:
        engine.wake_up()
        steps = ["engines.wake_up()"]
    else:
        colocation = Colocation({"policy": True})
        colocation.engines_awake = False  # it slept after generating
        steps = _apply(colocation.sync_weights(), trainer, engine, lambda: _send_ipc(trainer, engine, 10 + level))
    wake_s = time.perf_counter() - t0
    trainer.backload(model=True, optimizer=False)  # a sync leaves the policy offloaded; the next tests score with it
    assert _ids(engine.generate(prompts, greedy)) == _ids(before)
    _report(
        f"vllm_sleep_level_{level}",
        {
            "released_MiB": round((asleep - awake) / 2**20, 1),
            "sleep_s": round(sleep_s, 3),
            "wake_s": round(wake_s, 3),
            "wake_steps": steps,
        },
    )


def test_ipc_weights_into_the_sleeping_engine_are_what_it_samples_with(engine, trainer, model, prompts):
    """New policy weights reach a sleeping engine over CUDA IPC in the state machine's order; afterwards the
    engine's log-probs are the trainer's again (and were not before the sync)."""
    from rlc.runtime.colocation import Colocation

    pad = model[1].pad_token_id
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in trainer.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.add_(torch.randn(local.shape, generator=g, device=local.device, dtype=local.dtype) * 0.05)
    stale = _gap(trainer, prompts, engine.generate(prompts, _sampling(), n=4, seed=5), pad)
    colocation = Colocation({"policy": True})
    sent: list[int] = []
    send = lambda: sent.append(_send_ipc(trainer, engine, 20))  # noqa: E731
    _apply(colocation.after_generate(), trainer, engine, send)  # the prefix cache reset, a level-2 sleep
    t0 = time.perf_counter()
    steps = _apply(colocation.sync_weights(), trainer, engine, send)
    sync_s = time.perf_counter() - t0
    assert steps.index("engines.wake_up(weights)") < steps.index("policy.send_weights()")
    assert steps.index("policy.send_weights()") < steps.index("engines.wake_up(kv_cache)")
    trainer.backload(model=True, optimizer=False)  # the sync left the policy offloaded; forward needs it back
    fresh = _gap(trainer, prompts, engine.generate(prompts, _sampling(), n=4, seed=5), pad)
    assert fresh[0] < LOGPROB_TOLERANCE < stale[0], (fresh, stale)
    assert sent[0] > 2 and engine.weight_version == 20
    _report(
        "vllm_ipc_update",
        {
            "buckets": sent[0],
            "threshold_GB": IPC_GB,
            "sync_s": round(sync_s, 3),
            "steps": steps,
            "mean_abs_diff_stale": round(stale[0], 4),
            "mean_abs_diff_synced": round(fresh[0], 5),
        },
    )


def test_tokens_per_second_against_vllms_own_generate(engine, model):
    """Generation speed of rlc's engine against `LLM.generate` of the same `LLM` with the same sampling, alternating
    (measured, never asserted: a figure for bench/RESULTS.md)."""
    from rlc.runtime.inference.vllm import sampling_kwargs

    vllm = pytest.importorskip("vllm")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 4000, (24,), generator=g).tolist() for _ in range(64)]
    # The same stop tokens in both (rlc's engine adds the tokenizer's EOS); ignore_eos keeps vLLM's own EOS out.
    extra = {"ignore_eos": True, "stop_token_ids": [model[1].eos_token_id]}
    s = _sampling(max_generate_length=64, additional_kwargs=extra)
    n = 8

    def ours(seed: int) -> int:
        return sum(len(c.token_ids) for group in engine.generate(prompts, s, n=n, seed=seed) for c in group)

    def theirs(seed: int) -> int:
        params = vllm.SamplingParams(**sampling_kwargs(s, n, seed, s.additional_kwargs))
        requests = [vllm.TokensPrompt(prompt_token_ids=p) for p in prompts]
        outputs = engine.llm.generate(requests, params, use_tqdm=False)
        return sum(len(o.token_ids) for r in outputs for o in r.outputs)

    ours(0), theirs(0)  # warm-up
    rates: dict[str, list[float]] = {"rlc": [], "vllm": []}
    for rnd in range(3):
        for name, run in (("rlc", ours), ("vllm", theirs)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            tokens = run(rnd + 1)
            rates[name].append(tokens / (time.perf_counter() - t0))
    mean = {k: sum(v) / len(v) for k, v in rates.items()}
    _report(
        "vllm_tokens_per_s",
        {
            "prompts": len(prompts),
            "n": n,
            "max_tokens": s.max_generate_length,
            "tokens_per_s": {k: [round(x) for x in v] for k, v in rates.items()},
            "rlc_vs_vllm": round(mean["rlc"] / mean["vllm"], 3),
        },
    )


def test_speculative_decoding_samples_with_the_policys_log_probs(trainer, model, prompts):
    """vLLM's n-gram drafter, as `speculative_config` gives it (vLLM's CPU build cannot: RLC-E520): every drafted
    token is verified against the policy, so the samples' log-probs are still the trainer's, on prompts that repeat
    themselves (the n-grams the drafter proposes)."""
    pytest.importorskip("vllm")
    from rlc.compiler.decide import vllm_args
    from rlc.runtime.inference.vllm import VLLMEngine, engine_kwargs

    spec = _spec()
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    ie = dataclasses.replace(spec.generator.inference_engine, speculative_config=ngram)
    args = vllm_args(
        dataclasses.replace(spec, generator=dataclasses.replace(spec.generator, inference_engine=ie)), "cuda", [0]
    )
    path, tok = model
    kwargs = engine_kwargs(args, model=path)
    assert kwargs["speculative_config"] == ngram
    engine = VLLMEngine(
        path,
        dtype=args.dtype,
        device="cuda",
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        engine_args=kwargs,
        env=args.env,
    )
    assert engine.update_weights(trainer.packed_state_dict("bfloat16"), 1) == 1  # the policy as it is now
    repeating = [(p * 4)[:60] for p in prompts]
    t0 = time.perf_counter()
    out = engine.generate(repeating, _sampling(), n=4, seed=2)
    generate_s = time.perf_counter() - t0
    mean, largest = _gap(trainer, repeating, out, tok.pad_token_id)
    assert mean < LOGPROB_TOLERANCE, (mean, largest)
    _report(
        "vllm_speculative_ngram",
        {"mean_abs_diff": round(mean, 5), "max_abs_diff": round(largest, 5), "generate_s": round(generate_s, 3)},
    )
