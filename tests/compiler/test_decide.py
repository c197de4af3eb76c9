"""The runtime decisions the compiler takes: which path weights travel by for each combination of device, placement,
LoRA, strategy and engine location, whether an engine's existing weight-update group is replaced, and the values
the runtime used to work out itself (engine dtype, model paths, sequence length, eval sampling). A compiled
plan.json carries them, and the runtime loads them back unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rlc.compiler.decide import decide
from rlc.core.job import Decisions
from rlc.core.plan import Plan
from rlc.spec.model import default_model

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def _decisions(
    *,
    device: str = "GPU",
    colocate: bool = True,
    remote: bool = False,
    lora: int = 0,
    backend: str = "nccl",
    strategy: str = "fsdp2",
    override: str = "auto",
    extra: dict | None = None,
):
    data = {
        "version": 1,
        "trainer": {
            "strategy": strategy,
            "placement": {"colocate_all": colocate},
            "policy": {"model": {"lora": {"rank": lora}}},
        },
        "generator": {
            "inference_engine": {
                "backend": "hf",
                "run_engines_locally": not remote,
                "remote_urls": ["10.0.0.9:8000"] if remote else [],
                "weight_sync_backend": backend,
                "override_existing_update_group": override,
            }
        },
    }
    for key, value in (extra or {}).items():
        *head, last = key.split(".")
        node = data
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    spec = default_model().to_typed(data)
    plan = Plan("job", 1, 8, "none" if device == "CPU" else "H100", 1, "hf")
    return decide(spec, plan)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ({}, "ipc"),  # colocated on GPUs: NCCL cannot pair two ranks on one GPU
        ({"colocate": False}, "nccl"),
        ({"backend": "gloo"}, "gloo"),  # asked for explicitly: over the host network even when colocated
        ({"lora": 8}, "payload"),  # only the adapters travel
        ({"lora": 8, "colocate": False}, "payload"),
        ({"lora": 8, "backend": "gloo"}, "payload"),
        ({"strategy": "megatron"}, "payload"),  # no IPC buckets from the megatron policy
        ({"strategy": "megatron", "colocate": False}, "nccl"),
        ({"strategy": "megatron", "lora": 8}, "payload"),  # merged weights, but colocated
        ({"strategy": "megatron", "lora": 8, "colocate": False}, "nccl"),  # merged weights: a plain broadcast
        ({"device": "CPU", "backend": "gloo"}, "gloo"),
        ({"device": "CPU", "colocate": False, "backend": "gloo"}, "gloo"),
        ({"device": "CPU"}, "payload"),  # nccl on a CPU run
        ({"device": "CPU", "colocate": False}, "payload"),
        ({"remote": True}, "nccl"),  # a remote server is never on the trainer's GPU
        ({"remote": True, "colocate": False}, "nccl"),
        ({"remote": True, "backend": "gloo"}, "gloo"),
        ({"remote": True, "device": "CPU", "backend": "gloo"}, "gloo"),
        ({"remote": True, "device": "CPU"}, "payload"),  # HTTP bodies
        ({"remote": True, "lora": 8, "backend": "gloo"}, "payload"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "colocated-cuda",
)
def test_the_weight_transport_of_each_combination(case, expected):
    sync = _decisions(**case).weight_sync
    assert sync.transport == expected
    assert sync.backend == (expected if expected in ("gloo", "nccl") else None)
    assert sync.delta is None


@pytest.mark.parametrize("case", [{}, {"device": "CPU"}, {"remote": True, "colocate": False}])
def test_delta_weight_sync_carries_its_settings_whatever_the_placement(case):
    extra = {
        "generator.inference_engine.delta_weight_sync": {
            "sync_dir": "s3://bucket/runs/run-1/",
            "max_file_size_in_gb": 0.5,
            "publish_num_workers": 3,
        }
    }
    sync = _decisions(**case, backend="delta", extra=extra).weight_sync
    assert (sync.transport, sync.backend) == ("delta", None)
    assert sync.delta is not None
    assert (sync.delta.sync_dir, sync.delta.max_file_bytes) == ("s3://bucket/runs/run-1/", 1 << 29)
    assert (sync.delta.publish_num_workers, sync.delta.cloud_download_workers) == (3, 4)
    # SkyRL's default: a directory under /tmp named after sync_dir, so two runs' copies never mix
    assert sync.delta.local_checkpoint_dir.startswith("/tmp/skyrl_delta_checkpoints/run-1_")
    other = _decisions(
        **case,
        backend="delta",
        extra={**extra, "generator.inference_engine.delta_weight_sync": {"sync_dir": "s3://bucket/runs/run-2/"}},
    ).weight_sync
    assert other.delta is not None and other.delta.local_checkpoint_dir != sync.delta.local_checkpoint_dir


@pytest.mark.parametrize(
    ("override", "remote", "expected"),
    [
        ("enable", False, True),
        ("enable", True, True),
        ("disable", False, False),
        ("disable", True, False),
        ("auto", True, True),  # SkyRL: remote servers outlive runs, so a new run takes them over
        ("auto", False, False),  # local engines are this run's own
    ],
)
def test_override_existing_update_group(override, remote, expected):
    assert _decisions(override=override, remote=remote, backend="gloo").weight_sync.override_existing_group is expected


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        ({"device": "CPU", "extra": {"generator.inference_engine.model_dtype": "auto"}}, "float32"),
        ({"extra": {"generator.inference_engine.model_dtype": "auto"}}, "bfloat16"),
        ({"device": "CPU", "extra": {"generator.inference_engine.model_dtype": "bfloat16"}}, "bfloat16"),  # as written
    ],
)
def test_the_engine_dtype_is_never_auto(case, dtype):
    assert _decisions(**case).engines.dtype == dtype


def test_values_the_runtime_used_to_derive():
    d = _decisions(
        extra={
            "trainer.max_prompt_length": 100,
            "generator.sampling_params.max_generate_length": 28,
            "generator.sampling_params.temperature": 0.7,
        }
    )
    assert d.engines.max_model_len == 128
    assert d.train_sampling.temperature == 0.7
    assert d.evaluation.sampling == d.train_sampling  # no eval_sampling_params: evaluation samples as training does
    assert d.ahead.sampling == d.train_sampling
    greedy = _decisions(extra={"generator.eval_sampling_params": {"temperature": 0.0, "max_generate_length": 4}})
    assert greedy.evaluation.sampling.temperature == 0.0 and greedy.evaluation.sampling.max_generate_length == 4


def test_worker_settings_name_the_model_and_strategy_each_role_runs():
    from rlc.compiler.decide import worker_settings

    spec = default_model().to_typed(
        {
            "version": 1,
            "trainer": {
                "strategy": "fsdp",
                "algorithm": {"temperature": 0.0},
                "policy": {"model": {"path": "org/policy"}},
                "critic": {"model": {"path": "org/critic"}},
            },
        }
    )
    ref, critic = worker_settings(spec, "ref", "cuda", None), worker_settings(spec, "critic", "cuda", None)
    assert ref.model_path == "org/policy" and critic.model_path == "org/critic"  # a ref starts from the policy
    assert ref.strategy == "fsdp2"  # the alias is resolved
    assert ref.temperature == 1.0  # greedy sampling: log-probs of the plain logits
    megatron = default_model().to_typed({"version": 1, "trainer": {"strategy": "megatron"}})
    assert worker_settings(megatron, "policy", "cuda", None).strategy == "megatron"
    assert worker_settings(megatron, "critic", "cuda", None).strategy == "megatron"  # the critic follows the job
    mixed = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": "megatron", "critic": {"strategy": "fsdp"}}}
    )
    assert worker_settings(mixed, "critic", "cuda", None).strategy == "fsdp2"  # or its own trainer.critic.strategy
    assert worker_settings(mixed, "policy", "cuda", None).strategy == "megatron"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_compiles_a_complete_runtime_section(example, tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "rlc.compiler.cli", "compile", str(example), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    raw = json.loads((out / "plan.json").read_text())
    assert "auto" not in json.dumps(raw["runtime"])
    decisions = Decisions.from_json(raw["runtime"])
    assert Decisions.from_json(json.loads(json.dumps(decisions.to_json()))) == decisions
    plan = Plan.from_json(raw)
    assert plan.to_json() == {k: v for k, v in raw.items() if k not in ("content_hash", "runtime")}
    assert set(decisions.workers) == {r.name for r in plan.roles}
    assert set(decisions.loop.offload_after_step) == {r.name for r in plan.roles} - {"ref"}  # the trained roles
    for settings in decisions.workers.values():
        assert settings.strategy in ("fsdp2", "megatron") and settings.max_seq_len > 0


def test_the_runtime_loads_the_decisions_and_refuses_a_hand_edited_section(tmp_path):
    from rlc.runtime.config import CompiledJobError, load

    out = tmp_path / "out"
    example = next(p for p in EXAMPLES if p.name == "local-cpu.yaml")
    subprocess.run(
        [sys.executable, "-m", "rlc.compiler.cli", "compile", str(example), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    job = load(out / "resolved.yaml")
    raw = json.loads((out / "plan.json").read_text())
    assert job.decisions == Decisions.from_json(raw["runtime"]) and job.plan.to_json()["roles"] == raw["roles"]
    for edit, message in [
        (lambda r: r["runtime"]["weight_sync"].update(transport=5), "malformed"),
        (lambda r: r["runtime"].pop("workers"), "malformed"),
        (lambda r: r.pop("runtime"), "not of version"),
        (lambda r: r["runtime"]["engines"].update(turbo=True), "unknown field"),
        (lambda r: r["roles"][0]["ranks"].append(r["roles"][0]["ranks"][0]), "edited by hand"),
    ]:
        broken = json.loads(json.dumps(raw))
        edit(broken)
        (out / "plan.json").write_text(json.dumps(broken))
        with pytest.raises(CompiledJobError, match=message):
            load(out / "resolved.yaml")


@pytest.mark.parametrize(
    ("example", "expected"),
    [
        # (engines, dtype, tp, distributed_executor_backend, sleep mode, max_model_len)
        ("gsm8k-grpo-8xh100.yaml", (8, "bfloat16", 1, "uni", True, 1536)),  # one GPU each: its worker in-process
        ("gsm8k-grpo-megatron-8xh100.yaml", (4, "bfloat16", 2, "ray", True, 1536)),
        ("local-cpu.yaml", None),  # the hf engine takes no vLLM arguments
    ],
)
def test_the_vllm_engine_arguments_of_the_examples(example, expected, tmp_path):
    out = tmp_path / "out"
    path = next(p for p in EXAMPLES if p.name == example)
    subprocess.run(
        [sys.executable, "-m", "rlc.compiler.cli", "compile", str(path), "-o", str(out)],
        check=True,
        capture_output=True,
    )
    raw = json.loads((out / "plan.json").read_text())
    args = Decisions.from_json(raw["runtime"]).engines.vllm
    if expected is None:
        assert args is None and raw["runtime"]["engines"]["vllm"] is None
        return
    assert args is not None
    got = (
        len(args.seeds),
        args.dtype,
        args.tensor_parallel_size,
        args.distributed_executor_backend,
        args.enable_sleep_mode,
        args.max_model_len,
    )
    assert got == expected
    assert len(args.seeds) == len(raw["inference"]["engines"]) and len(set(args.seeds)) == len(args.seeds)
    assert args.logprobs_mode == "processed_logprobs" and not args.enable_lora
    assert args.env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.mark.parametrize(
    ("rank", "strategy", "max_lora_rank"),
    [(0, "fsdp2", 0), (8, "fsdp2", 8), (20, "fsdp2", 32), (300, "fsdp2", 320), (512, "fsdp2", 512), (8, "megatron", 0)],
)
def test_vllm_lora_arguments(rank, strategy, max_lora_rank):
    args = _decisions(strategy=strategy, lora=rank, extra={"generator.inference_engine.backend": "vllm"}).engines.vllm
    assert args is not None
    assert (args.enable_lora, args.max_lora_rank, args.max_loras) == (
        max_lora_rank > 0,
        max_lora_rank,
        int(rank > 0 and strategy != "megatron"),
    )


def test_vllm_arguments_round_trip_through_json():
    d = _decisions(
        lora=16,
        extra={
            "trainer.policy.model.path": "org/model",
            "generator.inference_engine.backend": "vllm",
            "generator.inference_engine.engine_init_kwargs": {"max_logprobs": 5, "kv_cache_dtype": "fp8"},
            "generator.rope_scaling": {"rope_type": "yarn", "factor": 4.0},
            "generator.rope_theta": 500000.0,
        },
    )
    again = Decisions.from_json(json.loads(json.dumps(d.to_json())))
    assert again == d and again.engines.vllm is not None
    assert again.engines.vllm.init_kwargs == {"max_logprobs": 5, "kv_cache_dtype": "fp8"}
    assert again.engines.vllm.rope_scaling == {"rope_type": "yarn", "factor": 4.0}
    assert isinstance(again.engines.vllm.seeds, tuple)


CPU_VLLM = {
    "generator.inference_engine.backend": "vllm",
    "trainer.policy.model.path": "rlc:tiny-vllm",  # 2 layers, 1 key/value head of 32: 512 bytes a token in float32
    "trainer.train_batch_size": 16,
    "generator.n_samples_per_prompt": 8,
    "trainer.max_prompt_length": 32,
    "generator.sampling_params.max_generate_length": 2,  # 34 tokens: two blocks of 32
    "trainer.eval_interval": -1,
    "trainer.eval_before_train": False,
    "generator.inference_engine.model_dtype": "float32",
}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # a step's 16 x 8 rollouts at once, two blocks each, and vLLM's null block
        ({}, (128 * 2 + 1) * 32 * 512),
        ({"generator.inference_engine.model_dtype": "bfloat16"}, (128 * 2 + 1) * 32 * 256),
        ({"trainer.max_prompt_length": 200}, (128 * 7 + 1) * 32 * 512),  # 202 tokens: seven blocks
        ({"trainer.eval_interval": 5, "trainer.eval_batch_size": 512}, (512 * 2 + 1) * 32 * 512),  # evaluation's batch
        ({"generator.inference_engine.max_num_seqs": 64}, (64 * 2 + 1) * 32 * 512),  # vLLM runs at most that many
        ({"trainer.policy.model.path": "org/model"}, 1 << 30),  # a model rlc cannot size
    ],
)
def test_a_cpu_vllm_engine_gets_a_kv_cache_for_its_batch_and_no_sleep_mode(extra, expected):
    args = _decisions(device="CPU", extra={**CPU_VLLM, **extra}).engines.vllm
    assert args is not None
    assert args.kv_cache_memory_bytes == expected
    assert args.block_size == 32  # prefix caching shares whole blocks: a group's prompt of 32 tokens or more
    assert not args.enable_sleep_mode  # colocated, but vLLM has no sleep mode on a CPU (nothing to hand over)
    assert args.dtype == ("bfloat16" if "generator.inference_engine.model_dtype" in extra else "float32")


def test_a_gpu_vllm_engine_sizes_its_kv_cache_itself():
    args = _decisions(extra={"generator.inference_engine.backend": "vllm"}).engines.vllm
    assert args is not None and args.kv_cache_memory_bytes is None and args.enable_sleep_mode


def test_a_multi_turn_engine_holds_the_whole_conversation(spec_file):
    """Later turns send the conversation so far (up to max_input_length) as the prompt: the engine's context is that
    plus a generation, not the first prompt's length (vLLM refused the second turn of a multi-turn job)."""
    from rlc.compiler.decide import max_model_len
    from rlc.compiler.pipeline import analyze

    path = spec_file(
        """
        version: 1
        cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1}
        trainer: {logger: console, max_prompt_length: 64}
        generator:
          max_turns: 3
          max_input_length: 512
          sampling_params: {max_generate_length: 8}
        """
    )
    assert max_model_len(analyze(path, env={}).spec) == 520
    single = spec_file(
        """
        version: 1
        cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1}
        trainer: {logger: console, max_prompt_length: 64}
        generator: {max_input_length: 512, sampling_params: {max_generate_length: 8}}
        """,
        name="single.yaml",
    )
    assert max_model_len(analyze(single, env={}).spec) == 72


@pytest.mark.parametrize("lora, level", [(0, 2), (8, 1)])
def test_an_engine_sleeps_without_its_weights_unless_only_adapters_come_back(lora, level):
    """Level 2 drops the weights too (a full sync refills them); with LoRA adapter sync the base weights must stay."""
    d = _decisions(lora=lora, extra={"trainer.strategy": "fsdp2"})
    assert d.engines.adapter_sync is bool(lora)
    assert d.engines.sleep_level == level


@pytest.mark.parametrize("turns, kept", [(1, 0), (3, 2 << 30)])
def test_hf_engines_keep_a_multi_turn_steps_prompts_for_the_next_turn(turns, kept):
    assert _decisions(device="CPU", extra={"generator.max_turns": turns}).engines.prompt_cache_bytes == kept


def test_engines_capturing_routed_experts_keep_no_prompts_for_the_next_turn():
    """Routing replay: every prompt runs whole (a cached prefix was routed in an earlier call), so nothing is kept."""
    extra = {"generator.max_turns": 3, "generator.inference_engine.enable_return_routed_experts": True}
    engines = _decisions(device="CPU", extra=extra).engines
    assert engines.routed_experts and engines.prompt_cache_bytes == 0


SINGLE_UPDATE = {"trainer.train_batch_size": 16, "trainer.policy_mini_batch_size": 16}


@pytest.mark.parametrize(
    "extra, forward",
    [
        ({}, False),  # one optimizer step per batch: the current policy's log-probs are the old ones
        ({"trainer.update_epochs_per_batch": 2}, True),
        ({"trainer.policy_mini_batch_size": 8}, True),
        ({"trainer.algorithm.use_kl_in_reward": True}, True),
        ({"trainer.algorithm.off_policy_correction.tis_ratio_type": "token"}, True),
        ({"trainer.algorithm.off_policy_correction.token_mask_is_threshold_low": 0.5}, False),  # one bound: inert
        ({"trainer.fully_async.enabled": True, "trainer.update_epochs_per_batch": 2}, False),  # the rollouts' own
    ],
)
def test_the_old_log_probs_get_a_forward_pass_only_when_an_update_or_the_reward_reads_them(extra, forward):
    scoring = _decisions(colocate=False, extra={**SINGLE_UPDATE, **extra}).scoring
    assert scoring.old_logprob_pass is forward
    assert scoring.off_policy_correction is ("trainer.algorithm.off_policy_correction.tis_ratio_type" in extra)


def test_the_driver_and_its_processes_get_their_values_decided():
    d = _decisions(
        extra={
            "trainer.seed": 7,
            "generator.max_turns": 3,
            "launch.envs": {"A": 1},
            "launch.inference_envs": {"B": "x"},
        }
    )
    assert (d.loop.seed, d.scoring.multi_turn, d.loop.fully_async, d.data.seed) == (7, True, False, 7)
    assert (d.envs.every, d.envs.engines) == ({"A": "1"}, {"B": "x"})
    assert d.envs.trainer == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_deterministic_kernels_reach_every_rank_and_cublas():
    from rlc.compiler.decide import worker_settings
    from rlc.spec.model import default_model

    for on in (True, False):
        spec = default_model().to_typed({"version": 1, "trainer": {"deterministic": on}})
        assert worker_settings(spec, "policy", "cuda", None).deterministic is on
    d = _decisions(extra={"trainer.deterministic": True})
    assert d.envs.trainer["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    mine = _decisions(
        extra={"trainer.deterministic": True, "launch.trainer_envs": {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}}
    )
    assert mine.envs.trainer["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's own wins
    assert "CUBLAS_WORKSPACE_CONFIG" not in _decisions().envs.trainer


def test_each_component_of_the_loop_gets_its_own_settings():
    d = _decisions(
        extra={
            "trainer.eval_interval": -1,
            "trainer.eval_before_train": False,
            "trainer.dump_eval_results": True,
            "trainer.dump_data_batch": True,
            "trainer.export_path": "/x/exports",
            "trainer.ckpt_interval": 3,
            "trainer.algorithm.kl_ctrl.type": "adaptive",
        }
    )
    assert d.data.val_data == ()  # a run that never evaluates reads no validation rows
    assert d.evaluation.dump_to == d.loop.dump_data_batch_to == "/x/exports"
    assert (d.checkpoints.ckpt_interval, d.checkpoints.export_path) == (3, "/x/exports")
    assert d.scoring.kl.kind == "adaptive"
    plain = _decisions(
        extra={"trainer.eval_interval": 2, "trainer.dump_eval_results": False, "trainer.dump_data_batch": False}
    )
    assert plain.data.val_data and plain.evaluation.dump_to is None and plain.loop.dump_data_batch_to is None


@pytest.mark.parametrize(
    ("device", "given", "expected"),
    [
        ("GPU", None, {"method": "mtp", "num_speculative_tokens": 3}),  # SkyRL's _apply_mtp_config
        ("GPU", {"method": "mtp", "num_speculative_tokens": 1}, {"method": "mtp", "num_speculative_tokens": 1}),
        ("CPU", None, None),  # vLLM's CPU build verifies no drafts (RLC-E520): the heads train, nothing drafts
    ],
)
def test_trained_mtp_heads_draft_for_vllm_unless_told_otherwise(device, given, expected):
    extra = {
        "generator.inference_engine.backend": "vllm",
        "trainer.mtp": {"enabled": True, "num_speculative_tokens": 3, "loss_weight": 0.2},
    }
    if given:
        extra["generator.inference_engine.speculative_config"] = given
    d = _decisions(device=device, strategy="megatron", extra=extra)
    assert d.engines.vllm is not None and d.engines.vllm.speculative_config == expected
    from rlc.compiler.decide import worker_settings

    spec = default_model().to_typed({"version": 1, "trainer": {"strategy": "megatron", "mtp": extra["trainer.mtp"]}})
    assert [worker_settings(spec, role, "cuda", None).mtp_loss_weight for role in ("policy", "ref")] == [0.2, None]


@pytest.mark.parametrize("merge", [True, False])
def test_megatron_qat_and_unmerged_lora_reach_the_workers_and_engines(merge):
    """SkyRL 0.4's QAT options: the policy's fake_int4_qat and bf16_base_path for the megatron policy and ref;
    merge_lora false sends the adapters alone (the engines take LoRA), merged a plain model."""
    from rlc.compiler.decide import adapter_sync, worker_settings

    def spec(strategy):
        return default_model().to_typed(
            {
                "version": 1,
                "trainer": {
                    "strategy": strategy,
                    "policy": {
                        "model": {
                            "lora": {"rank": 8},
                            "fake_int4_qat": {
                                "enabled": True,
                                "group_size": 64,
                                "scale_divisor": 7.0,
                                "q_min": -7.0,
                                "bf16_base_path": "/models/bf16",
                            },
                        },
                        "megatron_config": {"lora_config": {"merge_lora": merge}},
                    },
                },
            }
        )

    megatron = spec("megatron")
    for role in ("policy", "ref"):
        s = worker_settings(megatron, role, "cuda", None)
        assert (s.fake_int4_qat.group_size, s.fake_int4_qat.scale_divisor, s.fake_int4_qat.q_min) == (64, 7.0, -7.0)
        assert s.weights_path == "/models/bf16"
    assert adapter_sync(megatron) is not merge
    fsdp = worker_settings(spec("fsdp2"), "policy", "cuda", None)
    assert fsdp.weights_path is None and fsdp.fake_int4_qat is None  # SkyRL's FSDP worker reads neither
    assert adapter_sync(spec("fsdp2"))
