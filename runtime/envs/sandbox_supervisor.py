"""The sandbox's supervisor: a script, not a module to import. sandbox.py runs its text as `python -I -S -c` with
its configuration on an open file (fd in argv). It joins the sandbox's cgroup, writes the program's files, then runs
the program once per input: as a uid of its own (a root trainer's jail), with its rlimits, its stdout and stderr read
up to the output cap, killed at the wall clock, and everything it left behind killed before the next run (as PID 1
of the jail: kill(-1); unisolated: its process group and every process it is the reaper of). It prints one JSON
report; its own exit status is 0. Only the standard library: it runs with no site-packages.
"""

import ctypes
import errno
import json
import math
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time

with os.fdopen(int(sys.argv[1]), "rb") as given:
    cfg = json.loads(given.read())
for fd in cfg["cgroup_fds"]:
    os.write(fd, b"0")
    os.close(fd)
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, signal.SIG_IGN)
libc = ctypes.CDLL(None, use_errno=True)
if cfg["keyctl"] is not None:
    # KEYCTL_JOIN_SESSION_KEYRING with no name: a fresh anonymous session keyring, so nothing in the jail possesses
    # the trainer's (bwrap's new session is not a new keyring). A kernel without keys, or a container whose own
    # filter refuses keyctl to everyone, has nothing the program could reach through one.
    # Passed as longs: the jail's filter compares the whole register, which a C int leaves half undefined.
    joined = libc.syscall(ctypes.c_long(cfg["keyctl"]), ctypes.c_long(1), ctypes.c_void_p(None))
    if joined < 0 and ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM):
        raise OSError(ctypes.get_errno(), "could not join a fresh session keyring")
libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the program cannot read or trace the supervisor
libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
if not cfg["pid1"]:
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
try:
    with open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("1000")  # the kernel's first choice under memory pressure: the sandbox, not the trainer
except OSError:
    pass
work, uid = cfg["work"], cfg["uid"]


def place(name, text):
    fd = os.open(os.path.join(work, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


place("main.py", cfg["code"])
for name, text in cfg["files"].items():
    place(name, text)
if uid is not None:
    for name in os.listdir(work):
        if name != "data":
            os.chown(os.path.join(work, name), uid, uid)
    os.chown(work, uid, uid)


def own_user_namespace():
    # A root trainer's program: a user namespace owned by its fresh uid (mapped to itself), so its keyrings, uevent
    # sockets and process counts are that namespace's and die with it. Dumpable again so that uid may write its map.
    libc.prctl(4, 1, 0, 0, 0)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        raise OSError(ctypes.get_errno(), "a user namespace for the program (user namespaces are off here?)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{uid} {uid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


class FProg(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_filter(bpf):
    code = ctypes.create_string_buffer(bpf, len(bpf))
    prog = FProg(len(bpf) // 8, ctypes.addressof(code))
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "could not load the program's seccomp filter")


program_filter = bytes.fromhex(cfg["program_filter"]) if cfg["program_filter"] else None


def limit():
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.setsid()
    mem = cfg["memory_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = math.ceil(cfg["seconds"]) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    size = cfg["file_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["open_files"], cfg["open_files"]))
    if cfg["pid1"]:
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"]))
    if uid is not None and cfg["pid1"]:
        own_user_namespace()
    if program_filter:
        load_filter(program_filter)


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


def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                return
        except ChildProcessError:
            return


def end(program):
    if cfg["pid1"]:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        reap()
        return
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            os.killpg(program.pid, signal.SIGKILL)
        except OSError:
            pass
        left = children()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
        if not left:
            return


def run(stdin):
    with tempfile.TemporaryFile() as given:
        given.write(stdin.encode())
        given.seek(0)
        program = subprocess.Popen(
            [cfg["python"], "-I", "main.py"],
            cwd=work,
            stdin=given,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=limit,
        )
    cap, taken, truncated, timed_out = cfg["output_bytes"], 0, False, False
    got = {program.stdout.fileno(): [], program.stderr.fileno(): []}
    deadline = time.monotonic() + cfg["seconds"]
    sel = selectors.DefaultSelector()
    sel.register(program.stdout, selectors.EVENT_READ)
    sel.register(program.stderr, selectors.EVENT_READ)
    ended = False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        events = sel.select(timeout=0 if ended else min(left, 0.05))
        for key, _ in events:
            data = os.read(key.fd, 65536)
            if not data:
                sel.unregister(key.fileobj)
                continue
            keep = data[: max(0, cap - taken)]
            got[key.fd].append(keep)
            taken += len(data)
        if taken > cap:
            truncated = True
            break
        if ended and not events:
            break  # the program is gone and what it printed is read: what it left running ends now
        ended = ended or program.poll() is not None
    if not timed_out and not truncated:
        try:
            program.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    status = program.poll()
    end(program)
    if status is None:
        status = program.wait()
    sel.close()
    out = b"".join(got[program.stdout.fileno()]).decode(errors="replace")
    err = b"".join(got[program.stderr.fileno()]).decode(errors="replace")
    program.stdout.close()
    program.stderr.close()
    code = 124 if timed_out else status
    return {"returncode": code, "stdout": out, "stderr": err, "timed_out": timed_out, "truncated": truncated}


report = [run(stdin) for stdin in cfg["stdins"]]
sys.stdout.write(json.dumps(report))
sys.stdout.flush()
