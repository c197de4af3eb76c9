"""Model-written code is hostile: each attack of the sandbox review (docs/sandbox.md) is tried here as a model would.

The attacks that only need to look around run together in one sandbox per isolation level (`ATTACKS`, one program
that reports what it could do), and each is its own test on that report; the ones that need a sandbox of their own
(limits, lifetime, the supervisor) are tests of their own. `bubblewrap` runs where the machine gives it (`make test`
installs bubblewrap as root), `unisolated` everywhere, for what it promises: a clean environment, limits, a call
that returns.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import rlc.runtime.envs.sandbox as sandbox
from rlc.runtime.envs.sandbox import Limits, run_python

SECRET = "s3cr3t-value-of-the-trainer"
BWRAP = sandbox.probe().bubblewrap
NEEDS_BWRAP = pytest.mark.skipif(not BWRAP, reason=f"bubblewrap cannot run here: {sandbox.probe().reason}")
CGROUPS = sandbox.probe().limits != "rlimits"
FAST = Limits(seconds=5, memory_mb=512, processes=32, file_mb=4, output_kb=64)


def use(level: str, monkeypatch) -> None:
    monkeypatch.setattr(sandbox, "_policy", sandbox._Policy(level))


@pytest.fixture(params=["bubblewrap", "unisolated"])
def level(request, monkeypatch):
    if request.param == "bubblewrap" and not BWRAP:
        pytest.skip(f"bubblewrap cannot run here: {sandbox.probe().reason}")
    use(request.param, monkeypatch)
    return request.param


# -- the look-around attacks, one sandbox per level ----------------------------------------------------------------

# What the program tries, each attempt reported as what it got: the text it read, "wrote", or the error's name.
PROBE = r"""
import json, os, socket, sys, sysconfig
T = json.loads(sys.stdin.read())
out = {}
def attempt(name, fn):
    try:
        out[name] = fn()
    except BaseException as e:
        out[name] = type(e).__name__
def write(path, text="model was here"):
    with open(path, "w") as f:
        f.write(text)
    return "wrote"
def environs():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                found.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
            except OSError:
                pass
    return found
def memory_of_others():
    hits = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as mem:
                    for line in maps:
                        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                        if "rw" in line.split()[1] and hi - lo < 2**26:
                            mem.seek(lo)
                            hits.append(T["secret"].encode() in mem.read(hi - lo))
            except (OSError, ValueError, OverflowError):
                pass
    return any(hits)
def connect(family, address):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(address)
    s.sendall(b"hello from the sandbox")
    s.close()
    return "connected"
attempt("S1 environment", lambda: T["secret"] in json.dumps(dict(os.environ)))
attempt("S2 own environ", lambda: T["secret"] in open("/proc/self/environ").read())
attempt("S3 others' environ", lambda: any(T["secret"] in e for e in environs()))
attempt("S4 others' memory", memory_of_others)
attempt("S5 home secrets", lambda: open(T["netrc"]).read())
attempt("W1 trainer's directory", lambda: write(T["cwd_file"]))
attempt("W2 checkpoint", lambda: write(T["checkpoint"]))
attempt("W3 read-only file", lambda: write(T["readonly"]))
# Checked, not written: a sandbox that failed here would leave a .pth in the trainer's real venv.
attempt("W4 site-packages", lambda: os.access(sysconfig.get_paths()["purelib"], os.W_OK))
attempt("W4 interpreter", lambda: os.access(os.path.dirname(os.__file__), os.W_OK))
attempt("W5 /dev/shm", lambda: write("/dev/shm/" + T["leftover"]))
attempt("W5 /tmp", lambda: write("/tmp/" + T["leftover"]))
attempt("W5 big file", lambda: write("big", "x" * (T["file_mb"] * 2**20 + 1)))
attempt("N1 tcp loopback", lambda: connect(socket.AF_INET, ("127.0.0.1", T["tcp_port"])))
attempt("N1 tcp host", lambda: connect(socket.AF_INET, (T["host_ip"], T["tcp_port"])))
attempt("N2 unix socket file", lambda: connect(socket.AF_UNIX, T["unix_path"]))
attempt("N3 abstract socket", lambda: connect(socket.AF_UNIX, "\0" + T["abstract"]))
attempt("Ray session socket", lambda: connect(socket.AF_UNIX, T["ray_socket"]))
attempt("vLLM ipc socket", lambda: connect(socket.AF_UNIX, T["vllm_socket"]))
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
out["P2 capabilities"] = [status[k].strip() for k in ("CapPrm", "CapEff", "CapAmb")]
out["P2 no_new_privs"] = status.get("NoNewPrivs", "").strip()
out["P2 uid"] = os.getuid()
print(json.dumps(out))
"""


class Listener:
    """A stream socket the trainer's side listens on; `heard` holds what reached it."""

    def __init__(self, family: int, address):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.heard: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(1)
            try:
                self.heard.append(conn.recv(100))
            except OSError:
                pass
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


CHECKPOINT_BYTES = os.urandom(4096)  # a checkpoint file of the trainer's: the jail must leave it as it is


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """What a trainer has that model code must not reach: secrets, files, checkpoints and the sockets it listens on."""
    root = tmp_path_factory.mktemp("trainer")
    home = root / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".netrc").write_text(f"machine api.wandb.ai login me password {SECRET}\n")
    (home / ".cache" / "huggingface" / "token").write_text(SECRET)
    ckpt = root / "ckpts" / "global_step_1" / "policy"
    ckpt.mkdir(parents=True)
    (ckpt / "extra_rank0.pt").write_bytes(CHECKPOINT_BYTES)
    (root / "trainer_owned.txt").write_text("the trainer's\n")
    readonly = root / "readonly.txt"
    readonly.write_text("read-only\n")
    readonly.chmod(0o444)
    short = Path(tempfile.mkdtemp(prefix="rlc-t-"))  # unix socket paths must be short
    (short / "ray" / "sockets").mkdir(parents=True)
    tag = os.urandom(4).hex()
    listeners = {
        "tcp": Listener(socket.AF_INET, ("0.0.0.0", 0)),
        "unix": Listener(socket.AF_UNIX, str(short / "trainer.sock")),
        "abstract": Listener(socket.AF_UNIX, f"\0rlc-test-{tag}"),
        "ray": Listener(socket.AF_UNIX, str(short / "ray" / "sockets" / "raylet")),
        "vllm": Listener(socket.AF_UNIX, str(short / f"vllm-{tag}")),
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import time; secret = {SECRET!r} * 2; time.sleep(60)"],
        env={**os.environ, "RLC_TEST_API_KEY": SECRET},
    )
    try:
        host_ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        host_ip = "127.0.0.1"
    targets = {
        "secret": SECRET,
        "netrc": str(home / ".netrc"),
        "cwd_file": str(root / "trainer_owned.txt"),
        "checkpoint": str(ckpt / "extra_rank0.pt"),
        "readonly": str(readonly),
        "leftover": f"rlc-test-leftover-{tag}",
        "file_mb": FAST.file_mb,
        "tcp_port": listeners["tcp"].sock.getsockname()[1],
        "host_ip": host_ip,
        "unix_path": str(short / "trainer.sock"),
        "abstract": f"rlc-test-{tag}",
        "ray_socket": str(short / "ray" / "sockets" / "raylet"),
        "vllm_socket": str(short / f"vllm-{tag}"),
    }
    yield {"targets": targets, "listeners": listeners, "home": home, "root": root, "reports": {}}
    holder.kill()
    holder.wait()
    for listener in listeners.values():
        listener.close()
    for name in (f"/dev/shm/{targets['leftover']}", os.path.join(tempfile.gettempdir(), targets["leftover"])):
        Path(name).unlink(missing_ok=True)
    import shutil

    shutil.rmtree(short, ignore_errors=True)


def report(trainer, level: str, monkeypatch) -> dict:
    """What the probe could do at `level` (run once per level, with the trainer's secret in its environment)."""
    if level not in trainer["reports"]:
        monkeypatch.setenv("RLC_TEST_API_KEY", SECRET)
        monkeypatch.setenv("HOME", str(trainer["home"]))
        monkeypatch.chdir(trainer["root"])
        out = run_python(PROBE, stdin=json.dumps(trainer["targets"]), limits=FAST)
        assert out.returncode == 0, out
        trainer["reports"][level] = (
            json.loads(out.stdout),
            {k: list(v.heard) for k, v in trainer["listeners"].items()},
        )
    return trainer["reports"][level]


HELD = {  # attack -> what the program must have got, in the bubblewrap jail
    "S1 environment": False,
    "S2 own environ": False,
    "S3 others' environ": False,
    "S4 others' memory": False,
    "S5 home secrets": "FileNotFoundError",
    "W1 trainer's directory": "FileNotFoundError",
    "W2 checkpoint": "FileNotFoundError",
    "W3 read-only file": "FileNotFoundError",
    "W4 site-packages": False,
    "W4 interpreter": False,
    "W5 big file": "OSError",
    "N1 tcp loopback": "ConnectionRefusedError",
    "N1 tcp host": "OSError",
    "N2 unix socket file": "FileNotFoundError",
    "N3 abstract socket": "ConnectionRefusedError",
    "Ray session socket": "FileNotFoundError",
    "vLLM ipc socket": "FileNotFoundError",
}


LISTENER = {  # a network attack -> the trainer's listener it tried
    "N1 tcp loopback": "tcp",
    "N1 tcp host": "tcp",
    "N2 unix socket file": "unix",
    "N3 abstract socket": "abstract",
    "Ray session socket": "ray",
    "vLLM ipc socket": "vllm",
}


@NEEDS_BWRAP
@pytest.mark.parametrize("attack", sorted(HELD))
def test_an_attack_gets_nothing_out_of_the_jail(attack, trainer, monkeypatch):
    use("bubblewrap", monkeypatch)
    got, heard = report(trainer, "bubblewrap", monkeypatch)
    want = HELD[attack]
    # OSError stands for its subclasses (a read-only file system, a file too large, an unreachable network).
    assert got[attack] == want or (want == "OSError" and got[attack] not in ("wrote", "connected")), got
    if attack in LISTENER:
        assert not heard[LISTENER[attack]]  # the trainer's listener heard nothing from it


@NEEDS_BWRAP
def test_the_jail_leaves_no_file_behind_and_the_checkpoint_intact(trainer, monkeypatch):
    use("bubblewrap", monkeypatch)
    got, _ = report(trainer, "bubblewrap", monkeypatch)
    assert got["W5 /dev/shm"] == got["W5 /tmp"] == "wrote"  # its own /tmp and /dev/shm work ...
    leftover = trainer["targets"]["leftover"]
    assert not Path("/dev/shm", leftover).exists()  # ... and are gone with it
    assert not Path(tempfile.gettempdir(), leftover).exists()
    assert Path(trainer["targets"]["checkpoint"]).read_bytes() == CHECKPOINT_BYTES


@NEEDS_BWRAP
def test_the_program_holds_no_capability_and_when_the_trainer_is_root_not_its_uid(trainer, monkeypatch):
    use("bubblewrap", monkeypatch)
    got, _ = report(trainer, "bubblewrap", monkeypatch)
    assert got["P2 capabilities"] == ["0000000000000000"] * 3 and got["P2 no_new_privs"] == "1"
    if os.geteuid() == 0:
        assert got["P2 uid"] != 0


def test_unisolated_gives_a_clean_environment_only(monkeypatch):
    use("unisolated", monkeypatch)
    monkeypatch.setenv("RLC_TEST_API_KEY", SECRET)
    code = (
        "import json, os\nenv = json.dumps(dict(os.environ)) + open('/proc/self/environ').read()\n"
        f"print({SECRET!r} in env)\ntry:\n    open('big', 'w').write('x' * (5 * 2**20))\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
    )
    out = run_python(code, limits=FAST)
    assert out.stdout.split() == ["False", "OSError"], out  # no secret; the file size limit holds (EFBIG)


# -- a checkpoint the trainer loads runs no code (W2 on resume) --------------------------------------------------------------------


class Payload:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['RLC_PWNED']).write_text('ran')",))


def test_a_checkpoint_with_a_pickled_payload_is_refused_not_run(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from rlc.runtime.workers.common import lr_lambda, read_extra

    marker = tmp_path / "PWNED"
    monkeypatch.setenv("RLC_PWNED", str(marker))
    (tmp_path / "extra_rank0.pt").write_bytes(pickle.dumps({"rng": Payload()}, protocol=2))
    with pytest.raises(pickle.UnpicklingError):
        read_extra(tmp_path / "extra_rank0.pt")
    assert not marker.exists()
    # What save_checkpoint writes loads as it is: the RNG, the step count, a LambdaLR's state.
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda("cosine", 2, 10))
    optimizer.step()
    scheduler.step()
    honest = {"rng": torch.get_rng_state(), "optimizer_steps": 1, "scheduler": scheduler.state_dict()}
    torch.save(honest, tmp_path / "honest.pt")
    assert read_extra(tmp_path / "honest.pt")["scheduler"]["last_epoch"] == 1


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process saves the whole checkpoint
def test_a_sharded_checkpoints_metadata_with_a_payload_is_refused_before_it_is_unpickled(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from rlc.runtime.workers.common import check_metadata

    model = torch.nn.Linear(3, 2)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "honest"))  # as save_checkpoint writes it
    check_metadata(tmp_path / "honest")
    marker = tmp_path / "PWNED"
    monkeypatch.setenv("RLC_PWNED", str(marker))
    (tmp_path / "tampered").mkdir()
    (tmp_path / "tampered" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(pickle.UnpicklingError, match="never writes there"):
        check_metadata(tmp_path / "tampered")
    assert not marker.exists()


# -- limits for the whole sandbox -----------------------------------------------------------------------------------


def test_a_program_is_stopped_at_its_time_limit(level):
    started = time.monotonic()
    out = run_python("while True:\n    pass\n", limits=Limits(seconds=1))
    assert out.timed_out and out.returncode == sandbox.TIMED_OUT
    assert time.monotonic() - started < 30


def test_a_program_cannot_take_more_memory_than_its_limit(level):
    out = run_python("x = bytearray(8 * 1024**3)\nprint('allocated')", limits=Limits(memory_mb=256))
    assert out.returncode != 0 and "allocated" not in out.stdout
    assert "MemoryError" in out.stderr


@pytest.mark.skipif(not CGROUPS, reason="no cgroup can be made here: memory is limited per process only")
def test_processes_together_cannot_take_more_memory_than_the_sandbox(level):
    # Three processes of 150 MiB each, every one under the address-space limit, 450 MiB together under 256: the
    # kernel kills inside the sandbox (an OOM kill), not in the trainer.
    code = """
import os, sys, time
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        block = bytearray(150 * 2**20)
        for j in range(0, len(block), 4096):
            block[j] = 1
        time.sleep(1)
        os._exit(0)
    kids.append(pid)
print(sum(os.waitpid(pid, 0)[1] == 0 for pid in kids))
"""
    out = run_python(code, limits=Limits(seconds=20, memory_mb=256))
    survived = int(out.stdout.strip() or 0)
    assert survived < 3, out


def test_a_fork_bomb_stops_at_the_process_cap(level):
    if level == "unisolated" and not CGROUPS:
        pytest.skip("unisolated without cgroups has no process cap (the trainer's uid's own limit only)")
    code = """
import os, time
made = 0
try:
    while made < 400:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
except OSError as e:
    print(made, type(e).__name__)
else:
    print(made, "none")
"""
    out = run_python(code, limits=Limits(seconds=5, processes=20))
    made, error = out.stdout.split()
    assert int(made) < 20 and error == "BlockingIOError", out


HEADROOM = """
import os, resource, sys
from rlc.runtime.envs import sandbox
if os.geteuid() == 0:  # a root trainer's sandboxes have uids of their own: look as an unprivileged trainer
    os.setgid(65534)
    os.setuid(65534)
used = sandbox.tasks_of(os.getuid())
soft = used + int(sys.argv[1])
hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
if hard != resource.RLIM_INFINITY and hard < soft:
    print("SKIP hard limit", hard)
    sys.exit(0)
resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
limits = sandbox.Limits(processes=15)
try:
    sandbox.configure("unisolated", limits, concurrent=2)
except sandbox.SandboxUnavailable as exc:
    print("REFUSED", exc)
else:
    print("STARTED", sandbox.process_shortfall(2, limits))
"""


@pytest.mark.parametrize("headroom", [60, 200])
def test_sandboxes_that_could_take_a_non_root_trainers_processes_are_refused_before_it_starts(headroom):
    # A non-root trainer's sandboxes count against its uid's RLIMIT_NPROC: with 50 left, a sandbox of 15 left the
    # trainer 35 (the review's attack). Two sandboxes of 15 and the trainer's reserve of 64 need 94 more than it runs.
    out = subprocess.run([sys.executable, "-c", HEADROOM, str(headroom)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("SKIP"):
        pytest.skip(f"the hard RLIMIT_NPROC here is too low to set up the case: {out.stdout}")
    if headroom < 2 * 15 + sandbox.TRAINER_RESERVE:
        assert out.stdout.startswith("REFUSED") and "ulimit -u" in out.stdout and "max_env_workers" in out.stdout
    else:
        assert out.stdout.strip() == "STARTED None", out.stdout


def test_what_a_program_prints_is_capped(level):
    code = "import sys\nfor _ in range(1024):\n    sys.stdout.buffer.write(b'A' * 2**20)\n"
    out = run_python(code, limits=Limits(seconds=20, output_kb=256))
    assert out.truncated and len(out.stdout) <= 256 * 1024


# -- lifetime: nothing outlives the call, and the call always returns ----------------------------------------------


def beating(path: Path) -> bool:
    """Whether something still appends to `path`."""
    size = path.stat().st_size if path.exists() else 0
    time.sleep(0.6)
    return (path.stat().st_size if path.exists() else 0) != size


def test_nothing_a_program_starts_outlives_it(tmp_path, level):
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
deadline = time.time() + 4
while not os.path.exists({str(beat)!r}) and time.time() < deadline:  # a loaded machine starts it late
    time.sleep(0.01)
print("parent exits")
"""
    if level == "bubblewrap":  # the jail cannot write the trainer's files: it beats into its scratch instead
        code = code.replace(repr(str(beat)), "'beat'")
    out = run_python(code, limits=Limits(seconds=5))
    assert out.stdout.strip() == "parent exits" and not out.timed_out
    if level == "unisolated":
        assert beat.exists() and not beating(beat)


HYDRA = """
import os, sys, time
T0 = time.time()
if os.fork() == 0:
    os.setsid()
    for fd in (0, 1, 2):
        os.dup2(os.open("/dev/null", os.O_RDWR), fd)
    while time.time() - T0 < 3:  # each hop hands over to a new pid at once
        if os.fork():
            os._exit(0)
        os.setsid()
    while time.time() - T0 < 30:
        with open(BEAT, "a") as f:
            f.write(".")
        time.sleep(0.05)
    os._exit(0)
print("handed over")
"""


def test_a_hydra_chain_does_not_outlive_the_call(tmp_path, level):
    if level == "unisolated" and not CGROUPS:
        pytest.skip("unisolated without cgroups cannot catch a chain of setsid hops (bubblewrap's PID 1 can)")
    beat = tmp_path / "beat"
    code = HYDRA.replace("BEAT", repr(str(beat)) if level == "unisolated" else "'/dev/shm/beat'")
    out = run_python(code, limits=Limits(seconds=1))
    assert "handed over" in out.stdout
    assert not beating(beat)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGINT"])
def test_a_program_that_signals_its_supervisor_still_returns_in_time(signal_name, level):
    code = f"""
import os, signal, time
try:
    os.kill(os.getppid(), signal.{signal_name})
except OSError as e:
    print(type(e).__name__)
time.sleep(30)
"""
    started = time.monotonic()
    out = run_python(code, limits=Limits(seconds=2))
    assert time.monotonic() - started < 2 + 10
    assert out.timed_out or out.returncode != 0


# -- rollouts cannot see each other --------------------------------------------------------------------------------

TAMPER = """
import glob, os, time
end, hit = time.time() + 2, 0
while time.time() < end:
    for path in glob.glob(TRAINER_TMP + "/rlc-sandbox-*/main.py") + glob.glob("/proc/*/cwd/main.py"):
        try:
            if "honest" + " answer" in open(path).read():
                open(path, "w").write("print('tampered by another rollout')")
                hit += 1
        except OSError:
            pass
    time.sleep(0.01)
print(hit)
"""


@NEEDS_BWRAP
def test_concurrent_rollouts_cannot_rewrite_each_others_programs(monkeypatch):
    use("bubblewrap", monkeypatch)
    victim = "import time\ntime.sleep(0.3)\nprint('honest answer 42')  # victim\n"
    with ThreadPoolExecutor(5) as pool:
        attack = TAMPER.replace("TRAINER_TMP", repr(tempfile.gettempdir()))  # where sandboxes used to work
        attacker = pool.submit(run_python, attack, limits=FAST)
        time.sleep(0.3)
        victims = [pool.submit(run_python, victim, limits=FAST) for _ in range(4)]
        outs = [v.result() for v in victims]
    assert [o.stdout.strip() for o in outs] == ["honest answer 42"] * 4
    assert attacker.result().stdout.strip() == "0"


# -- the isolation level is never silently weaker ------------------------------------------------------------------


def test_a_level_the_machine_cannot_give_refuses_to_run(monkeypatch):
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.Probe(False, "no bwrap here", "rlimits", "-"))
    use("bubblewrap", monkeypatch)
    with pytest.raises(sandbox.SandboxUnavailable, match="no bwrap here"):
        run_python("print(1)")
    with pytest.raises(sandbox.SandboxUnavailable, match="no bwrap here"):
        sandbox.configure("bubblewrap")
    assert sandbox.configure("bubblewrap", check=False).bubblewrap is False  # no code to run: nothing to refuse
    assert sandbox.configure("unisolated").available("unisolated")


def test_the_probe_says_what_this_machine_gives():
    found = sandbox.probe()
    assert found.limits in ("cgroup v1", "cgroup v2", "rlimits")
    assert found.bubblewrap == (found.reason == "")
    if not found.bubblewrap:
        assert "bubblewrap" in found.reason or "bwrap" in found.reason


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The local example compiled as is (its environment runs no model code) and with lcb as its environment."""
    from conftest import ROOT

    out = tmp_path_factory.mktemp("compiled")
    for name, overrides in {"plain": [], "lcb": ["environment.env_class=lcb"]}.items():
        subprocess.run(
            [sys.executable, "-m", "rlc.compiler.cli", "compile", str(ROOT / "examples" / "local-cpu.yaml")]
            + ["-o", str(out / name), *overrides],
            check=True,
            capture_output=True,
        )
    return out


def test_the_runtime_refuses_before_training_when_the_machine_cannot_give_the_level(compiled, monkeypatch):
    pytest.importorskip("torch")  # the driver's
    pytest.importorskip("ray")
    from rlc.runtime.config import load
    from rlc.runtime.driver import Driver
    from rlc.runtime.prompts import refuse_unsandboxed
    from rlc.runtime.run_error import RunError

    missing = sandbox.Probe(False, "bubblewrap (bwrap) is not installed on this machine", "rlimits", "-")
    monkeypatch.setattr(sandbox, "probe", lambda: missing)
    monkeypatch.setattr(sandbox, "_policy", sandbox._Policy())
    with pytest.raises(RunError, match="lcb environment runs model-written code.*bwrap. is not installed"):
        Driver(load(compiled / "lcb" / "resolved.yaml"), progress=False)
    job = load(compiled / "plain" / "resolved.yaml")
    Driver(job, progress=False)  # runs no model code: not refused
    with pytest.raises(RunError, match="name the environment.s. lcb, which run model-written code"):  # its rows may
        refuse_unsandboxed({"synthetic", "lcb"}, ["rows.parquet"], job.decisions.data.isolation)


# -- the kernel's side doors (issue 50): keyrings, address families, io_uring, user namespaces, open files ---------

# Each attempt reports what it got: "ok" (the door was open) or the errno's name.
SIDE_DOORS = r"""
import ctypes, json, os, resource, socket, sys
T = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
def call(*args):
    got = libc.syscall(*args)
    return got if got >= 0 else os.strerror(ctypes.get_errno())
def opened(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return "ok"
    except OSError as e:
        return os.strerror(e.errno)
for name in T["doors"]:
    if name == "key":  # a world-readable key in its uid's keyring, for later rollouts (it expires in a minute)
        key = call(T["add_key"], b"user", T["tag"].encode(), b"the answer", 10, -4)  # KEY_SPEC_USER_KEYRING
        if isinstance(key, int):
            call(T["keyctl"], 5, key, 0x3F3F3F3F)  # KEYCTL_SETPERM
            call(T["keyctl"], 15, key, 60)  # KEYCTL_SET_TIMEOUT
        out[name] = "ok" if isinstance(key, int) else key
    elif name == "keys seen":
        out[name] = T["tag"] in open("/proc/keys").read()
    elif name == "vsock":
        out[name] = opened(40, socket.SOCK_STREAM)  # AF_VSOCK
    elif name == "uevents":
        out[name] = opened(16, socket.SOCK_DGRAM, 15)  # AF_NETLINK, NETLINK_KOBJECT_UEVENT
    elif name == "io_uring":
        fd = call(T["io_uring_setup"], 4, ctypes.create_string_buffer(120))
        out[name] = "ok" if isinstance(fd, int) else fd
    elif name == "user namespace":  # and in it a tmpfs of its own, past file_mb
        if libc.unshare(0x10000000 | 0x20000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
            out[name] = os.strerror(ctypes.get_errno())
        else:
            ok = libc.mount(b"none", b"/tmp", b"tmpfs", 0, b"size=100g") == 0
            out[name] = "ok" if ok else "ok, but no mount: " + os.strerror(ctypes.get_errno())
    elif name == "inotify":  # a watch on the shared read-only trees sees the trainer's reads of them
        fd = libc.inotify_init1(0)
        out[name] = "ok" if fd >= 0 else os.strerror(ctypes.get_errno())
    elif name == "machine":  # what a fresh /proc tells of the host: its keys' names and the kernel's command line
        out[name] = [open(p).read() for p in ("/proc/keys", "/proc/key-users", "/proc/cmdline")]
    elif name == "open files":
        held = []
        try:
            while len(held) < 5000:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        out[name] = [len(held), resource.getrlimit(resource.RLIMIT_NOFILE)[0]]
print(json.dumps(out))
"""


def side_doors(*doors: str, tag: str = "") -> dict:
    from rlc.runtime.envs import syscall_filter

    try:
        numbers = {n: syscall_filter.syscall_number(n) for n in ("add_key", "keyctl", "io_uring_setup")}
    except syscall_filter.FilterUnavailable:  # no libseccomp: no jail either, and the open-file cap needs none
        numbers = {}
    given = json.dumps({"doors": doors, "tag": tag, **numbers})
    out = run_python(SIDE_DOORS, stdin=given, limits=FAST)
    assert out.returncode == 0, out
    return json.loads(out.stdout)


def trainer_can_open(family: int, kind: int, proto: int = 0) -> bool:
    try:
        socket.socket(family, kind, proto).close()
        return True
    except OSError:
        return False


@NEEDS_BWRAP
def test_a_key_a_program_stores_reaches_no_later_rollout(monkeypatch):
    # Attacks 1 and 3: a solver stored its answers as world-readable keys in its uid's keyring, and a later program
    # with no solution logic read them from /proc/keys (reward 1.0); each key also stayed in the kernel for good.
    use("bubblewrap", monkeypatch)
    tag = f"rlc-test-answer-{os.urandom(4).hex()}"
    assert side_doors("key", tag=tag)["key"] == os.strerror(1)  # EPERM: no key is made at all
    assert side_doors("keys seen", tag=tag)["keys seen"] is False


HOLDER = r"""
import ctypes, json, sys
from rlc.runtime.envs import sandbox, syscall_filter
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
keyctl, add_key = syscall_filter.syscall_number("keyctl"), syscall_filter.syscall_number("add_key")
secret, tag = sys.argv[1].encode(), sys.argv[2]
ring = libc.syscall(keyctl, 1, tag.encode())  # a session keyring of its own, as runc and systemd give a trainer
if ring < 0:
    print(json.dumps({"skip": "no session keyring can be joined here"}))
    sys.exit()
key = libc.syscall(add_key, b"user", b"hf_token", secret, len(secret), -3)  # KEY_SPEC_SESSION_KEYRING
jail = r'''
import ctypes, json, os, sys
T = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(256)
read = libc.syscall(T["keyctl"], 11, T["key"], buf, 256)  # KEYCTL_READ
planted = libc.syscall(T["add_key"], b"user", b"left-by-sandbox", b"x", 1, -3)
cleared = libc.syscall(T["keyctl"], 7, -3)  # KEYCTL_CLEAR
print(json.dumps({"seen": "hf_token" in open("/proc/keys").read(), "read": buf.value.decode(errors="replace") if read > 0 else "",
                  "planted": planted >= 0, "cleared": cleared == 0}))
'''
given = json.dumps({"keyctl": keyctl, "add_key": add_key, "key": key})
out = sandbox.run_python(jail, stdin=given, limits=sandbox.Limits(seconds=5, memory_mb=512, file_mb=4, output_kb=64))
buf = ctypes.create_string_buffer(256)
size = libc.syscall(keyctl, 11, ring, buf, 256)  # the keyring's key ids, 4 bytes each
held = ctypes.create_string_buffer(256)
libc.syscall(keyctl, 11, key, held, 256)
print(json.dumps({"jail": out.stdout, "stderr": out.stderr, "keys after": size // 4, "token after": held.value.decode()}))
"""


@NEEDS_BWRAP
def test_the_trainers_session_keyring_is_not_the_jails(tmp_path):
    # Attack 2: where the trainer has a session keyring (runc, systemd, PAM), the jail read the token kept there,
    # planted keys in it or emptied it.
    tag = f"rlc-test-session-{os.urandom(4).hex()}"
    done = subprocess.run(
        [sys.executable, "-c", HOLDER, SECRET, tag], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    if "skip" in said:
        pytest.skip(said["skip"])
    assert json.loads(said["jail"]) == {"seen": False, "read": "", "planted": False, "cleared": False}, said
    assert said["keys after"] == 1 and said["token after"] == SECRET


@NEEDS_BWRAP
def test_vsock_and_netlink_sockets_cannot_be_opened(monkeypatch):
    # Attacks 4 and 8: the network namespace does not cover AF_VSOCK (the hypervisor, on Firecracker, Kata and Nitro
    # guests) and a root jail's netlink socket heard the host's uevents.
    use("bubblewrap", monkeypatch)
    got = side_doors("vsock", "uevents")
    assert got["uevents"] == os.strerror(97)  # EAFNOSUPPORT
    if not trainer_can_open(40, socket.SOCK_STREAM):
        pytest.skip("this kernel has no AF_VSOCK: nothing to refuse")
    assert got["vsock"] == os.strerror(97)


@NEEDS_BWRAP
def test_io_uring_and_user_namespaces_are_refused(monkeypatch):
    # io_uring is kernel attack surface a program does not need; in a user namespace of its own a root jail's
    # program mounted a 100 GiB tmpfs past file_mb (attack 6).
    use("bubblewrap", monkeypatch)
    got = side_doors("io_uring", "user namespace")
    assert got["user namespace"] in (os.strerror(1), os.strerror(28))  # EPERM (the filter), ENOSPC (no userns)
    assert got["io_uring"] in (os.strerror(38), os.strerror(1))  # ENOSYS, EPERM (io_uring disabled here)


@NEEDS_BWRAP
def test_a_program_cannot_watch_the_files_it_shares_with_the_trainer(monkeypatch):
    # Attack 8: inotify on the bound site-packages reported the trainer's (and other sandboxes') reads of them.
    use("bubblewrap", monkeypatch)
    assert side_doors("inotify")["inotify"] == os.strerror(1)


@NEEDS_BWRAP
def test_proc_tells_nothing_of_the_machines_keys_or_boot(monkeypatch):
    # Attack 8: /proc/cmdline showed the host's boot options; a non-root jail viewed its uid's key names in /proc/keys.
    use("bubblewrap", monkeypatch)
    assert side_doors("machine")["machine"] == ["", "", ""]


@NEEDS_BWRAP
def test_a_program_cannot_hold_the_machines_file_table(monkeypatch):
    # Attack 5: the jail inherited the trainer's RLIMIT_NOFILE (20000 on rlc's machine), and two sandboxes of
    # 64 processes could fill fs.file-max, after which the trainer's own Popen failed.
    use("bubblewrap", monkeypatch)
    held, limit = side_doors("open files")["open files"]
    assert limit == Limits().open_files and held <= limit


def test_unisolated_programs_cannot_hold_the_machines_file_table(monkeypatch):
    use("unisolated", monkeypatch)
    held, limit = side_doors("open files")["open files"]
    assert limit == Limits().open_files and held <= limit


@pytest.mark.skipif(not CGROUPS, reason="no cgroup can be made here")
def test_a_sandboxs_cgroup_is_the_trainers_child_with_no_swap_and_a_throttled_disk():
    # Attack 6: cgroup v1 sandboxes were made at the hierarchy's root, outside the trainer's (or its pod's) cgroup,
    # without a swap limit and with no I/O throttle.
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own.update({c: path for c in controllers.split(",")})
    group = sandbox._Cgroup.make(Limits(memory_mb=128))
    assert group is not None
    try:
        for path in group.dirs:
            controller = "" if sandbox.probe().limits == "cgroup v2" else path.split("/")[4]
            parent = f"/sys/fs/cgroup/{controller}{own[controller]}".replace("//", "/").rstrip("/")
            assert os.path.dirname(path) == parent
            assert str(os.getpid()) not in os.path.basename(path)  # nothing of the trainer shows through its name
            for name in ("memory.memsw.limit_in_bytes", "memory.swap.max"):
                if os.path.exists(f"{path}/{name}"):
                    assert Path(path, name).read_text().strip() in (str(128 * 2**20), "0")
            for name in ("blkio.throttle.read_bps_device", "io.max"):
                if os.path.exists(f"{path}/{name}") and os.listdir("/sys/block"):
                    assert Path(path, name).read_text().strip()
    finally:
        group.close_fds()
        group.remove()


LCB_FUNCTIONAL = [{"input": "[1, 2]", "output": "3", "testtype": "functional", "metadata": {"func_name": "total"}}]


def test_a_program_that_makes_its_grader_raise_scores_zero(level):
    # Attack 7: 200,000 nested brackets made the call-based grader's json.loads raise RecursionError, so the sample
    # counted as an environment error (no loss) instead of reward 0.
    pytest.importorskip("skyrl_gym")
    from rlc.runtime.envs import gym
    from rlc.runtime.generator import gym_extras
    from rlc.spec.generation import SkyRLGymConfig

    row = {"prompt": [], "reward_spec": {"ground_truth": json.dumps(LCB_FUNCTIONAL)}}
    code = (
        "import os\nclass Solution:\n    def total(self, xs):\n"
        "        os.write(1, b'\\n' + b'[' * 200000 + b']' * 200000 + b'\\n')\n        os._exit(0)\n"
    )
    env = gym.make("lcb", SkyRLGymConfig(), gym_extras(row, 1))
    assert env.step(f"```python\n{code}\n```")["reward"] == 0.0


NO_USERNS = r"""
import errno, json, pyseccomp as sc
flt = sc.SyscallFilter(sc.ALLOW)  # a machine (or a container's profile) that gives no user namespace
flt.add_rule(sc.ERRNO(errno.EPERM), "unshare", sc.Arg(0, sc.MASKED_EQ, 0x10000000, 0x10000000))
flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, 0x10000000, 0x10000000))
flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
flt.load()
from rlc.runtime.envs import sandbox
found = sandbox.probe()
try:
    sandbox.configure("bubblewrap")
    refused = ""
except sandbox.SandboxUnavailable as e:
    refused = str(e)
print(json.dumps({"bubblewrap": found.bubblewrap, "refused": refused}))
"""


@NEEDS_BWRAP
def test_without_user_namespaces_the_jail_is_refused_with_the_fix(tmp_path):
    # A root trainer's jail needs a user namespace too now (its program's own): where none can be made, at either
    # level, the job is refused before it starts, and the message says what to change.
    done = subprocess.run([sys.executable, "-c", NO_USERNS], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["bubblewrap"] is False
    assert "user.max_user_namespaces" in said["refused"] and "unisolated" in said["refused"]


@NEEDS_BWRAP
def test_the_program_runs_in_a_user_namespace_of_its_own(monkeypatch):
    # Issue 50's item 2: a root trainer's jail ran its program in the machine's own user namespace, so its keys,
    # uevent sockets and process counts were the host's; now, at both levels, a namespace mapping one uid only.
    use("bubblewrap", monkeypatch)
    out = run_python("print(open('/proc/self/uid_map').read())", limits=FAST)
    (mapping,) = [line.split() for line in out.stdout.splitlines() if line.strip()]
    assert mapping[2] == "1", out
