"""`rlc run` end to end on this machine: a seeded run learns, and a killed run resumes where it stopped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, rlc_executable, run_rlc

pytest.importorskip("ray")
pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture
def run_env(tmp_path):
    """A private HOME and Ray temp dir; Ray processes a killed run leaves behind are stopped afterwards."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "HOME": str(tmp_path / "home"), "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp,
           "RAY_USAGE_STATS_ENABLED": "0"}
    yield env
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(ray_tmp in part for part in proc.info["cmdline"] or ()):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _args(tmp_path: Path, rows: int, *extra: str) -> list[str]:
    data = tmp_path / "data"
    if not (data / "train.parquet").exists():
        made = run_rlc("data", "synthetic", "-o", str(data), "--train", str(rows), "--validation", "16")
        assert made.returncode == 0, made.stderr
    return [str(EXAMPLES / "local-cpu.yaml"), "-o", str(tmp_path / "build"), "--no-progress",
            f"data.train_data=['{data / 'train.parquet'}']", f"data.val_data=['{data / 'validation.parquet'}']",
            f"trainer.log_path={tmp_path / 'runs'}", f"trainer.ckpt_path={tmp_path / 'ckpts'}",
            f"trainer.export_path={tmp_path / 'exports'}", *extra]


def _metrics(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "runs" / "local-cpu-grpo" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_local_example_learns(tmp_path, run_env):
    steps = 120
    result = run_rlc("run", *_args(tmp_path, steps * 16, "trainer.ckpt_interval=-1"), env=run_env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = [m["reward"] for m in _metrics(tmp_path)]
    assert len(rewards) == steps
    first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    assert last > 0.25 and last > 5 * first, (first, last)
    plotted = run_rlc("plot", str(tmp_path / "runs" / "local-cpu-grpo"))
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "runs" / "local-cpu-grpo" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _weights(step_dir: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = step_dir.parent / f"{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir / "policy"), str(out))
    return torch.load(out, weights_only=False)["model"]


@pytest.mark.slow
def test_killed_run_resumes_at_its_last_checkpoint(tmp_path, run_env):
    steps = 8
    # Two ranks: the checkpoint is really sharded (DCP) and both ranks' RNG and optimizer state come back.
    common = ("trainer.ckpt_interval=2", "trainer.max_ckpts_to_keep=-1", "cluster.gpus_per_node=2",
              "trainer.micro_train_batch_size_per_gpu=16")
    straight = tmp_path / "straight"
    straight.mkdir()
    done = run_rlc("run", *_args(straight, steps * 16, *common), env=run_env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    killed = tmp_path / "killed"
    killed.mkdir()
    args = _args(killed, steps * 16, *common, "trainer.resume_mode=latest")
    proc = subprocess.Popen([rlc_executable(), "run", *args], env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
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
    extra = ("trainer.algorithm.use_kl_loss=true", "trainer.critic.model.path=rlc:tiny", "trainer.algorithm.advantage_estimator=gae",
             "trainer.critic_mini_batch_size=8", "trainer.ckpt_interval=2", "trainer.hf_save_interval=3",
             "trainer.eval_interval=2", "trainer.eval_before_train=true")
    result = run_rlc("run", *_args(tmp_path, 48, *extra), env=run_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert "eval/reward" in metrics[0] and "eval/reward" in metrics[2]
    assert all("critic/critic_loss" in m and "kl" in m for m in metrics[1:])
    assert metrics[1]["kl"] == pytest.approx(0.0, abs=1e-6) and metrics[3]["kl"] > 0  # the policy moved away from the reference
    last = tmp_path / "ckpts" / "global_step_3"
    assert (last / "critic" / ".metadata").exists() and (last / "policy" / ".metadata").exists()
    export = tmp_path / "exports" / "global_step_3"
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(export / "policy")
    trained = _weights(last)
    for name, value in exported.state_dict().items():
        torch.testing.assert_close(value, trained[name], msg=name)
    assert (export / "critic" / "critic.pt").exists()


def test_a_tracker_that_cannot_start_stops_the_run_before_ray(tmp_path, run_env):
    try:
        import tensorboard  # noqa: F401
        pytest.skip("tensorboard is installed here")
    except ImportError:
        pass
    result = run_rlc("run", *_args(tmp_path, 32, "trainer.logger=tensorboard"), env=run_env, timeout=300)
    assert result.returncode == 1
    assert "trainer.logger is tensorboard" in result.stderr and "Traceback" not in result.stderr
    assert "Started a local Ray instance" not in result.stderr
