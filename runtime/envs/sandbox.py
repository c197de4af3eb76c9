"""Code a model wrote, run as untrusted: in its own process, with a time and a memory limit, in a temporary directory,
without the trainer's environment variables, and with nothing of it left running afterwards.

A small supervisor process starts the program and outlives it: it caps the program's address space, CPU time and
file sizes, kills it at the wall-clock limit, and then kills every process the program left behind (it is their
reaper, so a program that forks and detaches cannot escape). Where the kernel allows unprivileged namespaces
(`unshare --user`), the supervisor also runs in new user, PID, mount and network namespaces: the program then sees
none of the trainer's processes under /proc (their environment included) and has no network. Without them, the
program runs as the trainer's user and could read other processes of that user under /proc; the clean environment
and the limits hold either way.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

TIMED_OUT = 124  # the supervisor's exit status when the program ran past its limit (as timeout(1))
_GRACE_S = 5.0  # the supervisor's own start and clean-up, beyond the program's limit
_UNSHARE = ("unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--net")


@dataclass(frozen=True)
class Limits:
    seconds: float = 10.0  # wall clock, and (rounded up) CPU time
    memory_mb: int = 1024  # address space
    file_mb: int = 64  # largest file the program may write


@dataclass
class Outcome:
    returncode: int  # the program's exit status; -N when signal N ended it
    stdout: str
    stderr: str
    timed_out: bool


def clean_environment(home: str) -> dict[str, str]:
    """All the program sees of an environment: no variable of the trainer's (no tokens, keys or cluster addresses)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


@functools.cache
def namespaces_available() -> bool:
    """Whether `unshare` can give the supervisor its own user, PID, mount and network namespaces here."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=10, env=clean_environment("/"))
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def run_python(
    code: str, *, stdin: str = "", limits: Limits = Limits(), files: dict[str, str] | None = None
) -> Outcome:
    """Run `code` as a Python program under `limits`, with `files` (name -> text) beside it in its directory."""
    work = tempfile.mkdtemp(prefix="rlc-sandbox-")
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        for name, text in (files or {}).items():
            with open(os.path.join(work, os.path.basename(name)), "w", encoding="utf-8") as f:
                f.write(text)
        config = json.dumps(
            {
                "argv": [sys.executable, "-I", "main.py"],
                "seconds": limits.seconds,
                "memory_mb": limits.memory_mb,
                "file_mb": limits.file_mb,
            }
        )
        argv = [sys.executable, "-I", "-c", _SUPERVISOR, config]
        if namespaces_available():
            argv = [*_UNSHARE, *argv]
        proc = subprocess.Popen(
            argv,
            cwd=work,
            env=clean_environment(work),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(stdin.encode(), timeout=limits.seconds + _GRACE_S)
        except subprocess.TimeoutExpired:  # the supervisor itself hung: end its whole session
            _kill_group(proc.pid)
            out, err = proc.communicate()
            return Outcome(-signal.SIGKILL, out.decode(errors="replace"), err.decode(errors="replace"), True)
        _kill_group(proc.pid)
        code_ = proc.returncode
        timed_out = code_ == TIMED_OUT
        if code_ > 128 and not timed_out:
            code_ = -(code_ - 128)
        return Outcome(code_, out.decode(errors="replace"), err.decode(errors="replace"), timed_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# The supervisor, run as `python -I -c` in the program's directory with the clean environment. It is the reaper of
# everything the program starts (PR_SET_CHILD_SUBREAPER, or PID 1 of its own namespace), so once the program ends
# or runs out of time, whatever it left behind is its child and is killed. Exit status: the program's (128 + N for
# signal N), or 124 when it ran past its limit.
_SUPERVISOR = r"""
import ctypes, json, math, os, resource, signal, subprocess, sys, time
cfg = json.loads(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except OSError:
    pass
def limit():
    mem = cfg["memory_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = math.ceil(cfg["seconds"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    size = cfg["file_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
program = subprocess.Popen(cfg["argv"], preexec_fn=limit, start_new_session=True)
try:
    status = program.wait(timeout=cfg["seconds"])
    status = status if status >= 0 else 128 - status
except subprocess.TimeoutExpired:
    status = 124
def children():
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                found.append(int(name))
    return found
for _ in range(100):
    try:
        os.killpg(program.pid, signal.SIGKILL)
    except OSError:
        pass
    left = children()
    if not left:
        break
    time.sleep(0.01)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break
sys.exit(status)
"""
