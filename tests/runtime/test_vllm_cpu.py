"""The vllm engine for real (vLLM 0.30 built for CPUs): `VLLMEngine` as a Ray actor with the engine arguments the
compiler decides for a CPU job, rlc's worker extension inside vLLM, and a real FSDP policy rank beside it.

One engine and one trainer rank serve the whole module (an engine takes 20-60 s to start on 2 busy cores). They
check that the engine samples as the spec says, with the hf engine's meaning (the same model in an `HFEngine` in
this process is the reference), that its log-probs are the trainer's, and that weights synced over the broadcast
group or as whole state dicts reach it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

from conftest import kill_ray_processes_under  # noqa: E402
from rlc.compiler.decide import sampling as sampling_from_spec  # noqa: E402
from rlc.compiler.decide import vllm_args  # noqa: E402
from rlc.core.job import Sampling, WorkerSettings  # noqa: E402
from rlc.runtime.batch import Rollout, to_batch, totals  # noqa: E402
from rlc.runtime.inference.hf import HFEngine  # noqa: E402
from rlc.runtime.inference.vllm import VLLMEngine, engine_kwargs  # noqa: E402
from rlc.runtime.workers.fsdp import FSDPWorker  # noqa: E402
from rlc.spec.model import default_model  # noqa: E402

pytestmark = pytest.mark.slow

TEMPERATURE = 0.7
# The largest difference between the engine's log-probs of its samples and the trainer's recomputation that the
# tests accept. Both compute in float32 (vLLM's oneDNN matmuls and CPU attention against torch's); measured here:
# at most 1e-6 (4.8e-7 to 9.5e-7 over ~120 sampled tokens at temperature 0.7, before and after weight syncs).
LOGPROB_TOLERANCE = 1e-4
PROMPTS = ["copy the digit 3:", "copy the digit 7:", "what is 2 plus 5?", "Question: how many apples"]


def _spec(**trainer):
    return default_model().to_typed(
        {
            "version": 1,
            "cluster": {"accelerator": "none", "gpus_per_node": 1},
            "trainer": {
                "policy": {"model": {"path": "rlc:tiny-vllm"}, "optimizer_config": {"lr": 0.05}},
                "algorithm": {"temperature": TEMPERATURE},
                "max_prompt_length": 32,
                "train_batch_size": 4,
                # No evaluation: the engine's KV cache is sized for a step's 16 rollouts (the KV cache test).
                "eval_interval": -1,
                "eval_before_train": False,
                **trainer,
            },
            "generator": {
                "inference_engine": {"backend": "vllm", "model_dtype": "float32", "weight_sync_backend": "gloo"},
                "n_samples_per_prompt": 4,
                "sampling_params": {"max_generate_length": 8, "temperature": TEMPERATURE},
            },
        }
    )


def sampling(**fields) -> Sampling:
    params = {"max_generate_length": 8, "temperature": TEMPERATURE, **fields}
    spec = default_model().to_typed({"version": 1, "generator": {"sampling_params": params}})
    return sampling_from_spec(spec.generator.sampling_params)


@pytest.fixture(scope="module")
def ray_session():
    temp = tempfile.mkdtemp(prefix="rv", dir="/tmp")  # Ray's socket paths must stay short
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED")}
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, log_to_driver=False)
    yield ray
    ray.shutdown()
    kill_ray_processes_under(temp)
    shutil.rmtree(temp, ignore_errors=True)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def model(rlc_cache):
    from rlc.runtime.models import local_path
    from transformers import AutoTokenizer

    path = local_path("rlc:tiny-vllm")
    return path, AutoTokenizer.from_pretrained(path)


def start_engine(spec, model, index: int = 0, engines: int = 1, cpus: int = 1):
    """Engine `index` of `engines` as the driver starts it: the compiler's arguments for a CPU job, as a Ray actor
    (`cpus`: 0 for one beside the module's engines, which hold Ray's two)."""
    path, tok = model
    args = vllm_args(spec, "cpu", list(range(engines)))
    actor = ray.remote(VLLMEngine).options(num_cpus=cpus, runtime_env={"env_vars": args.env})
    engine = actor.remote(
        path,
        dtype=args.dtype,
        device="cpu",
        eos_token_id=tok.eos_token_id,
        engine_args=engine_kwargs(args, model=path, engine=index),
        env=args.env,
        cpu_slots_per_node=2,
    )
    ray.get(engine.node_ip.remote(), timeout=600)  # constructed
    return engine


def with_engine_settings(spec, **fields):
    ie = dataclasses.replace(spec.generator.inference_engine, **fields)
    return dataclasses.replace(spec, generator=dataclasses.replace(spec.generator, inference_engine=ie))


@pytest.fixture(scope="module")
def engine(ray_session, model):
    return start_engine(_spec(), model)


@pytest.fixture(scope="module")
def trainer(ray_session, model):
    """Policy rank 0 of 1 (FSDP2 code path, gloo), scoring with the sampling temperature."""
    from rlc.runtime.workers.common import free_address

    spec = _spec()
    settings = WorkerSettings("policy", model[0], temperature=TEMPERATURE, micro_train_batch_size=16)
    worker = (
        ray.remote(FSDPWorker).options(num_cpus=0).remote(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)
    )
    ray.get(worker.setup.remote(*free_address()))
    return worker


@pytest.fixture(scope="module")
def hf(model):
    path, tok = model
    return HFEngine(path, dtype="float32", pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, tokenizer=tok)


@pytest.fixture(scope="module")
def prompts(model):
    tok = model[1]
    return [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]


def generate(engine, prompts, s: Sampling, n: int = 1, seed: int = 0):
    return ray.get(engine.generate.remote(prompts, s, n, seed), timeout=300)


def logits_after(model_dir_or_hf, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The hf engine's model's next-token logits at every response position (float32, no temperature)."""
    hf = model_dir_or_hf
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        out = hf.model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    return out.float()


def trainer_logprobs(trainer, prompts, groups, pad_id: int):
    """The trainer's log-probs of each completion (policy forward, the sampling temperature)."""
    rollouts = [
        Rollout(p, c.token_ids, c.logprobs, c.finish_reason, 0.0, i)
        for i, (p, group) in enumerate(zip(prompts, groups))
        for c in group
    ]
    batch = to_batch(rollouts, pad_id)
    mine = ray.get(trainer.forward.remote(batch))
    return rollouts, batch, mine


def largest_logprob_gap(trainer, prompts, groups, pad_id: int) -> float:
    _, batch, mine = trainer_logprobs(trainer, prompts, groups, pad_id)
    real = batch.loss_mask.bool()
    return float((mine - batch.rollout_logprobs).abs()[real].max())


# -- the KV cache ---------------------------------------------------------------------------------------


def test_the_compilers_kv_cache_runs_a_steps_rollouts_at_once(engine, prompts):
    """The spec's step (4 prompts x 4 samples, 8 new tokens) fits the KV cache the compiler decided: one pass per
    new token. One block short (vLLM keeps block 0 for itself), a sequence waited for a free block: 10 passes."""

    def count_passes(engine, prompts, sampling, n):  # runs in the actor (a nested function travels by value)
        executor = engine.llm.llm_engine.engine_core.engine_core.model_executor
        passes, run = [0], executor.execute_model

        def counted(*args, **kwargs):
            passes[0] += 1
            return run(*args, **kwargs)

        executor.execute_model = counted
        try:
            engine.generate(prompts, sampling, n)
        finally:
            executor.execute_model = run
        return passes[0]

    s = sampling(additional_kwargs={"ignore_eos": True})
    spec = _spec()
    assert len(prompts) == spec.trainer.train_batch_size
    passes = ray.get(engine.__ray_call__.remote(count_passes, prompts, s, spec.generator.n_samples_per_prompt))
    assert passes == s.max_generate_length


# -- sampling --------------------------------------------------------------------------------------------


def test_n_samples_per_prompt_within_max_tokens_reproducible_by_seed(engine, prompts):
    s = sampling(max_generate_length=5)
    out = generate(engine, prompts, s, n=3, seed=11)
    assert [len(group) for group in out] == [3] * len(prompts)
    for c in (c for group in out for c in group):
        assert 1 <= len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids)
        assert c.finish_reason == ("length" if len(c.token_ids) == 5 else "stop")
    again = generate(engine, prompts, s, n=3, seed=11)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in out]
    other = generate(engine, prompts, s, n=3, seed=12)
    assert [[c.token_ids for c in g] for g in other] != [[c.token_ids for c in g] for g in out]


def test_a_call_is_seeded_and_its_samples_differ(engine, prompts):
    """The call is seeded (the hf engine's meaning), not each sample: the same call again samples the same, another
    seed otherwise, and the samples of one prompt differ from each other."""
    s = sampling(max_generate_length=6, temperature=1.5)
    out = generate(engine, [prompts[0], prompts[0]], s, n=2, seed=100)
    assert len({tuple(c.token_ids) for group in out for c in group}) == 4
    assert [[c.token_ids for c in g] for g in generate(engine, [prompts[0], prompts[0]], s, n=2, seed=100)] == [
        [c.token_ids for c in g] for g in out
    ]


def test_a_groups_samples_share_their_prompts_kv_cache(engine, model):
    """Prefix caching with the compiler's 32-token blocks: the n samples of a prompt of 36 tokens compute its whole
    block once (vLLM finds a block scheduled earlier in the same step), where 128-token blocks (vLLM's CPU default)
    would compute the whole prompt for every sample."""

    def scheduled_tokens(engine, prompts, sampling, n):  # runs in the actor
        executor = engine.llm.llm_engine.engine_core.engine_core.model_executor
        tokens, run = [], executor.execute_model

        def counted(scheduler_output, *args, **kwargs):
            tokens.append(scheduler_output.total_num_scheduled_tokens)
            return run(scheduler_output, *args, **kwargs)

        executor.execute_model = counted
        try:
            engine.generate(prompts, sampling, n)
        finally:
            executor.execute_model = run
        return tokens

    tok, n = model[1], 4
    prompt = tok(" ".join(f"item{i}" for i in range(200)), add_special_tokens=False).input_ids[:36]
    assert len(prompt) == 36  # and 2 new tokens: within the engine's 40
    s = sampling(max_generate_length=2, additional_kwargs={"ignore_eos": True})
    ray.get(engine.reset_prefix_cache.remote())
    first, *rest = ray.get(engine.__ray_call__.remote(scheduled_tokens, [prompt], s, n))
    # the first sample's 36 tokens, then 36 - 32 for each other; each sample's second token on the next pass
    assert first == 36 + (n - 1) * (36 - 32), first
    assert rest == [n]


@pytest.mark.parametrize(
    "fields",
    [{"temperature": 0.0}, {"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}],
    ids=["greedy", "top_k=1", "top_p", "min_p=1"],
)
def test_filters_that_leave_one_token_sample_the_hf_models_argmax(engine, hf, prompts, fields):
    """Greedy, and the filters at the value that keeps only the likeliest token, pick it in both engines (the same
    token up to a float32 tie: its logit within 1e-4 of the largest)."""
    s = sampling(max_generate_length=6, **fields)
    for name, eng in (("vllm", engine), ("hf", hf)):
        out = generate(eng, prompts, s, n=2) if name == "vllm" else eng.generate(prompts, s, n=2)
        for prompt, group in zip(prompts, out):
            for c in group:
                logits = logits_after(hf, prompt, c.token_ids)
                picked = logits.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
                assert bool((picked >= logits.max(-1).values - 1e-4).all()), (name, fields, c.token_ids)


def test_top_k_samples_only_among_the_k_likeliest_in_both_engines(engine, hf, prompts):
    s = sampling(top_k=3, temperature=1.5, max_generate_length=6)
    for name, out in (("vllm", generate(engine, prompts, s, n=8, seed=3)), ("hf", hf.generate(prompts, s, 8, 3))):
        seen = set()
        for prompt, group in zip(prompts, out):
            for c in group:
                logits = logits_after(hf, prompt, c.token_ids)
                third = logits.topk(3, dim=-1).values[:, -1]
                picked = logits.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
                assert bool((picked >= third - 1e-4).all()), (name, c.token_ids)
                seen.update(c.token_ids)
        assert len(seen) > len(prompts)  # really sampled, not greedy


def test_a_stop_string_ends_the_completion_at_the_same_place_in_both_engines(engine, hf, model, prompts):
    tok = model[1]
    free = generate(engine, prompts, sampling(temperature=0.0, max_generate_length=8))
    # The text of each greedy completion's third token: stopping at it ends the completion there (or earlier,
    # where the text shows up sooner).
    stops = [tok.decode(g[0].token_ids[2:3]) for g in free]
    checked = 0
    for prompt, group, stop in zip(prompts, free, stops):
        if not stop.strip() or len(group[0].token_ids) < 3:
            continue
        s = sampling(temperature=0.0, max_generate_length=8, stop=[stop])
        ours = generate(engine, [prompt], s)[0][0]
        theirs = hf.generate([prompt], s)[0][0]
        assert ours.finish_reason == theirs.finish_reason == "stop"
        assert stop in tok.decode(ours.token_ids) and len(ours.token_ids) <= 3
        assert ours.token_ids == theirs.token_ids or len(ours.token_ids) == len(theirs.token_ids)
        checked += 1
    assert checked


def test_additional_kwargs_reach_vllms_sampling(engine, prompts):
    """vLLM's own sampling arguments (the hf engine refuses them at compile time): stop_token_ids ends a completion
    at the token named, min_tokens holds it back until that many tokens are out."""
    greedy = sampling(temperature=0.0, max_generate_length=8)
    # A prompt whose greedy completion runs on past its second token.
    prompt, free = next(
        (p, g[0].token_ids) for p, g in zip(prompts, generate(engine, prompts, greedy)) if len(g[0].token_ids) > 2
    )
    token = free[1]
    stop = dataclasses.replace(greedy, additional_kwargs={"stop_token_ids": [token]})
    stopped = generate(engine, [prompt], stop)[0][0]
    assert stopped.token_ids == free[: free.index(token) + 1] and stopped.finish_reason == "stop"
    held = dataclasses.replace(greedy, additional_kwargs={"stop_token_ids": [token], "min_tokens": 4})
    late = generate(engine, [prompt], held)[0][0].token_ids
    assert len(late) >= 4 and token not in late[:3]


# -- log-probs and weights ----------------------------------------------------------------------------------


def test_engine_logprobs_are_the_trainers_recomputation(engine, trainer, model, prompts):
    out = generate(engine, prompts, sampling(), n=4, seed=1)
    assert largest_logprob_gap(trainer, prompts, out, model[1].pad_token_id) < LOGPROB_TOLERANCE


def _train_one_step(trainer, engine, prompts, pad_id: int, seed: int) -> None:
    """One policy update on the engine's samples, with advantages that push every sampled token up or down."""
    out = generate(engine, prompts, sampling(), n=4, seed=seed)
    rollouts, batch, _ = trainer_logprobs(trainer, prompts, out, pad_id)
    g = torch.Generator().manual_seed(seed)
    batch.advantages = torch.randn(batch.rows, 1, generator=g).expand_as(batch.loss_mask).contiguous()
    batch.returns = batch.advantages
    ray.get(trainer.train_mini_batch.remote(batch, totals(batch)))


def test_weights_broadcast_from_the_policy_rank_over_gloo_reach_the_engine(engine, trainer, model, prompts):
    from rlc.runtime.workers.common import free_address

    pad = model[1].pad_token_id
    host, port = free_address()
    joined = [
        trainer.init_weight_group.remote(host, port, 2, "gloo"),
        engine.init_weight_group.remote(host, port, 1, 2, "gloo"),
    ]
    assert ray.get(joined, timeout=120)[1] == [1]  # the engine's one worker is rank 1
    _train_one_step(trainer, engine, prompts, pad, seed=2)
    stale = generate(engine, prompts, sampling(), n=4, seed=7)
    assert largest_logprob_gap(trainer, prompts, stale, pad) > 100 * LOGPROB_TOLERANCE  # the update changed them
    metas = ray.get(trainer.weight_metas.remote("float32"))
    sent, version = ray.get(
        [trainer.broadcast_weights.remote("float32"), engine.receive_weights.remote(metas, 5)], timeout=120
    )
    assert sent == len(metas) and version == 5
    fresh = generate(engine, prompts, sampling(), n=4, seed=7)
    assert largest_logprob_gap(trainer, prompts, fresh, pad) < LOGPROB_TOLERANCE
    ray.get(engine.close_weight_group.remote())


def test_whole_state_dicts_reach_the_engine(engine, trainer, model, prompts):
    pad = model[1].pad_token_id
    _train_one_step(trainer, engine, prompts, pad, seed=3)
    assert largest_logprob_gap(trainer, prompts, generate(engine, prompts, sampling(), 4, 8), pad) > 1e-2
    packed = trainer.packed_state_dict.remote("float32")  # the object store's copy, as the payload transport sends it
    assert ray.get(engine.update_weights.remote(packed, 6)) == 6
    fresh = generate(engine, prompts, sampling(), n=4, seed=8)
    assert largest_logprob_gap(trainer, prompts, fresh, pad) < LOGPROB_TOLERANCE


def test_checkpoint_deltas_the_policy_rank_publishes_reach_the_engine(engine, trainer, model, prompts, tmp_path):
    """weight_sync_backend delta: the FSDP2 policy rank publishes what changed to a directory, the engine's worker
    patches its copy of the checkpoint and loads it, twice in a row (the second delta on top of the first)."""
    pad = model[1].pad_token_id
    settings = {
        "sync_dir": str(tmp_path / "sync"),
        "local_checkpoint_dir": str(tmp_path / "copy"),
        "max_file_bytes": 1 << 30,
        "publish_num_workers": 1,
        "cloud_download_workers": 1,
    }
    for version, seed in ((1, 4), (2, 5)):
        _train_one_step(trainer, engine, prompts, pad, seed=seed)
        assert largest_logprob_gap(trainer, prompts, generate(engine, prompts, sampling(), 4, 9), pad) > 1e-2
        update = ray.get(trainer.publish_delta.remote(settings))
        assert update["target_version"] == version and update["changed_tensors"] > 0
        assert ray.get(engine.update_weights_delta.remote(update, settings, 10 + version)) == 10 + version
        fresh = generate(engine, prompts, sampling(), n=4, seed=9)
        assert largest_logprob_gap(trainer, prompts, fresh, pad) < LOGPROB_TOLERANCE


def test_a_second_weight_group_is_refused_without_override_and_replaces_the_first_with_it(
    engine, trainer, model, prompts
):
    from rlc.runtime.weights.broadcast import close_group, init_group, send_weights
    from rlc.runtime.weights.tensors import metas_of
    from rlc.runtime.workers.common import free_address

    host, first = free_address()
    with ThreadPoolExecutor(1) as pool:  # a trainer's group (this process as its rank 0)
        master = pool.submit(init_group, host, first, 0, 2, "gloo", timeout_s=120)
        ray.get(engine.init_weight_group.remote(host, first, 1, 2, "gloo"), timeout=120)
        old = master.result(timeout=120)
    second = free_address()[1]
    with pytest.raises(ray.exceptions.RayTaskError, match=f"weight-update group whose master is {host}:{first}"):
        ray.get(engine.init_weight_group.remote(host, second, 1, 2, "gloo"), timeout=120)
    with ThreadPoolExecutor(1) as pool:
        master = pool.submit(init_group, host, second, 0, 2, "gloo", timeout_s=120)
        ray.get(engine.init_weight_group.remote(host, second, 1, 2, "gloo", override_existing=True), timeout=120)
        new = master.result(timeout=120)
    weights = ray.get(trainer.full_state_dict.remote("float32"))
    with ThreadPoolExecutor(1) as pool:  # the new group carries weights
        sent = pool.submit(send_weights, new, weights.items())
        assert ray.get(engine.receive_weights.remote(metas_of(weights.items()), 9), timeout=120) == 9
        sent.result(timeout=120)
    fresh = generate(engine, prompts, sampling(), n=4, seed=11)
    assert largest_logprob_gap(trainer, prompts, fresh, model[1].pad_token_id) < LOGPROB_TOLERANCE
    ray.get(engine.close_weight_group.remote())
    for group in (old, new):
        close_group(group)


@pytest.fixture
def multiproc_engine(ray_session, model):
    """vllm_v1_disable_multiproc: false: the engine core and its worker run in processes of their own (vLLM spawns
    them from the actor), and rlc's calls reach the worker pickled (`rlc_call`). Gone after its test (a CPU of the
    session's two)."""
    path, tok = model
    args = vllm_args(_spec_multiproc(), "cpu", [0])
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in args.env
    engine = (
        ray.remote(VLLMEngine)
        .options(num_cpus=1)
        .remote(path, device="cpu", eos_token_id=tok.eos_token_id, engine_args=engine_kwargs(args, model=path))
    )
    ray.get(engine.node_ip.remote(), timeout=600)
    yield engine
    ray.kill(engine)


def _spec_multiproc():
    spec = _spec()
    return dataclasses.replace(
        spec,
        generator=dataclasses.replace(
            spec.generator,
            inference_engine=dataclasses.replace(spec.generator.inference_engine, vllm_v1_disable_multiproc=False),
        ),
    )


def test_an_engine_core_in_its_own_process_takes_weights_both_ways(multiproc_engine, trainer, model, prompts):
    from rlc.runtime.workers.common import free_address

    engine, pad = multiproc_engine, model[1].pad_token_id
    host, port = free_address()
    joined = [
        trainer.init_weight_group.remote(host, port, 2, "gloo"),
        engine.init_weight_group.remote(host, port, 1, 2, "gloo"),
    ]
    assert ray.get(joined, timeout=120)[1] == [1]
    metas = ray.get(trainer.weight_metas.remote("float32"))
    ray.get([trainer.broadcast_weights.remote("float32"), engine.receive_weights.remote(metas, 1)], timeout=120)
    assert largest_logprob_gap(trainer, prompts, generate(engine, prompts, sampling(), 4, 12), pad) < LOGPROB_TOLERANCE
    ray.get(engine.close_weight_group.remote())
    _train_one_step(trainer, engine, prompts, pad, seed=6)
    assert ray.get(engine.update_weights.remote(trainer.packed_state_dict.remote("float32"), 2)) == 2
    assert largest_logprob_gap(trainer, prompts, generate(engine, prompts, sampling(), 4, 13), pad) < LOGPROB_TOLERANCE


# -- LoRA -------------------------------------------------------------------------------------------------------


@pytest.fixture
def lora_pair(ray_session, model, tmp_path_factory):
    """An engine with LoRA on (vLLM's CPU LoRA kernels) and a LoRA policy rank, as a fsdp2 LoRA job has them."""
    from rlc.runtime.workers.common import free_address

    path, tok = model
    lora = {"rank": 8, "alpha": 16, "lora_sync_path": str(tmp_path_factory.mktemp("lora-sync"))}
    spec = _spec(policy={"model": {"path": "rlc:tiny-vllm", "lora": lora}, "optimizer_config": {"lr": 0.05}})
    args = vllm_args(spec, "cpu", [0])
    assert (args.enable_lora, args.max_lora_rank) == (True, 8)
    engine = (
        ray.remote(VLLMEngine)
        .options(num_cpus=1, runtime_env={"env_vars": args.env})
        .remote(
            path,
            device="cpu",
            eos_token_id=tok.eos_token_id,
            engine_args=engine_kwargs(args, model=path),
            env=args.env,
            lora=spec.trainer.policy.model.lora,
        )
    )
    settings = WorkerSettings("policy", path, temperature=TEMPERATURE, micro_train_batch_size=16)
    trainer = (
        ray.remote(FSDPWorker).options(num_cpus=0).remote(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)
    )
    ray.get([trainer.setup.remote(*free_address()), engine.node_ip.remote()], timeout=600)
    yield engine, trainer, lora["lora_sync_path"]
    ray.kill(engine)
    ray.kill(trainer)


def test_lora_adapters_reach_the_engine(lora_pair, model, prompts):
    engine, trainer, sync_dir = lora_pair
    pad = model[1].pad_token_id
    _train_one_step(trainer, engine, prompts, pad, seed=4)  # the adapters' B matrices leave 0
    assert largest_logprob_gap(trainer, prompts, generate(engine, prompts, sampling(), 4, 9), pad) > 1e-2
    packed = trainer.packed_state_dict.remote("float32")  # the adapters only
    assert ray.get(engine.update_weights.remote(packed, 1)) == 1
    assert largest_logprob_gap(trainer, prompts, generate(engine, prompts, sampling(), 4, 9), pad) < LOGPROB_TOLERANCE
    _train_one_step(trainer, engine, prompts, pad, seed=5)
    assert ray.get(engine.update_weights.remote(trainer.packed_state_dict.remote("float32"), 2)) == 2
    assert largest_logprob_gap(trainer, prompts, generate(engine, prompts, sampling(), 4, 10), pad) < LOGPROB_TOLERANCE
    assert os.listdir(sync_dir) == []  # each adapter's files are gone once vLLM holds it


# -- the prefill/decode split -------------------------------------------------------------------------------


def test_prefill_and_decode_engines_hand_the_kv_cache_over(ray_session, trainer, model, prompts, tmp_path):
    """A prefill engine and a decode engine with vLLM's ExampleConnector (the KV cache through files, which the CPU
    build runs), routed as the driver routes them: the decode engine samples from the prefill's KV cache with the
    policy's log-probs, and after a weight update from KV computed with the new weights."""
    from rlc.runtime.rollouts import job_engines

    store = tmp_path / "kv"
    store.mkdir()
    connector = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": str(store)}}
    # blocks of 32 tokens (the CPU's default is 128): the connector hands over whole blocks of a prompt but its last
    # token, so each 40-token prompt below hands 32 over
    kwargs = {"kv_transfer_config": connector, "block_size": 32}
    spec = with_engine_settings(
        _spec(max_prompt_length=48), num_engines=2, enable_pd=True, num_prefill=1, engine_init_kwargs=kwargs
    )
    prompts = [(p * 3)[:40] for p in prompts]
    roles = vllm_args(spec, "cpu", [0, 1]).pd_roles
    assert roles == ("prefill", "decode")
    pair = [start_engine(spec, model, i, engines=2, cpus=0) for i in range(2)]
    engines = job_engines(ray, pair, roles, seed=3)
    pad = model[1].pad_token_id

    def sample(step: int):
        return engines.result(engines.submit(prompts, sampling(), 4, (step, 0, 0), list(range(len(prompts))), 4))

    def synced(version: int) -> None:
        packed = trainer.packed_state_dict.remote("float32")
        assert ray.get([e.update_weights.remote(packed, version) for e in pair]) == [version, version]
        ray.get([e.reset_prefix_cache.remote() for e in pair])

    try:
        synced(1)
        assert not list(store.iterdir())  # a sync leaves no KV of old weights behind
        out = sample(1)
        assert [len(group) for group in out] == [4] * len(prompts)
        handed = list(store.iterdir())  # each prompt's KV cache, a file per layer
        assert len(handed) == len(prompts) and all(list(folder.glob("*.safetensors")) for folder in handed)
        assert largest_logprob_gap(trainer, prompts, out, pad) < LOGPROB_TOLERANCE
        _train_one_step(trainer, pair[1], prompts, pad, seed=5)
        synced(2)
        assert not list(store.iterdir())
        assert largest_logprob_gap(trainer, prompts, sample(2), pad) < LOGPROB_TOLERANCE
    finally:
        for e in pair:
            ray.kill(e)
