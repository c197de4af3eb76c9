"""The Slurm target against a real Slurm: Debian's slurm-wlm and munge, started here as root (tools/slurmsim.py).

One cluster for the module: two simulated hosts (network namespaces, each slurmd with its own address) where the
machine can make them, else one node. `rlc launch` submits the compiled batch script with sbatch; it starts Ray on
every node with srun, trains, and leaves no process behind when it ends or is cancelled; a rerun resumes from the
last checkpoint. sbatch itself reads the quoted `#SBATCH` values back exactly as written in the spec.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, multinode_overrides, run_rlc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import slurmsim  # noqa: E402

pytest.importorskip("ray")
pytest.importorskip("torch")

REASON = slurmsim.why_unavailable(1)
TWO_HOSTS_REASON = REASON or slurmsim.why_unavailable(2)
HOSTS = 1 if TWO_HOSTS_REASON else 2
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=f"no Slurm here: {REASON}")]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with slurmsim.SlurmCluster(HOSTS, tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture
def job_env(tmp_path, rlc_cache):
    """What the submitting shell exports to the job: rlc's environment first on PATH, a private HOME."""
    bin_dir = str(Path(sys.executable).parent)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "RLC_CACHE": str(rlc_cache),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
    }


def _overrides(tmp_path: Path, name: str, steps: int, *extra: str) -> list[str]:
    """The local example on every node x 1 CPU slot, as a Slurm job."""
    return [
        *multinode_overrides(tmp_path, name, steps, HOSTS),
        "launch.target=slurm",
        f"launch.ray_port={slurmsim._free_port()}",  # one host: the machine's network, where other tests run Ray
        *extra,
    ]


def _compile(tmp_path: Path, name: str, steps: int, *extra: str) -> Path:
    out = tmp_path / name
    result = run_rlc(
        "compile", str(EXAMPLES / "local-cpu.yaml"), "-o", str(out), *_overrides(tmp_path, name, steps, *extra)
    )
    assert result.returncode == 0, result.stderr
    return out / "slurm" / "job.sbatch"


def _submit(slurm, script: Path, env: dict, *args: str) -> str:
    p = slurm.run("sbatch", "--parsable", *args, str(script), env=env, cwd=script.parent)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def _output(directory: Path, job: str) -> str:
    """The job's output: Slurm writes slurm-<id>.out in the directory sbatch ran in."""
    path = directory / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _left_behind(job: str) -> list:
    """Processes of the job still running: every process Slurm starts for it carries SLURM_JOB_ID in its environment."""
    import psutil

    left = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            if (proc.info["environ"] or {}).get("SLURM_JOB_ID") == job:
                left.append(proc.info["cmdline"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return left


def _gone(job: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while _left_behind(job) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _left_behind(job), _left_behind(job)
    shutil.rmtree(f"/tmp/rlc-{job}", ignore_errors=True)  # Ray's files of the job (its logs are kept)


def _metrics(tmp_path: Path, name: str) -> list[dict]:
    path = tmp_path / "runs" / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_launch_trains_on_every_node_a_cancel_leaves_nothing_and_a_rerun_resumes(slurm, tmp_path, job_env):
    """`rlc launch` submits the job; once a checkpoint is written, scancel stops it and every Ray process with it;
    the same script submitted again continues from that checkpoint to the end, each node holding its plan node."""
    steps, name = 4, "slurm-resume"
    extra = ["trainer.ckpt_interval=1", "trainer.resume_mode=latest", "trainer.max_ckpts_to_keep=-1"]
    out = tmp_path / name
    overrides = _overrides(tmp_path, name, steps, *extra)
    launched = run_rlc(
        "launch", str(EXAMPLES / "local-cpu.yaml"), "-o", str(out), *overrides, env=slurm.env(job_env), cwd=tmp_path
    )
    assert launched.returncode == 0, launched.stderr
    job = re.search(r"Submitted batch job (\d+)", launched.stdout).group(1)
    script = out / "slurm" / "job.sbatch"
    assert f"sbatch {script}\n" in launched.stderr  # what rlc launch ran

    marker = tmp_path / "ckpts" / name / "latest_ckpt_global_step.txt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not marker.exists():
        assert slurm.job(job).get("JobState") in ("PENDING", "RUNNING"), _output(tmp_path, job)
        time.sleep(0.2)
    assert slurm.run("scancel", job).returncode == 0
    state = slurm.wait(job, 60)
    assert state["JobState"] == "CANCELLED", state
    _gone(job)
    saved = int(marker.read_text())
    assert 1 <= saved < steps

    rerun = _submit(slurm, script, job_env)
    state = slurm.wait(rerun, 600)
    log = _output(script.parent, rerun)
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", log[-3000:]
    _gone(rerun)
    assert f"resumed from {tmp_path / 'ckpts' / name / f'global_step_{saved}'} at step {saved}" in log, log[-3000:]
    assert f"{HOSTS} node(s) with {HOSTS} CPU joined the Ray cluster" in log
    assert "srun: error" not in log and "CANCELLED" not in log, log[-3000:]  # Ray stopped cleanly on every node
    assert [m["step"] for m in _metrics(tmp_path, name)][-1] == steps
    placed = json.loads((tmp_path / "runs" / name / "placement.json").read_text())
    ips = {r["ip"] for r in placed["roles"]["policy"]}  # one rank on each Slurm node (one host: its own address)
    assert len(ips) == HOSTS and (HOSTS == 1 or ips == {n.addr for n in slurm.nodes})


def test_before_its_time_limit_the_job_saves_its_last_step_requeues_itself_and_resumes(slurm, tmp_path, job_env):
    """Slurm's warning before the time limit (`--signal=B:USR1@grace`, sent here at once with scancel): the trainer
    saves its last finished step though no checkpoint was due, the job goes back to the queue, and when it runs
    again it resumes from that step and trains to the end, no step lost or run twice."""
    steps, name = 4, "slurm-requeue"
    extra = ["trainer.ckpt_interval=100", "trainer.resume_mode=latest"]  # no checkpoint falls due by itself
    script = _compile(tmp_path, name, steps, *extra)
    job = _submit(slurm, script, job_env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _metrics(tmp_path, name):
        assert slurm.job(job).get("JobState") in ("PENDING", "RUNNING"), _output(script.parent, job)
        time.sleep(0.2)
    assert slurm.run("scancel", "--batch", "--signal=USR1", job).returncode == 0
    deadline, state = time.monotonic() + 600, {}
    while time.monotonic() < deadline:
        state = slurm.job(job)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            break
        if state.get("JobState") == "PENDING" and "BeginTime" in state:  # a requeued job may wait for its begin time
            slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
        time.sleep(0.5)
    log = _output(script.parent, job)  # --open-mode=append: both runs' output in one file
    assert state.get("JobState") == "COMPLETED" and int(state.get("Restarts", "0")) >= 1, (state, log[-3000:])
    _gone(job)
    saved = re.search(
        r"stopped by SIGTERM after step (\d+); the newest complete checkpoint is \S+/global_step_(\d+)", log
    )
    assert saved and saved.group(1) == saved.group(2) and "back in the queue" in log, log[-3000:]
    step = int(saved.group(1))
    assert f"resumed from {tmp_path / 'ckpts' / name / f'global_step_{step}'} at step {step}" in log, log[-3000:]
    assert [m["step"] for m in _metrics(tmp_path, name)] == list(range(1, steps + 1))


@pytest.mark.skipif(HOSTS < 2, reason=f"one Slurm node only: {TWO_HOSTS_REASON}")
@pytest.mark.parametrize("fault", ["hangs", "fails"])
def test_a_node_whose_ray_never_joins_fails_the_job_clearly(slurm, tmp_path, job_env, fault):
    """The second node's setup hangs, so its Ray never joins: the head gives up after launch.node_wait_timeout_s,
    naming the missing address. Or its setup fails: the job fails as soon as that node's step ended. Either way
    the job ends failed with nothing left running."""
    worker = slurm.nodes[1].name
    act = "sleep 600" if fault == "hangs" else "exit 3"
    script = _compile(
        tmp_path,
        f"slurm-{fault}",
        1,
        "launch.node_wait_timeout_s=10",
        f"""launch.setup=['if [ "$SLURMD_NODENAME" = {worker} ]; then echo "$SLURMD_NODENAME {fault}" >&2; {act}; fi']""",
    )
    job = _submit(slurm, script, job_env)
    state = slurm.wait(job, 300)
    log = _output(script.parent, job)
    assert state["JobState"] == "FAILED", log[-3000:]
    assert f"{worker} {fault}" in log, log[-3000:]
    if fault == "hangs":
        assert "after 10 s the Ray cluster" in log and "has 1 of 2 node(s)" in log, log[-3000:]
        assert f"Missing 1 node(s) ({slurm.nodes[1].addr})" in log, log[-3000:]
    else:
        assert f"{worker}: task 0: Exited with exit code 3" in log, log[-3000:]
        assert "Ray stopped on a node before every node joined" in log and "after 10 s" not in log, log[-3000:]
    assert not _metrics(tmp_path, f"slurm-{fault}")
    _gone(job)


def test_sbatch_reads_every_quoted_option_back_as_written(slurm, tmp_path, job_env):
    """Values with spaces, quotes, '#', '$' and backslashes reach Slurm unchanged; the held job never runs."""
    comment = """it's "quoted" # not a comment, $HOME \\ too"""
    script = _compile(
        tmp_path,
        "slurm-quoted",
        1,
        "launch.slurm.partition=debug",
        "launch.slurm.time_limit=0-00:05",
        "launch.slurm.sbatch_args=" + json.dumps(["--hold", f"--comment={comment}"]),
    )
    job = _submit(slurm, script, job_env)
    fields = slurm.job(job)
    assert fields["JobState"] == "PENDING" and fields["Partition"] == "debug" and fields["TimeLimit"] == "00:05:00"
    shown = slurm.run("squeue", "-h", "-j", job, "-o", "%k")
    assert shown.stdout.rstrip("\n") == comment
    assert slurm.run("scancel", job).returncode == 0


def test_a_missing_secret_fails_the_job_before_anything_starts(slurm, tmp_path, job_env):
    script = _compile(tmp_path, "slurm-secret", 1, "launch.secrets=[RLC_SLURM_TEST_SECRET]")
    assert "RLC_SLURM_TEST_SECRET" in script.read_text()
    job = _submit(slurm, script, {k: v for k, v in job_env.items() if k != "RLC_SLURM_TEST_SECRET"})
    state = slurm.wait(job, 120)
    log = _output(script.parent, job)
    assert state["JobState"] == "FAILED", log
    assert "the secret RLC_SLURM_TEST_SECRET is not set" in log and "Ray runtime started" not in log, log
    _gone(job)


def test_an_environment_without_rlc_fails_the_job_saying_so(slurm, tmp_path, job_env):
    """The job runs in the environment sbatch was called from: one whose python3 lacks rlc's runtime is named."""
    script = _compile(tmp_path, "slurm-no-rlc", 1)
    job = _submit(slurm, script, {**job_env, "PATH": "/usr/bin:/bin"})
    state = slurm.wait(job, 120)
    log = _output(script.parent, job)
    assert state["JobState"] == "FAILED", log
    assert "cannot import ray, rlc.runtime" in log and "Ray runtime started" not in log, log
    _gone(job)
