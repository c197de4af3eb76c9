"""Faults injected into `rlc run` of the local example (docs/faults.md): a SIGTERM or SIGINT to the driver, to its
process group or to every process of the run; a corrupt checkpoint; a full disk; a rank killed. Each outcome is what a
user sees: the exit code, the one line that says what happened and where to resume from, the checkpoints on disk, a
rerun that resumes, and no process of the run left behind."""

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
from conftest import EXAMPLES, kill_ray_processes_under, rlc_executable, run_rlc

pytest.importorskip("ray")
pytest.importorskip("transformers")
pytest.importorskip("torch")
psutil = pytest.importorskip("psutil")

from rlc.runtime import checkpoint as ckpt  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults-data")
    made = run_rlc("data", "synthetic", "-o", str(out), "--train", str(STEPS * 16), "--validation", "16")
    assert made.returncode == 0, made.stderr
    return out / "train.parquet"


class Run:
    """One `rlc run` of the local example (`STEPS` steps, a checkpoint every 2, resume_mode latest) in its own
    session, HOME and Ray instance."""

    def __init__(self, root: Path, data: Path, *extra: str):
        self.root = root
        self.ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
        self.env = {
            **os.environ,
            "HOME": str(root / "home"),
            "NO_COLOR": "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_TMPDIR": self.ray_tmp,
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        self.ckpts = root / "ckpts"
        self.args = [
            "run",
            str(EXAMPLES / "local-cpu.yaml"),
            "-o",
            str(root / "build"),
            "--no-progress",
            f"data.train_data=['{data}']",
            "data.val_data=[]",
            f"trainer.max_training_steps={STEPS}",
            "trainer.ckpt_interval=2",
            "trainer.max_ckpts_to_keep=-1",
            "trainer.resume_mode=latest",
            f"trainer.log_path={root / 'runs'}",
            f"trainer.ckpt_path={self.ckpts}",
            f"trainer.export_path={root / 'exports'}",
            "launch.envs={RLC_DIST_TIMEOUT_S: '20'}",
            *extra,
        ]

    def start(self, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
        return subprocess.Popen(
            [*prefix, rlc_executable(), *self.args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def until_step(self, proc: subprocess.Popen, step: int, since: float = 0.0) -> None:
        """Wait until `step` is in metrics.jsonl, logged after `since` (a time.time())."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if any(m["step"] >= step and m["time"] > since for m in self.metrics()):
                return
            time.sleep(0.05)
        raise AssertionError(f"the run ended or stalled before step {step}: {proc.communicate()[0][-3000:]}")

    def metrics(self) -> list[dict]:
        try:
            text = (self.root / "runs" / "local-cpu-grpo" / "metrics.jsonl").read_text()
        except OSError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def processes(self) -> list:
        """Processes of this run's Ray instance still alive (their command line or open files name its temp dir)."""
        alive = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(self.ray_tmp in part for part in proc.info["cmdline"] or ()) or any(
                    f.path.startswith(self.ray_tmp) for f in proc.open_files()
                ):
                    alive.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return alive

    def close(self) -> None:
        kill_ray_processes_under(self.ray_tmp)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


def _session(sid: int) -> list:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            pass
    return found


def _stop(run: Run, proc: subprocess.Popen, target: str, signum: int) -> None:
    if target == "driver":
        os.kill(proc.pid, signum)
    elif target == "group":  # Ctrl-C in a terminal, `kill -- -PGID`, a process-group cancel
        os.killpg(proc.pid, signum)
    else:  # every process of the run (scancel of a job step, a container's whole cgroup)
        for p in _session(proc.pid):
            try:
                p.send_signal(signum)
            except psutil.NoSuchProcess:
                pass


def _assert_stopped(run: Run, proc: subprocess.Popen, signum: int) -> tuple[str, int]:
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[signum], out[-3000:]
    name = signal.Signals(signum).name
    line = next(x for x in out.splitlines() if x.startswith("rlc.runtime: stopped by"))
    saved = int(line.split(" after step ")[1].split(";")[0])
    assert saved >= 3 and saved == run.metrics()[-1]["step"], line
    assert line == (
        f"rlc.runtime: stopped by {name} after step {saved}; the newest complete checkpoint is "
        f"{run.ckpts / f'global_step_{saved}'}; run the same command again to resume from it"
    )
    assert ckpt.problems(run.ckpts / f"global_step_{saved}") == []
    assert "Traceback" not in out and "*** SIGTERM received" not in out
    time.sleep(1)
    assert run.processes() == [], "processes of the run outlived it"
    return out, saved


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, data):
    """A run stopped by SIGTERM to its driver after its third step, its output and the step it saved."""
    run = Run(tmp_path_factory.mktemp("stopped"), data)
    proc = run.start()
    try:
        run.until_step(proc, 3)
        _stop(run, proc, "driver", signal.SIGTERM)
        out, saved = _assert_stopped(run, proc, signal.SIGTERM)
        yield run, out, saved
    finally:
        proc.kill()
        run.close()


@pytest.mark.slow
def test_sigterm_to_the_driver_saves_the_last_finished_step(stopped):
    run, out, saved = stopped
    assert "rlc: SIGTERM received: saving the last finished step within launch.grace_period_s=120s" in out
    assert (run.ckpts / ckpt.MARKER).read_text().strip() == str(saved)
    assert [m["step"] for m in run.metrics()] == list(range(1, saved + 1))


@pytest.mark.slow
def test_a_rerun_resumes_past_a_corrupt_checkpoint_and_sigterm_to_every_process_saves(stopped):
    """The same command again resumes, from the newest intact checkpoint: the one the stop saved has 64 random bytes
    written over a shard (its size unchanged). Then a SIGTERM to every process of the run (scancel of a job step, a
    machine shutting down): Ray's processes and the workers leave it to the driver, which saves and stops."""
    run, _, saved = stopped
    shard = run.ckpts / f"global_step_{saved}" / "policy" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = os.urandom(64)
    shard.write_bytes(bytes(data))
    previous = max(s for s in (2, 4, 6) if s < saved)
    started = time.time()
    proc = run.start()
    try:
        run.until_step(proc, previous + 2, since=started)
        _stop(run, proc, "all", signal.SIGTERM)
        out, again = _assert_stopped(run, proc, signal.SIGTERM)
    finally:
        proc.kill()
        run.close()
    assert (
        f"rlc: checkpoint {run.ckpts / f'global_step_{saved}'}: policy/__0_0.distcp: its SHA-256 differs from the "
        "manifest's (the bytes changed after the save): passed over"
    ) in out
    assert f"rlc: resuming from {run.ckpts / f'global_step_{previous}'}, the newest intact checkpoint" in out
    assert f"resumed from {run.ckpts / f'global_step_{previous}'} at step {previous}" in out
    assert [m["step"] for m in run.metrics()] == list(range(1, again + 1))


@pytest.mark.slow
def test_sigint_to_the_process_group_saves_the_last_finished_step(tmp_path, data):
    """Ctrl-C in a terminal (SIGINT to the foreground process group): the same as a SIGTERM, exit 130."""
    run = Run(tmp_path, data)
    proc = run.start()
    try:
        run.until_step(proc, 3)
        _stop(run, proc, "group", signal.SIGINT)
        _assert_stopped(run, proc, signal.SIGINT)
    finally:
        proc.kill()
        run.close()


def _unshare_works() -> str | None:
    """Why a mount namespace of one's own (a tmpfs as a non-root user) cannot be had here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare command (util-linux)"
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"no user and mount namespaces for this user: {probe.stderr.strip()}"


@pytest.mark.slow
def test_a_full_disk_is_said_in_a_line_and_the_previous_checkpoint_kept(tmp_path, data):
    """A real ENOSPC: the checkpoints go to a 2 MiB tmpfs mounted in a user and mount namespace of the run's own
    (what a non-root user can have); the first checkpoint (about 1.2 MB) fits and the second does not."""
    why = _unshare_works()
    if why is not None:
        pytest.skip(why)
    run = Run(tmp_path, data)
    run.ckpts.mkdir()
    kept = tmp_path / "kept"
    script = f'mount -t tmpfs -o size=2m tmpfs {run.ckpts} && "$@"; rc=$?; cp -a {run.ckpts} {kept}; exit $rc'
    proc = run.start(prefix=("unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"))
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
        run.close()
    assert proc.returncode == 1, out[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("rlc.runtime:"))
    assert line.startswith(
        "rlc.runtime: the checkpoint of step 4 could not be written: No space left on device [ENOSPC]"
    )
    assert (
        f"free space under {run.ckpts}" in line
        and f"newest complete checkpoint is {run.ckpts / 'global_step_2'}" in line
    )
    assert "Traceback" not in out
    assert sorted(p.name for p in kept.iterdir()) == ["global_step_2", ckpt.MARKER]  # no staging folder left
    assert ckpt.problems(kept / "global_step_2") == []


@pytest.mark.slow
def test_a_rank_killed_mid_run_is_named(tmp_path, data):
    run = Run(tmp_path, data)
    proc = run.start()
    try:
        run.until_step(proc, 3)
        rank = next(p for p in _session(proc.pid) if "FSDPWorker" in " ".join(p.cmdline()))
        rank.kill()
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
        run.close()
    assert proc.returncode == 1, out[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("rlc.runtime:"))
    assert "policy rank 0 died" in line and "the newest complete checkpoint is" in line, line
