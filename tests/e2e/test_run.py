"""`rlc run` end to end on this machine: a seeded run learns, and a killed run resumes where it stopped."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, rlc_executable, run_rlc

pytest.importorskip("ray")
pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pq = pytest.importorskip("pyarrow.parquet")


def _args(tmp_path: Path, rows: int, *extra: str) -> list[str]:
    data = tmp_path / "data"
    if not (data / "train.parquet").exists():
        made = run_rlc("data", "synthetic", "-o", str(data), "--train", str(rows), "--validation", "16")
        assert made.returncode == 0, made.stderr
    return [
        str(EXAMPLES / "local-cpu.yaml"),
        "-o",
        str(tmp_path / "build"),
        "--no-progress",
        f"data.train_data=['{data / 'train.parquet'}']",
        f"data.val_data=['{data / 'validation.parquet'}']",
        f"trainer.log_path={tmp_path / 'runs'}",
        f"trainer.ckpt_path={tmp_path / 'ckpts'}",
        f"trainer.export_path={tmp_path / 'exports'}",
        *extra,
    ]


def _metrics(tmp_path: Path) -> list[dict]:
    return [
        json.loads(line) for line in (tmp_path / "runs" / "local-cpu-grpo" / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.slow
def test_local_example_learns(tmp_path, run_env):
    steps = 200
    result = run_rlc("run", *_args(tmp_path, steps * 16, "trainer.ckpt_interval=-1"), env=run_env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = [m["reward"] for m in _metrics(tmp_path)]
    assert len(rewards) == steps
    first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    assert last > 0.5 and last > 10 * first, (first, last)
    plotted = run_rlc("plot", str(tmp_path / "runs" / "local-cpu-grpo"))
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "runs" / "local-cpu-grpo" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Every estimator, policy loss, reduction and correction taken from verl, SkyRL and AReaL trains the local example two
# steps through the whole run, several to a run (a run has one estimator): the engine's log-probs handed to the loss,
# sequence-level ratios, estimators whitening over the batch or reading the policy's sum of squared probabilities, a
# greedy baseline response per prompt, mini-batch reductions the driver weighs, rows drawn again (PF-PPO), batches
# drawn per environment, masks and weights against the engine (verl's rollout correction, bypass mode, M2PO). Their
# math is held to the peers' by tests/runtime/test_peer_algorithms.py; whether each learns is
# bench/algorithm_learning.py's. An entry is overrides separated by spaces, named by the first one's value.
_A, _OPC = "trainer.algorithm", "trainer.algorithm.off_policy_correction"
PEER_ALGORITHMS = [
    f"{_A}.policy_loss_type=dppo {_A}.advantage_estimator=opo {_A}.loss_reduction=token_mean_legacy",
    f"{_A}.policy_loss_type=geo_mean {_A}.advantage_estimator=grpo_passk {_A}.pf_ppo.reweight_method=pow",
    f"{_A}.advantage_estimator=gdpo {_A}.policy_loss_type=dro {_A}.dro.beta=0.1 trainer.use_hybrid_env_sampling=true "
    "trainer.min_samples_per_env=1",
    # the driver weighs the mini-batch for the ranks (mini_batch_weights): SkyRL's prompt_mean
    f"{_A}.loss_reduction=prompt_mean {_A}.advantage_estimator=reinforce_plus_plus_baseline {_OPC}.m2po_threshold=0.01",
    f"{_A}.advantage_estimator=remax {_A}.policy_loss_type=dppo_tv {_A}.reward_clip=0.5",
    f"{_A}.policy_loss_type=bypass {_A}.bypass.loss_type=reinforce {_A}.advantage_estimator=rloo_verl "
    f"{_OPC}.tis_ratio_type=sequence {_OPC}.rejection_sampling=[token_k3] {_OPC}.rejection_threshold_high=[0.5]",
    f"{_A}.advantage_estimator=optimal_token_baseline {_A}.policy_loss_type=dppo_kl",
    f"{_A}.advantage_estimator=tir_optimal_token_baseline {_OPC}.tis_ratio_type=token "
    f"{_OPC}.rejection_sampling=[seq_mean_k3] {_OPC}.rejection_threshold_high=[0.5]",
    f"{_A}.advantage_estimator=gpg {_A}.policy_loss_type=gpg",
    f"{_A}.advantage_estimator=reinforce++_verl {_A}.policy_loss_type=bypass",
]


@pytest.mark.slow
@pytest.mark.parametrize("setting", PEER_ALGORITHMS, ids=lambda s: s.split()[0].rpartition("=")[2])
def test_peer_algorithm_trains_the_local_example(tmp_path, run_env, setting):
    steps = 2
    args = _args(tmp_path, steps * 16, "trainer.ckpt_interval=-1", *setting.split())
    result = run_rlc("run", *args, env=run_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _metrics(tmp_path)
    assert len(metrics) == steps
    assert all(m["grad_norm"] == m["grad_norm"] and abs(m["policy_loss"]) < 1e3 for m in metrics), metrics
    if "advantage_estimator=remax" in setting:  # each step's greedy responses were scored: their mean is reported
        assert all(0.0 <= m["greedy_reward"] <= 1.0 for m in metrics), metrics

    if "rejection_sampling=[token_k3]" in setting:  # bypass mode: the correction ran in the loss, not in scoring
        assert all("rejection_token_k3_token_fraction" in m and "rejected_fraction" in m for m in metrics), metrics


# A reward file of the user's, in verl's signature: its own score, then DAPO's overlong penalty on top; two
# components of its dict for GDPO to normalise apart.
REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, right=1.0, **kwargs):
    same = solution_str[:1] == str(ground_truth)
    return {"score": right if same else 0.25, "same": same, "digit": float(solution_str[:1].isdigit())}
"""


@pytest.mark.slow
def test_a_users_reward_file_and_the_overlong_penalty_train_the_local_example(tmp_path, run_env):
    """env_class reward_function through `rlc run` (the file's text carried in resolved.yaml, loaded in the run's
    workers) with trainer.algorithm.overlong_buffer_len: each row's reward is the function's score plus the penalty
    of its length, exactly; GDPO takes two entries of the function's dict as its components (a row without them
    would stop the run)."""
    steps = 2
    (tmp_path / "my_reward.py").write_text(REWARD_FILE)
    setting = (
        "environment.env_class=reward_function",
        "environment.skyrl_gym.reward_function.path=my_reward.py",
        "environment.skyrl_gym.reward_function.kwargs={right: 2.0}",
        "trainer.algorithm.overlong_buffer_len=1",
        "trainer.algorithm.overlong_buffer_penalty_factor=0.5",
        "trainer.algorithm.advantage_estimator=gdpo",
        "trainer.algorithm.gdpo_reward_keys=[same, digit]",
        "trainer.dump_data_batch=true",
    )
    args = _args(tmp_path, steps * 16, "trainer.ckpt_interval=-1", *setting)
    for split in ("train", "validation"):  # the rows without their env_class column: environment.env_class scores
        path = tmp_path / "data" / f"{split}.parquet"
        pq.write_table(pq.read_table(path).drop_columns(["env_class"]), path)
    result = run_rlc("run", *args, env=run_env, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "def compute_score" in (tmp_path / "build" / "resolved.yaml").read_text()
    assert len(_metrics(tmp_path)) == steps
    for step in range(1, steps + 1):
        with (tmp_path / "exports" / "dumped_data" / f"global_step_{step}_training_input.pkl").open("rb") as f:
            batch = pickle.load(f)
        lengths = batch["attention_mask"][:, batch["prompt_len"] :].sum(-1)
        penalty = torch.clamp(-(lengths - 1) / 1 * 0.5, max=0.0)  # max_generate_length 2, a buffer of 1
        scores = batch["token_rewards"].sum(-1) - penalty
        assert set(scores.tolist()) <= {2.0, 0.25} and (penalty < 0).any(), (scores, lengths)
        assert torch.isfinite(batch["advantages"]).all()


def _weights(step_dir: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = step_dir.parent / f"{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir / "policy"), str(out))
    return torch.load(out, weights_only=False)["model"]


@pytest.mark.slow
def test_killed_run_resumes_at_its_last_checkpoint(tmp_path, run_env):
    steps = 8
    # Two ranks: the checkpoint is really sharded (DCP) and both ranks' RNG and optimizer state come back.
    common = (
        "trainer.ckpt_interval=2",
        "trainer.max_ckpts_to_keep=-1",
        "cluster.gpus_per_node=2",
        "trainer.micro_train_batch_size_per_gpu=16",
    )
    straight = tmp_path / "straight"
    straight.mkdir()
    done = run_rlc("run", *_args(straight, steps * 16, *common), env=run_env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    killed.mkdir()
    args = _args(killed, steps * 16, *common, "trainer.resume_mode=latest")
    proc = subprocess.Popen(
        [rlc_executable(), "run", *args],
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    marker = killed / "ckpts" / "latest_ckpt_global_step.txt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if marker.exists() and marker.read_text().strip() not in ("", "2"):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before its second checkpoint"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    saved = int(marker.read_text())
    assert 4 <= saved < steps

    resumed = run_rlc("run", *args, env=run_env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {killed / 'ckpts' / f'global_step_{saved}'} at step {saved}" in resumed.stderr
    assert [m["step"] for m in _metrics(killed)] == list(range(1, steps + 1))
    a = _weights(straight / "ckpts" / f"global_step_{steps}")
    b = _weights(killed / "ckpts" / f"global_step_{steps}")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_ppo_with_critic_reference_eval_and_export(tmp_path, run_env):
    extra = (
        "trainer.algorithm.use_kl_loss=true",
        "trainer.critic.model.path=rlc:tiny",
        "trainer.algorithm.advantage_estimator=gae",
        "trainer.critic_mini_batch_size=8",
        "trainer.micro_train_batch_size_per_gpu=64",
        "trainer.ckpt_interval=2",
        "trainer.hf_save_interval=3",
        "trainer.eval_interval=2",
        "trainer.eval_before_train=true",
        "trainer.dump_data_batch=true",
    )
    result = run_rlc("run", *_args(tmp_path, 48, *extra), env=run_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert "eval/reward" in metrics[0] and "eval/reward" in metrics[2]
    assert all("critic/critic_loss" in m and "kl" in m for m in metrics[1:])
    # the step's phases as `rlc plan` estimates them (docs/estimate.md): wall and CPU seconds, adding up to the step's
    phases = ("generate", "log_prob_forwards", "train", "weight_sync")
    # each logged value is rounded to 6 places (runtime/tracking.py): five roundings apart at most
    rounding = 5 * 0.5e-6
    for m in metrics[1:]:
        assert m["timing/step"] == pytest.approx(sum(m[f"timing/{k}"] for k in phases), abs=rounding)
        assert m["timing/cpu/step"] == pytest.approx(sum(m[f"timing/cpu/{k}"] for k in phases), abs=rounding)
        assert m["timing/step"] == pytest.approx(m["step_time"], abs=rounding)
    assert sum(m["timing/cpu/step"] for m in metrics[1:]) > 0
    assert (
        metrics[1]["kl"] == pytest.approx(0.0, abs=1e-6) and metrics[3]["kl"] > 0
    )  # the policy moved away from the reference
    last = tmp_path / "ckpts" / "global_step_3"
    assert (last / "critic" / ".metadata").exists() and (last / "policy" / ".metadata").exists()
    export = tmp_path / "exports" / "global_step_3"
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(export / "policy")
    trained = _weights(last)
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, trained[name], msg=name)
    assert (export / "critic" / "critic.pt").exists()
    # SkyRL's debug output: each step's training batch, each evaluation's completions and metrics
    dumped = tmp_path / "exports" / "dumped_data"
    assert sorted(p.name for p in dumped.iterdir()) == [f"global_step_{s}_training_input.pkl" for s in (1, 2, 3)]
    with (dumped / "global_step_1_training_input.pkl").open("rb") as f:
        batch = pickle.load(f)
    assert batch["advantages"].shape == batch["loss_mask"].shape and "old_values" in batch
    for step in (0, 2):
        evals = tmp_path / "exports" / "dumped_evals" / f"global_step_{step}_evals"
        aggregated = json.loads((evals / "aggregated_results.jsonl").read_text())
        assert aggregated["eval/reward"] == pytest.approx(metrics[step]["eval/reward"])
        lines = [
            json.loads(x)
            for f in evals.glob("*.jsonl")
            if f.name != "aggregated_results.jsonl"
            for x in f.read_text().splitlines()
        ]
        assert len(lines) == 16 and all(
            {"input_prompt", "output_response", "score", "stop_reason"} <= set(x) for x in lines
        )


@pytest.mark.slow
def test_megatron_tensor_parallel_run_checkpoints_and_exports(tmp_path, run_env, tiny_model):
    """strategy megatron on two CPU slots (tp=2, through megatron_cpu), with a reference model for the KL loss and a
    critic (PPO with GAE) on Megatron too. (Resuming a Megatron checkpoint in fresh workers, on another layout, is in
    test_megatron.py; the critic against fsdp2's, in test_megatron_critic.py.)"""
    pytest.importorskip("megatron.core")
    extra = (
        "trainer.strategy=megatron",
        "cluster.gpus_per_node=2",
        "trainer.policy.megatron_config.tensor_model_parallel_size=2",
        "trainer.algorithm.use_kl_loss=true",
        "trainer.critic.model.path=rlc:tiny",
        "trainer.algorithm.advantage_estimator=gae",
        "trainer.critic_mini_batch_size=8",
        "trainer.critic.megatron_config.tensor_model_parallel_size=2",
        "trainer.micro_train_batch_size_per_gpu=64",
        "trainer.ckpt_interval=2",
        "trainer.hf_save_interval=4",
    )
    result = run_rlc("run", *_args(tmp_path, 64, *extra), env=run_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Apex is not installed" not in result.stderr
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert (
        metrics[0]["kl"] == pytest.approx(0.0, abs=1e-6) and metrics[-1]["kl"] > 0
    )  # the policy moved from the reference
    assert all(m["grad_norm"] > 0 for m in metrics)
    assert all(m["critic/critic_loss"] > 0 for m in metrics)
    for role in ("policy", "critic"):  # Megatron's dist checkpoints
        assert (tmp_path / "ckpts" / "global_step_2" / role / "metadata.json").exists()
    assert (tmp_path / "exports" / "global_step_4" / "critic" / "critic.pt").exists()
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exports" / "global_step_4" / "policy").state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()  # the same seeded build as the run's
    assert exported.keys() == start.keys()
    assert sum(not torch.equal(exported[k], start[k]) for k in start) > len(start) // 2


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "launch"])
def test_a_tracker_that_cannot_start_stops_the_run_before_ray(tmp_path, run_env, command):
    """Also through `rlc launch`: local-cpu.yaml says launch.target: local, so the runtime runs here."""
    try:
        import tensorboard  # noqa: F401

        pytest.skip("tensorboard is installed here")
    except ImportError:
        pass
    args = _args(tmp_path, 32, "trainer.logger=tensorboard")
    if command == "launch":
        args = [a for a in args if a != "--no-progress"]
    result = run_rlc(command, *args, env=run_env, timeout=300)
    assert result.returncode == 1
    assert "trainer.logger is tensorboard" in result.stderr and "Traceback" not in result.stderr
    assert "Started a local Ray instance" not in result.stderr
    if command == "launch":
        assert f"-m rlc.runtime run {tmp_path / 'build' / 'resolved.yaml'}" in result.stderr


@pytest.mark.slow
def test_a_gpu_plan_stops_before_any_model_loads_on_a_machine_without_its_gpus(tmp_path, run_env):
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    result = run_rlc(
        "run", *_args(tmp_path, 32, "cluster.accelerator=H100", "trainer.bf16=true"), env=run_env, timeout=300
    )
    assert result.returncode != 0
    assert "the plan needs 1 node(s) with 1 GPUs each, but Ray has 0 such node(s)" in result.stderr, result.stderr[
        -2000:
    ]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs" / "local-cpu-grpo" / "metrics.jsonl").exists() or not _metrics(tmp_path)


@pytest.mark.slow
def test_lora_trains_only_adapters_and_exports_them_merged(tmp_path, run_env):
    pytest.importorskip("peft")
    extra = (
        "trainer.policy.model.lora.rank=8",
        "trainer.policy.model.lora.alpha=16",
        "trainer.hf_save_interval=3",
        "trainer.ckpt_interval=-1",
    )
    result = run_rlc("run", *_args(tmp_path, 48, *extra), env=run_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FutureWarning" not in result.stderr
    assert [m["step"] for m in _metrics(tmp_path)] == [1, 2, 3]
    from rlc.runtime.models import local_path
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(local_path("rlc:tiny")).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "exports" / "global_step_3" / "policy").state_dict()
    assert merged.keys() == base.keys()  # a plain model: the adapters are merged in
    moved = [k for k in base if not torch.equal(base[k], merged[k])]
    assert moved and all(k.endswith("proj.weight") for k in moved), moved  # only adapted linear layers changed
    assert torch.equal(base["model.embed_tokens.weight"], merged["model.embed_tokens.weight"])


@pytest.mark.slow
def test_delta_weight_sync_through_s3_leaves_the_engine_with_the_trainers_weights(tmp_path, s3_bucket, run_env):
    """weight_sync_backend: delta on an S3-compatible store (moto's server): each sync is a version in the bucket, and
    after the last one the engine's patched checkpoint is the trainer's last step, as its export holds it."""
    copy = tmp_path / "engine-copy"
    extra = (
        "generator.inference_engine.weight_sync_backend=delta",
        f"generator.inference_engine.delta_weight_sync.sync_dir={s3_bucket}",
        f"generator.inference_engine.delta_weight_sync.local_checkpoint_dir={copy}",
        "trainer.hf_save_interval=3",
        "trainer.ckpt_interval=-1",
    )
    aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    result = run_rlc("run", *_args(tmp_path, 48, *extra), env={**run_env, **aws}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    from rlc.runtime.weights.storage import open_store
    from safetensors.torch import load_file

    # one version before the first step (the weights as loaded: no tensor changed), one after each step
    manifests = [json.loads(open_store(f"{s3_bucket}/delta-{v:08d}").get("manifest.json")) for v in (1, 2, 3, 4)]
    assert [(m["version"], m["base_version"]) for m in manifests] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert json.loads((copy / ".skyrl_weight_sync" / "state.json").read_text())["version"] == 4
    engine = load_file(copy / "weights" / "model.safetensors")
    trainer = load_file(tmp_path / "exports" / "global_step_3" / "policy" / "model.safetensors")
    assert engine.keys() == trainer.keys() and all(torch.equal(engine[k], trainer[k]) for k in engine)


@pytest.mark.slow
def test_an_unreachable_remote_engine_is_a_clear_error(tmp_path, run_env):
    extra = (
        "generator.inference_engine.run_engines_locally=false",
        "generator.inference_engine.remote_urls=['127.0.0.1:9']",
        "trainer.placement.colocate_all=false",
    )
    env = {**run_env, "RLC_ENGINE_CONNECT_TIMEOUT_S": "3"}
    result = run_rlc("run", *_args(tmp_path, 32, *extra), env=env, timeout=600)
    assert result.returncode != 0
    assert "a remote inference engine cannot be used" in result.stderr and "127.0.0.1:9" in result.stderr, (
        result.stderr[-2000:]
    )
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_remote_engines_generate_and_take_weights_over_their_weight_group(tmp_path, run_env):
    """A remote server (`python -m rlc.runtime.inference.http`) left in a gone trainer's weight-update group:
    override_existing_update_group=disable stops the run before any step with one line naming that group; the
    default (auto) replaces it, and the server generates every step and takes every step's weights over it."""
    from concurrent.futures import ThreadPoolExecutor

    from rlc.runtime.inference.http import RemoteEngine
    from rlc.runtime.weights.broadcast import close_group, init_group
    from rlc.runtime.workers.fsdp import free_address

    port = free_address()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlc.runtime.inference.http",
            "--model",
            "rlc:tiny",
            "--port",
            str(port),
            "--name",
            "tiny",
        ],
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = RemoteEngine(f"127.0.0.1:{port}", model_name="tiny", timeout_s=60, connect_timeout_s=120)
        client.connect()
        gone = free_address()[1]
        with ThreadPoolExecutor(1) as pool:  # a trainer forms a group with the server, then goes away
            trainer = pool.submit(init_group, "127.0.0.1", gone, 0, 2, "gloo", timeout_s=60)
            client.init_weight_group("127.0.0.1", gone, 1, 2, "gloo")
            close_group(trainer.result(timeout=60))
        extra = (
            "generator.inference_engine.run_engines_locally=false",
            f"generator.inference_engine.remote_urls=['127.0.0.1:{port}']",
            "generator.inference_engine.served_model_name=tiny",
            "trainer.placement.colocate_all=false",
            "trainer.ckpt_interval=-1",
        )
        disable = "generator.inference_engine.override_existing_update_group=disable"
        refused = run_rlc("run", *_args(tmp_path, 48, *extra, disable), env=run_env, timeout=600)
        assert refused.returncode != 0
        lines = [line for line in refused.stderr.splitlines() if "cannot join the weight-update group" in line]
        assert len(lines) == 1, refused.stderr[-3000:]
        assert f"127.0.0.1:{port}" in lines[0] and f"master is 127.0.0.1:{gone}" in lines[0] and "enable" in lines[0]
        assert "Traceback" not in refused.stderr
        assert client.weight_group()["master_port"] == gone
        result = run_rlc("run", *_args(tmp_path, 48, *extra), env=run_env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert [m["step"] for m in _metrics(tmp_path)] == [1, 2, 3]
        joined = client.weight_group()
        assert joined["master_port"] != gone and joined["backend"] == "gloo"
        assert client._call("GET", "/rlc/weight_version")["weight_version"] == 3
    finally:
        server.kill()
        server.wait(timeout=30)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_colocated_gpu_run_syncs_weights_through_cuda_ipc_buckets(tmp_path, run_env):
    """The policy and the hf engine share one GPU (colocate_all, nccl): weights travel as CUDA-IPC buckets of
    about 50 KB, so every sync takes many of them."""
    extra = (
        "cluster.accelerator=H100",
        "trainer.bf16=true",
        "generator.inference_engine.model_dtype=bfloat16",
        "generator.inference_engine.weight_sync_backend=nccl",
        "trainer.placement.colocate_all=true",
        "generator.inference_engine.weight_transfer_threshold_cuda_ipc_GB=0.00005",
        "trainer.ckpt_interval=-1",
    )
    result = run_rlc("run", *_args(tmp_path, 48, *extra), env=run_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["sync_time"] > 0 for m in metrics)
