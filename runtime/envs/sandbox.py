"""Code a model wrote, run as hostile input: in a jail of its own, under limits for the whole jail, judged outside.

Two isolation levels (`environment.sandbox.isolation`; docs/sandbox.md says what each guarantees):

- ``bubblewrap``: the program runs under bubblewrap (`bwrap`, what Flatpak uses) in new PID, network, IPC, UTS and
  mount namespaces, seeing read-only only the interpreter and its libraries, with a private writable scratch
  directory, a private /tmp and /dev/shm (size-capped tmpfs), no network, no capabilities, no_new_privs, and, when
  the trainer is root, a uid of its own that owns nothing on the machine, in a user namespace of its own. Seccomp
  filters (`syscall_filter`) refuse what namespaces leave open: the kernel keyrings, address families but UNIX and
  IP (vsock, netlink), io_uring, inotify and new user namespaces; the supervisor first joins a fresh session
  keyring, so the trainer's is not the jail's. A supervisor is the namespace's PID 1: when it ends, the kernel ends everything the
  program started.
- ``unisolated``: the same supervisor, limits and clean environment, but in the trainer's filesystem, network and
  uid. Only for code the job trusts; chosen in the spec, never as a fallback.

The limits hold for the whole sandbox where the machine lets rlc make a cgroup, under the trainer's own (memory and
swap, processes, CPU share, disk I/O, with an OOM kill inside the sandbox), else per process (address space) with a
process cap (RLIMIT_NPROC under a uid or a user namespace of the sandbox's own); each process's open files always. The parent reads at most `output_kb` of what the program prints, and never
waits past the wall clock. `probe()` says which level and limits this machine gives; a run that asks for a level
the machine cannot give raises `SandboxUnavailable`, it is never run weaker.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlc.runtime.envs import syscall_filter

ISOLATION_LEVELS = ("bubblewrap", "unisolated")  # rlc.spec.generation.SANDBOX_ISOLATION holds the same
TIMED_OUT = 124  # an Outcome's returncode when the program ran past its wall clock (as timeout(1))
_GRACE_S = 5.0  # the supervisor's own start and clean-up, beyond the programs' limits
_SCRATCH = "/sandbox"  # the program's writable directory inside the jail
_UID_RANGE = (1_000_000_000, 2_000_000_000)  # a root trainer's sandboxes each run under a fresh uid from here
_CGROUP_ROOT = "/sys/fs/cgroup"
_MASKED = ("/proc/keys", "/proc/key-users", "/proc/cmdline")
_KEPT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL")  # the supervisor's, lost when the program starts


@dataclass(frozen=True)
class Limits:
    seconds: float = 10.0  # wall clock of one run; also each process's CPU time (rounded up, plus one)
    memory_mb: int = 1024  # the whole sandbox with cgroups, else each process's address space
    processes: int = 64  # processes and threads at once
    file_mb: int = 64  # the largest file, and the size of each of scratch, /tmp and /dev/shm
    output_kb: int = 1024  # stdout plus stderr the parent takes; the program is killed past it
    open_files: int = 256  # each process's open files (the machine's file table is shared with the trainer)


@dataclass
class Outcome:
    returncode: int  # the program's exit status; -N when signal N ended it; 124 when it ran out of time
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool = False  # it printed more than output_kb and was killed there


class SandboxUnavailable(RuntimeError):
    """The isolation level asked for cannot be had on this machine; the message says why and what to change."""


@dataclass(frozen=True)
class Probe:
    """What this machine gives: the isolation levels it can run and how the limits are enforced."""

    bubblewrap: bool
    reason: str  # why bubblewrap cannot run here ('' when it can)
    limits: str  # "cgroup v1" | "cgroup v2" | "rlimits"
    uid: str  # "a fresh uid per sandbox" | "the trainer's uid in a user namespace"

    def available(self, level: str) -> bool:
        return level == "unisolated" or self.bubblewrap

    def describe(self, level: str) -> str:
        if level == "unisolated":
            return f"unisolated (the trainer's filesystem, network and uid; limits by {self.limits})"
        return f"bubblewrap ({self.uid}; limits by {self.limits})"


@dataclass
class _Policy:
    level: str = "bubblewrap"
    limits: Limits = field(default_factory=Limits)


_policy = _Policy()


def configure(level: str, limits: Limits | None = None, *, check: bool = True, concurrent: int = 1) -> Probe:
    """Set this process's isolation level (and default limits) from the job; with `check`, first make sure the machine
    gives that level, and that `concurrent` sandboxes at their process cap leave the trainer processes of its own
    (without it, a run that needs the level still refuses to start when the machine lacks it)."""
    if level not in ISOLATION_LEVELS:
        raise ValueError(f"unknown sandbox isolation {level!r}; rlc has {', '.join(ISOLATION_LEVELS)}")
    found = probe()
    if check and not found.available(level):
        raise SandboxUnavailable(found.reason)
    short = process_shortfall(concurrent, limits or Limits()) if check else None
    if short:
        raise SandboxUnavailable(short)
    _policy.level = level
    _policy.limits = limits or Limits()
    return found


TRAINER_RESERVE = (
    64  # processes and threads a non-root trainer keeps beyond what it runs, for its own Popen and threads
)


def process_shortfall(concurrent: int, limits: Limits) -> str | None:
    """Why `concurrent` sandboxes at their process cap could leave a non-root trainer none of its own, or None.

    A non-root trainer's sandboxes run under its uid, in user namespaces that the kernel charges up to the uid's own
    count, so their processes and threads count against the trainer's RLIMIT_NPROC. A root trainer's each have a
    fresh uid, and an unlimited RLIMIT_NPROC has nothing to exhaust."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if os.geteuid() == 0 or soft == resource.RLIM_INFINITY:
        return None
    used = tasks_of(os.getuid())
    need = concurrent * limits.processes + TRAINER_RESERVE
    if soft - used >= need:
        return None
    return (
        f"the trainer's uid may run {soft} processes and threads (ulimit -u) and runs {used}: {concurrent} "
        f"sandbox(es) of up to {limits.processes} each, with {TRAINER_RESERVE} kept for the trainer, need {need} more "
        "(a non-root trainer's sandboxes count against its uid). Raise ulimit -u, or lower "
        "environment.sandbox.max_processes or environment.skyrl_gym.max_env_workers"
    )


def tasks_of(uid: int) -> int:
    """The processes and threads this machine runs under `uid`: what its RLIMIT_NPROC counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
        except OSError:  # it ended meanwhile
            continue
    return count


def default_limits() -> Limits:
    """The limits the job set (`environment.sandbox`), for environments that do not set their own."""
    return _policy.limits


def clean_environment(home: str) -> dict[str, str]:
    """All the program sees of an environment: no variable of the trainer's (no tokens, keys or cluster addresses)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


@functools.cache
def probe() -> Probe:
    """Find out once what this machine gives: a trivial program run in the jail as every program is (its filters, its
    session keyring, a root trainer's user namespace, a cgroup made and removed)."""
    limits = _cgroup_kind() or "rlimits"
    uid = "a fresh uid per sandbox" if os.geteuid() == 0 else "the trainer's uid in a user namespace"
    if shutil.which("bwrap") is None:
        return Probe(False, _MISSING_BWRAP, limits, uid)
    try:
        syscall_filter.jail(), syscall_filter.program()
    except syscall_filter.FilterUnavailable as exc:
        return Probe(False, f"{exc}, or, only for code you trust, set environment.sandbox.isolation: unisolated",
                     limits, uid)  # fmt: skip
    try:
        (done,) = _launch("print('ok')", [""], Limits(seconds=20), {}, {}, jailed=True)
    except OSError as exc:
        return Probe(False, f"bwrap could not be started ({exc}). {_NO_USERNS}", limits, uid)
    if done.returncode != 0 or done.stdout.strip() != "ok":
        said = done.stderr.strip()[-300:] or f"exit status {done.returncode}"
        return Probe(False, f"bwrap refused to start a sandbox here: {said}. {_NO_USERNS}", limits, uid)
    return Probe(True, "", limits, uid)


_MISSING_BWRAP = (
    "bubblewrap (bwrap) is not installed on this machine: install it (Debian/Ubuntu: apt-get install bubblewrap; "
    "Fedora: dnf install bubblewrap), or, only for code you trust, set environment.sandbox.isolation: unisolated"
)
_NO_USERNS = (
    "It needs user namespaces (sysctl user.max_user_namespaces > 0; on Ubuntu 23.10+ also "
    "kernel.apparmor_restrict_unprivileged_userns=0), and as root CAP_SYS_ADMIN too (in a container: a pod with user "
    "namespaces allowed, e.g. hostUsers: false, or a seccomp/AppArmor profile that permits unshare; see "
    "docs/sandbox.md), or, only for code you trust, environment.sandbox.isolation: unisolated"
)


def run_python(
    code: str,
    *,
    stdin: str = "",
    limits: Limits | None = None,
    files: dict[str, str] | None = None,
    readonly: dict[str, str] | None = None,
) -> Outcome:
    """Run `code` as a Python program under `limits`, with `files` (name -> text) beside it in its directory, and
    `readonly` (name -> a file of the trainer's) readable under data/ there."""
    return run_python_each(code, [stdin], limits=limits, files=files, readonly=readonly)[0]


def run_python_each(
    code: str,
    stdins: list[str],
    *,
    limits: Limits | None = None,
    files: dict[str, str] | None = None,
    readonly: dict[str, str] | None = None,
) -> list[Outcome]:
    """Run `code` once per input in one sandbox, each run with only its input on stdin and `limits` of its own;
    whatever one run leaves running is ended before the next starts."""
    readonly = {os.path.basename(n): os.path.realpath(p) for n, p in (readonly or {}).items()}
    jailed = _policy.level == "bubblewrap"
    if jailed and not probe().bubblewrap:
        raise SandboxUnavailable(probe().reason)
    return _launch(code, stdins, limits or _policy.limits, files or {}, readonly, jailed=jailed)


def _launch(
    code: str, stdins: list[str], limits: Limits, files: dict[str, str], readonly: dict[str, str], *, jailed: bool
) -> list[Outcome]:
    root = os.geteuid() == 0
    work = _SCRATCH if jailed else tempfile.mkdtemp(prefix="rlc-sandbox-")
    given: list[int] = []  # the read ends of the pipes bwrap reads, closed here once it has started
    if jailed:
        # The jail's filter goes to bwrap on a pipe of its own (a few hundred bytes: the pipe's buffer holds them).
        given.append(_pipe_of(syscall_filter.jail()))
        argv = [shutil.which("bwrap") or "bwrap", "--seccomp", str(given[0]), *_bwrap_args(root, limits)]
        # What a fresh /proc still tells of the machine, masked (empty files) as Docker masks it: the keys the jail's
        # uid may view (a non-root trainer's own, by their names) and the kernel's command line.
        for path in _MASKED:
            if os.path.exists(path):
                given.append(_pipe_of(b""))
                argv += ["--perms", "0444", "--ro-bind-data", str(given[-1]), path]
        if readonly:
            argv += ["--perms", "0755", "--dir", f"{_SCRATCH}/data"]
        for name, path in readonly.items():
            argv += ["--ro-bind", path, f"{_SCRATCH}/data/{name}"]
        argv.append("--")
    else:
        argv = []
        if readonly:
            os.mkdir(os.path.join(work, "data"))
        for name, path in readonly.items():
            os.symlink(path, os.path.join(work, "data", name))
    cgroup = _Cgroup.make(limits)
    config = {
        "code": code,
        "files": {os.path.basename(n): t for n, t in files.items() if os.path.basename(n) != "main.py"},
        "stdins": stdins,
        "seconds": limits.seconds,
        "memory_mb": limits.memory_mb,
        "processes": limits.processes,
        "file_mb": limits.file_mb,
        "open_files": limits.open_files,
        "output_bytes": limits.output_kb * 1024,
        "pid1": jailed,
        "python": sys.executable,  # the trainer's (a venv's bin/python sees its site-packages)
        "uid": secrets.randbelow(_UID_RANGE[1] - _UID_RANGE[0]) + _UID_RANGE[0] if root and jailed else None,
        "cgroup_fds": cgroup.fds if cgroup else [],
        "work": work,
        # In the jail: the supervisor leaves the trainer's session keyring first, and the program starts under the
        # second filter (a root trainer's program in a user namespace of its own, made just before).
        "keyctl": syscall_filter.syscall_number("keyctl") if jailed else None,
        "program_filter": syscall_filter.program().hex() if jailed else None,
    }
    budget = sum(limits.seconds for _ in stdins) + _GRACE_S * (1 + len(stdins) / 4)
    # JSON of what each run printed: at most 6 characters per byte, plus its frame.
    cap = len(stdins) * (6 * limits.output_kb * 1024 + 4096) + 65536
    try:
        with tempfile.TemporaryFile() as sent:
            sent.write(json.dumps(config).encode())
            sent.flush()
            sent.seek(0)
            argv += [_interpreter(), "-I", "-S", "-c", _SUPERVISOR, str(sent.fileno())]
            proc = subprocess.Popen(
                argv,
                cwd="/" if jailed else work,
                env=clean_environment(work),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=[sent.fileno(), *(cgroup.fds if cgroup else []), *given],
                start_new_session=True,
            )
            if cgroup:
                cgroup.close_fds()
            while given:
                os.close(given.pop())
            try:
                out, err, complete = _read_bounded(proc, budget, cap)
            finally:
                _kill_group(proc.pid)
    finally:
        for fd in given:
            os.close(fd)
        if cgroup:
            cgroup.close_fds()
            cgroup.remove()
        if not jailed:
            shutil.rmtree(work, ignore_errors=True)
    return _outcomes(out, err, complete, proc, len(stdins))


def _pipe_of(data: bytes) -> int:
    """A pipe's read end holding `data` (at most a pipe buffer, 64 KiB) and then its end."""
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return read


def _outcomes(out: bytes, err: bytes, complete: bool, proc: subprocess.Popen, runs: int) -> list[Outcome]:
    """The runs' outcomes from the supervisor's report; a sandbox that ended without one timed out or was killed."""
    if complete and proc.returncode == 0:
        try:
            report = json.loads(out)
            return [Outcome(r["returncode"], r["stdout"], r["stderr"], r["timed_out"], r["truncated"]) for r in report]
        except (ValueError, KeyError, TypeError):
            pass
    said = err.decode(errors="replace")[-2000:]
    return [Outcome(-signal.SIGKILL, "", said, not complete) for _ in range(runs)]


def _read_bounded(proc: subprocess.Popen, budget: float, cap: int) -> tuple[bytes, bytes, bool]:
    """Both pipes of the supervisor, at most `cap` bytes and `budget` seconds; whether it ended within them."""
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + budget
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    taken = 0
    with selectors.DefaultSelector() as sel:
        for pipe in (proc.stdout, proc.stderr):
            sel.register(pipe, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0 or taken > cap:
                break
            for key, _ in sel.select(timeout=left):
                data = os.read(key.fd, 65536)
                if not data:
                    sel.unregister(key.fileobj)
                    continue
                chunks[key.fd].append(data)
                taken += len(data)
        ended = not sel.get_map()
    complete = ended and taken <= cap
    if complete:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        except subprocess.TimeoutExpired:
            complete = False
    if not complete:
        _kill_group(proc.pid)
        proc.kill()
        proc.wait()
    out, err = b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])
    proc.stdout.close()
    proc.stderr.close()
    return out, err, complete


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _interpreter() -> str:
    """The trainer's interpreter, its real file (a venv's bin/python is a link to it)."""
    return os.path.realpath(sys.executable)


def _readonly_paths() -> list[str]:
    """What the program may read: the system's programs and libraries, the interpreter, its standard library and the
    site-packages the trainer imports from (never the job's own directories)."""
    paths = ["/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/alternatives"]
    paths += [sys.base_prefix, sys.base_exec_prefix, sys.prefix, os.path.dirname(os.path.dirname(_interpreter()))]
    paths += [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    kept: list[str] = []
    for path in sorted(
        {os.path.realpath(p) for p in paths if os.path.exists(p)} | {p for p in paths if os.path.islink(p)}
    ):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _bwrap_args(root: bool, limits: Limits) -> list[str]:
    size = str(limits.file_mb * 2**20)
    args = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    args += ["--die-with-parent", "--new-session", "--as-pid-1", "--clearenv"]
    if root:  # bwrap itself may mount; the supervisor keeps what it needs to hand the program a uid of its own
        args += ["--cap-drop", "ALL"]
        for cap in _KEPT_CAPS:
            args += ["--cap-add", cap]
    else:
        args += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    # The private /tmp and /dev/shm first: what is bound read-only below then shows through them, also when the
    # interpreter or its venv lives under /tmp (a CI checkout, say).
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    args += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
    dirs: set[str] = {"/tmp", "/dev", "/dev/shm", "/proc"}
    for path in _readonly_paths():
        if os.path.islink(path) and os.path.dirname(path) == "/":
            args += ["--symlink", os.readlink(path), path]
            continue
        parent = os.path.dirname(path)
        chain = []
        while parent not in ("/", "") and parent not in dirs:
            chain.append(parent)
            dirs.add(parent)
            parent = os.path.dirname(parent)
        for d in reversed(chain):
            args += ["--perms", "0755", "--dir", d]
        args += ["--ro-bind", path, path]
    args += ["--perms", "0755", "--size", size, "--tmpfs", _SCRATCH]
    args += ["--remount-ro", "/"]
    for name, value in clean_environment(_SCRATCH).items():
        args += ["--setenv", name, value]
    return args


# -- cgroups: one per sandbox, where this process may make them ----------------------------------------------------


@functools.cache
def _cgroup_kind() -> str | None:
    """'cgroup v2' or 'cgroup v1' when a cgroup with memory and process limits can be made here, else None."""
    for kind in ("cgroup v2", "cgroup v1"):
        try:
            group = _Cgroup.create(kind, Limits())
        except OSError:
            continue
        group.close_fds()
        group.remove()
        return kind
    return None


_V1_CONTROLLERS = ("memory", "pids", "cpu", "blkio")
_OPTIONAL = ("memory.swap.max", "memory.memsw.limit_in_bytes", "io.max")  # no swap accounting, no io controller
_IO_BPS = 64 * 2**20  # each sandbox's reads and writes on each disk, bytes and operations a second
_IO_IOPS = 2000


def _own_cgroups() -> dict[str, str]:
    """The trainer's cgroup in each hierarchy: controller -> path ('' for cgroup v2's)."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f.read().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    return own


@functools.cache
def _disks() -> list[str]:
    """major:minor of each block device with something on it, for the I/O throttle."""
    found = []
    for name in sorted(os.listdir("/sys/block")) if os.path.isdir("/sys/block") else []:
        try:
            with open(f"/sys/block/{name}/size") as f:
                if int(f.read()) == 0:
                    continue
            with open(f"/sys/block/{name}/dev") as f:
                found.append(f.read().strip())
        except (OSError, ValueError):
            continue
    return found


class _Cgroup:
    """The sandbox's cgroup: the supervisor joins it through an open cgroup.procs, so everything it starts is in it."""

    def __init__(self, dirs: list[str], fds: list[int]):
        self.dirs, self.fds = dirs, fds

    @staticmethod
    def make(limits: Limits) -> _Cgroup | None:
        kind = _cgroup_kind()
        if kind is None:
            return None
        try:
            return _Cgroup.create(kind, limits)
        except OSError:
            return None

    @staticmethod
    def create(kind: str, limits: Limits) -> _Cgroup:
        # Under the trainer's own cgroup (its pod's or job's), so what the sandboxes take counts against the job; the
        # name says nothing of the trainer (its pid would show through the jail's /proc/self/cgroup).
        name = f"rlc-sandbox-{secrets.token_hex(8)}"
        memory = str(limits.memory_mb * 2**20)
        own = _own_cgroups()
        if kind == "cgroup v2":
            if "" not in own or not os.path.exists(f"{_CGROUP_ROOT}/cgroup.controllers"):
                raise OSError("no cgroup v2 here")
            settings = {
                f"{_CGROUP_ROOT}{own['']}".rstrip("/") + "/" + name: {
                    "memory.max": memory,
                    "memory.swap.max": "0",
                    "pids.max": str(limits.processes),
                    "cpu.max": "100000 100000",
                    "io.max": "\n".join(
                        f"{dev} rbps={_IO_BPS} wbps={_IO_BPS} riops={_IO_IOPS} wiops={_IO_IOPS}" for dev in _disks()
                    ),  # fmt: skip
                }
            }
        else:
            at = {c: f"{_CGROUP_ROOT}/{c}{own.get(c, '/')}".rstrip("/") + "/" + name for c in _V1_CONTROLLERS}
            settings = {
                # memsw after the limit it may not be below: with swap, the sandbox swaps no further than memory_mb
                at["memory"]: {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory},
                at["pids"]: {"pids.max": str(limits.processes)},
            }
            if os.path.isdir(f"{_CGROUP_ROOT}/cpu"):
                settings[at["cpu"]] = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "100000"}
            if os.path.isdir(f"{_CGROUP_ROOT}/blkio"):
                disks = _disks()
                settings[at["blkio"]] = {
                    f"blkio.throttle.{way}_{unit}_device": "\n".join(f"{dev} {rate}" for dev in disks)
                    for way in ("read", "write")
                    for unit, rate in (("bps", _IO_BPS), ("iops", _IO_IOPS))
                }
        made: list[str] = []
        fds: list[int] = []
        try:
            for path, values in settings.items():
                os.mkdir(path, 0o700)
                made.append(path)
                for key, value in values.items():
                    if key in _OPTIONAL and not os.path.exists(f"{path}/{key}"):
                        continue
                    for line in value.split("\n") if value else ():  # one device a write
                        try:
                            with open(f"{path}/{key}", "w") as f:
                                f.write(line)
                        except OSError:
                            # A disk the kernel cannot throttle (no request queue) costs its throttle only, never
                            # the memory and process limits of the whole cgroup.
                            if not key.startswith(("blkio.", "io.")):
                                raise
                fds.append(os.open(f"{path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            _Cgroup(made, []).remove()
            raise
        return _Cgroup(made, fds)

    def close_fds(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def remove(self) -> None:
        """Kill what is left in it and remove it (its processes may take a moment to go)."""
        deadline = time.monotonic() + 5
        for path in reversed(self.dirs):
            while True:
                if os.path.exists(f"{path}/cgroup.kill"):
                    try:
                        with open(f"{path}/cgroup.kill", "w") as f:
                            f.write("1")
                    except OSError:
                        pass
                try:
                    for pid in open(f"{path}/cgroup.procs").read().split():
                        _kill(int(pid))
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# The supervisor's text (sandbox_supervisor.py, a script kept as a file so that lint and type checks read it), run
# as `python -I -S -c`: the jail sees the interpreter, not rlc's source tree.
_SUPERVISOR = (Path(__file__).parent / "sandbox_supervisor.py").read_text(encoding="utf-8")
