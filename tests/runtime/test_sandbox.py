"""Code a model wrote runs as untrusted: no secrets, no time or memory beyond its limits, nothing left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from rlc.runtime.envs.sandbox import Limits, namespaces_available, run_python

SECRET = "s3cr3t-value-of-the-trainer"


@pytest.fixture(params=["namespaces", "process"])
def isolation(request, monkeypatch):
    """Both ways the sandbox runs: in its own namespaces where the kernel lets it, else as a supervised process."""
    import rlc.runtime.envs.sandbox as sandbox

    if request.param == "namespaces" and not namespaces_available():
        pytest.skip("unprivileged namespaces are not available here")
    if request.param == "process":
        monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    return request.param


def test_a_program_sees_none_of_the_trainers_environment(monkeypatch, isolation):
    monkeypatch.setenv("RLC_TEST_API_KEY", SECRET)
    out = run_python(
        "import os, sys; print(sorted(os.environ)); print(os.getcwd()); print(sys.stdin.read())", stdin="in"
    )
    names, cwd, echoed = out.stdout.splitlines()
    assert out.returncode == 0 and not out.timed_out
    assert "RLC_TEST_API_KEY" not in names and SECRET not in out.stdout
    assert set(eval(names)) <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONIOENCODING", "PYTHONDONTWRITEBYTECODE",
                                "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}  # fmt: skip
    assert echoed == "in"
    assert not Path(cwd).exists()  # its temporary directory is gone with it


@pytest.mark.skipif(not namespaces_available(), reason="unprivileged namespaces are not available here")
def test_a_program_cannot_read_the_trainers_environment_through_proc(monkeypatch):
    # The secret is in this process's initial environment only as a child would inherit it: start a process that
    # holds it, as a trainer's worker would, and let the program search every /proc/*/environ for it.
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, "RLC_TEST_API_KEY": SECRET}
    )
    try:
        code = (
            "import os\nfound = []\n"
            "for pid in os.listdir('/proc'):\n"
            "    try:\n"
            "        found.append(open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError:\n"
            "        pass\n"
            f"print(any({SECRET.encode()!r} in e for e in found), len(found))\n"
        )
        out = run_python(code)
        assert out.stdout.split()[0] == "False", out
    finally:
        holder.kill()
        holder.wait()


def test_a_program_is_stopped_at_its_time_limit(isolation):
    started = time.monotonic()
    out = run_python("while True:\n    pass\n", limits=Limits(seconds=1))
    assert out.timed_out
    assert time.monotonic() - started < 30


def test_a_program_cannot_take_more_memory_than_its_limit():
    out = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", limits=Limits(memory_mb=256))
    assert out.returncode != 0 and "allocated" not in out.stdout
    assert "MemoryError" in out.stderr


def test_nothing_a_program_starts_outlives_it(tmp_path, isolation):
    beat = tmp_path / "heartbeat"
    # A grandchild in a session of its own, orphaned at once: it would write forever if it survived.
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            with open({str(beat)!r}, "a") as f:
                f.write(".")
            time.sleep(0.05)
    os._exit(0)
time.sleep(0.5)
print("parent exits")
"""
    out = run_python(code, limits=Limits(seconds=5))
    assert out.stdout.strip() == "parent exits" and not out.timed_out
    assert beat.exists()  # the grandchild did run
    time.sleep(0.3)
    size = beat.stat().st_size
    time.sleep(0.5)
    assert beat.stat().st_size == size  # and nothing writes any more
