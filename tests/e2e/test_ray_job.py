"""ray/submit.sh really submits the compiled job to a local Ray cluster, where the runtime loads it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, kill_ray_processes_under, run_rlc

pytest.importorskip("ray", reason="Ray is not installed in this environment")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster():
    home = Path(tempfile.mkdtemp(prefix="rlc-ray-home-"))
    temp = tempfile.mkdtemp(prefix="rr", dir="/tmp")  # Ray's socket paths must stay short
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "HOME": str(home),
        "RAY_AUTH_MODE": "disabled",
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    port, dash, agent = _free_port(), _free_port(), _free_port()
    # The job agent's HTTP port too: its default (52365) may be taken by a Ray instance another test started, and
    # an agent that cannot bind it never registers, so no job could be submitted.
    start = subprocess.run(
        [
            "ray",
            "start",
            "--head",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dash),
            "--include-dashboard",
            "true",
            "--dashboard-agent-listen-port",
            str(agent),
            "--num-cpus",
            "2",
            "--temp-dir",
            temp,
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if start.returncode != 0:
        pytest.skip(f"a local Ray head could not start here: {start.stderr[-500:]}")
    address = f"http://127.0.0.1:{dash}"
    try:
        _wait_for_the_job_agent(env, address)
        yield env, address
    finally:
        kill_ray_processes_under(temp)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(temp, ignore_errors=True)


def _wait_for_the_job_agent(env: dict, address: str, timeout_s: float = 120) -> None:
    """Until a trivial job is accepted: the head refuses submissions ("No available agent") until its node's job
    agent has registered, which on a loaded machine can take longer than the head's own 10 s wait."""
    deadline = time.monotonic() + timeout_s
    while True:
        probe = subprocess.run(
            ["ray", "job", "submit", "--address", address, "--no-wait", "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if probe.returncode == 0:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the Ray head at {address} accepted no job in {timeout_s:.0f} s: {probe.stderr[-500:]}")
        time.sleep(1)


@pytest.mark.slow
def test_submit_script_runs_the_runtime_check_on_ray(tmp_path, ray_cluster):
    env, address = ray_cluster
    out = tmp_path / "job"
    compiled = run_rlc("compile", str(EXAMPLES / "local-cpu.yaml"), "-o", str(out))
    assert compiled.returncode == 0, compiled.stderr
    script = out / "ray" / "submit.sh"
    assert os.access(script, os.X_OK)
    result = subprocess.run(
        ["bash", str(script)],
        env={**env, "RAY_ADDRESS": address, "RLC_RUNTIME_COMMAND": "check"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "local-cpu-grpo: config and plan load" in result.stdout + result.stderr
    assert "rlc-local-cpu-grpo-" in result.stdout + result.stderr  # the submission id from the content hash


@pytest.mark.slow
def test_rlc_launch_submits_the_ray_target(tmp_path, ray_cluster):
    env, address = ray_cluster
    out = tmp_path / "job"
    result = run_rlc(
        "launch",
        str(EXAMPLES / "local-cpu.yaml"),
        "trainer.seed=11",  # another content hash than the test above: Ray refuses a submission id twice
        "--target",
        "ray",
        "-o",
        str(out),
        env={**env, "RAY_ADDRESS": address, "RLC_RUNTIME_COMMAND": "check"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"$ {out / 'ray' / 'submit.sh'}" in result.stderr
    assert "local-cpu-grpo: config and plan load" in result.stdout + result.stderr


@pytest.mark.slow
def test_submit_script_trains_two_steps_on_ray(tmp_path, ray_cluster):
    pytest.importorskip("transformers")
    env, address = ray_cluster
    data = tmp_path / "data"
    made = run_rlc("data", "synthetic", "-o", str(data), "--train", "32", "--validation", "4")
    assert made.returncode == 0, made.stderr
    out = tmp_path / "job"
    compiled = run_rlc(
        "compile",
        str(EXAMPLES / "local-cpu.yaml"),
        "-o",
        str(out),
        f"data.train_data=['{data / 'train.parquet'}']",
        f"data.val_data=['{data / 'validation.parquet'}']",
        f"trainer.log_path={tmp_path / 'runs'}",
        f"trainer.ckpt_path={tmp_path / 'ckpts'}",
        f"trainer.export_path={tmp_path / 'exports'}",
    )
    assert compiled.returncode == 0, compiled.stderr
    result = subprocess.run(
        ["bash", str(out / "ray" / "submit.sh")],
        env={**env, "RAY_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == 0, log
    assert "trained to step 2" in log
    lines = (tmp_path / "runs" / "local-cpu-grpo" / "metrics.jsonl").read_text().splitlines()
    assert [__import__("json").loads(line)["step"] for line in lines] == [1, 2]
    assert (tmp_path / "ckpts" / "latest_ckpt_global_step.txt").read_text().strip() == "2"
