"""The compiled SkyPilot task and Ray job on simulated hosts (network namespaces): tools/skysim.py.

Two hosts, each its own network namespace and address, run the task's setup and run sections as SkyPilot
would. Ray forms across them through the generated script alone, the plan's placement groups put each
rank and engine on the host plan.json says, and the job trains; a missing host and a host killed
mid-run fail with clear messages, and a rerun resumes from the last complete checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, multinode_overrides, run_rlc

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import skysim  # noqa: E402

pytest.importorskip("ray")
pytest.importorskip("torch")

REASON = skysim.why_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=f"no simulated hosts here: {REASON}")]


def _compile(tmp_path: Path, name: str, steps: int, *extra: str) -> Path:
    """The local example on 2 nodes x 1 CPU slot, its data and outputs on the (shared) test directory."""
    out = tmp_path / name
    overrides = multinode_overrides(tmp_path, name, steps, 2)
    result = run_rlc("compile", str(EXAMPLES / "local-cpu.yaml"), "-o", str(out), *overrides, *extra)
    assert result.returncode == 0, result.stderr
    return out


def _metrics(tmp_path: Path, name: str) -> list[dict]:
    path = tmp_path / "runs" / name / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _log(work: Path, kind: str, host: int) -> str:
    path = work / "logs" / f"{kind}-{host}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _gone(cluster: skysim.Cluster) -> None:
    """After the cluster closed: no namespace left, no process of its hosts left."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [n for n in cluster.names if n in listed], listed
    import psutil

    left = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = proc.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(env.get("RAY_TMPDIR") == str(h.ray_tmp) for h in cluster.members):
            left.append(proc.info["cmdline"])
    assert not left, left


def test_the_sky_task_across_two_hosts_a_missing_and_a_killed_host_a_resume_and_the_ray_job(tmp_path):
    """One simulated cluster, in turn: a host that never starts fails the head clearly; with both hosts the job
    trains until one host dies, which stops it naming its last checkpoint; the task run again resumes there and
    finishes, every rank and engine on the host the plan names; `ray/submit.sh` then trains on the same head."""
    steps = 8
    job = _compile(
        tmp_path,
        "sim-kill",
        steps,
        "trainer.ckpt_interval=2",
        "trainer.resume_mode=latest",
        "trainer.max_ckpts_to_keep=-1",
    )  # first: it writes the data (steps x 16 rows) the jobs read
    missing = _compile(tmp_path, "sim-missing", steps, "launch.node_wait_timeout_s=10")
    small = tmp_path / "data-submit"  # 2 steps' rows: the Ray job only has to show it trains there
    made = run_rlc("data", "synthetic", "-o", str(small), "--train", "32", "--validation", "16")
    assert made.returncode == 0, made.stderr
    submitted = _compile(
        tmp_path, "sim-submit", 2, "trainer.ckpt_interval=-1", f"data.train_data=['{small / 'train.parquet'}']"
    )
    task = skysim.load_task(job / "sky.yaml")
    work = tmp_path / "sim"
    marker = tmp_path / "ckpts" / "sim-kill" / "latest_ckpt_global_step.txt"
    with skysim.Cluster(2, work) as cluster:
        # Host 1 never starts: the head gives up after the gate's timeout, naming the address that never joined.
        started = time.monotonic()
        codes = skysim.run_task(
            cluster,
            skysim.load_task(missing / "sky.yaml"),
            slots=1,
            logs=work / "logs-missing",
            hosts=[0],
            run_timeout_s=300,
        )
        assert codes[0] not in (0, None)
        assert time.monotonic() - started >= 10
        log = (work / "logs-missing" / "run-0.log").read_text(errors="replace")
        assert "has 1 of 2 node(s)" in log and f"Missing 1 node(s) ({cluster.members[1].ip})" in log, log[-2000:]
        assert not _metrics(tmp_path, "sim-missing")

        # Both hosts up (the head's Ray is still running and is reused); host 1 then dies mid-run.
        logs = work / "logs"
        skysim.setup(cluster, task, 1, logs=logs)
        env = [skysim.task_env(cluster, h, task, 1) for h in cluster.members]
        head = cluster.start(cluster.members[0], task["run"], env[0], logs / "run-0.log")
        worker = cluster.start(cluster.members[1], task["run"], env[1], logs / "run-1.log")
        assert skysim.wait_all({1: worker}, 300) == {1: 0}  # the worker's run section ends once its Ray node is up
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and head.poll() is None:
            if marker.exists() and marker.read_text().strip() not in ("", "0"):
                break
            time.sleep(0.05)
        assert head.poll() is None, _log(work, "run", 0)[-3000:]
        saved = int(marker.read_text())
        assert cluster.kill(cluster.names[1]) > 0  # the host dies: its raylet, workers and engine with it
        code = skysim.wait_all({0: head}, 300)[0]
        log = _log(work, "run", 0)
        assert code not in (0, None), log[-3000:]
        assert "mid-run" in log and "run the same command again to resume from it" in log, log[-3000:]
        last = int(marker.read_text())
        assert saved <= last < steps

        # The host comes back (a fresh Ray node) and the task runs again: it continues from the last checkpoint.
        codes = skysim.run_task(cluster, task, slots=1, logs=work / "logs-rerun", run_timeout_s=600)
        rerun = (work / "logs-rerun" / "run-0.log").read_text(errors="replace")
        assert codes == {0: 0, 1: 0}, rerun[-3000:]
        assert f"resumed from {tmp_path / 'ckpts' / 'sim-kill' / f'global_step_{last}'} at step {last}" in rerun, rerun[
            -3000:
        ]
        assert "2 node(s) with 2 CPU joined the Ray cluster" in rerun
        assert [m["step"] for m in _metrics(tmp_path, "sim-kill")] == list(range(1, steps + 1))

        # Each rank and engine on the host the plan names: plan node n is one host, and each host holds one node.
        placed = json.loads((tmp_path / "runs" / "sim-kill" / "placement.json").read_text())
        ips = {h.ip for h in cluster.members}
        node_ip: dict[int, str] = {}
        for r in placed["roles"]["policy"]:
            assert r["ip"] in ips
            assert node_ip.setdefault(r["plan_node"], r["ip"]) == r["ip"]
        for e in placed["engines"]:
            assert e["ip"] == node_ip[e["plan_nodes"][0]]
        assert len(set(node_ip.values())) == 2  # the two plan nodes really are two hosts

        # The Ray job artifact, submitted to the same (still running) cluster's head from the head host.
        head = cluster.members[0]
        submit = cluster.start(
            head,
            f"bash {submitted / 'ray' / 'submit.sh'}",
            skysim.task_env(cluster, head, task, 1, {"RAY_ADDRESS": "http://127.0.0.1:8265"}),
            work / "logs" / "submit.log",
        )
        assert skysim.wait_all({0: submit}, 600) == {0: 0}, (work / "logs" / "submit.log").read_text()[-3000:]
        assert [m["step"] for m in _metrics(tmp_path, "sim-submit")] == [1, 2]
    _gone(cluster)
