#!/usr/bin/env python3
"""Run a SkyPilot task compiled by rlc on simulated hosts: Linux network namespaces on one machine.

    sudo python tools/skysim.py build/<name>/sky.yaml [--hosts N] [--slots-per-node K] [--keep DIR]

Each host is a network namespace with its own address (10.250.<n>.<i+1>/24) on a veth pair joined to a
bridge, its own HOME (so its own ~/.rlc, ~/.cache and Ray temp dir) and the same Python environment as
this script (its `~/.rlc/venv` points at it; nothing is downloaded, pip runs with no index). The task's
`setup` runs on every host, then its `run` on every host at once, exactly as SkyPilot runs them: with
SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS, SKYPILOT_NUM_NODES and SKYPILOT_NUM_GPUS_PER_NODE set per host
(CPU slots stand in for GPUs when the spec's accelerator is none). All traffic stays on the
namespaces' addresses. Afterwards every process in the namespaces is stopped and the namespaces, veth
pairs and the bridge are removed. Needs root (or CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class SimError(Exception):
    """The simulated cluster cannot be made or used; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise SimError(f"`ip {' '.join(args)}` failed: {(p.stderr or p.stdout).strip()}")
    return p


def why_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can (checked by making and removing one)."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"rlcsim-probe-{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot create a network namespace ({p.stderr.strip() or 'ip netns add failed'}); run as root"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    p = subprocess.run(
        ["ip", "link", "add", f"rp{os.getpid() % 100000}", "type", "bridge"], capture_output=True, text=True
    )
    if p.returncode != 0:
        return f"cannot create a bridge ({p.stderr.strip()})"
    subprocess.run(["ip", "link", "del", f"rp{os.getpid() % 100000}"], capture_output=True)
    return None


_made = 0


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Namespaces and bridges of simulations whose owner died without cleaning up (killed mid-test); removed."""
    import re

    removed = []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for ns in listed:
        m = re.fullmatch(r"rlcsim([0-9a-z]+)x\d+-\d+", ns)
        if m and not _alive(int(m.group(1), 36)):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.splitlines()
    for line in links:
        name = line.split(": ")[1].split("@")[0] if ": " in line else ""
        m = re.fullmatch(r"rlcbr([0-9a-z]+)x\d+(?:[vp]\d+)?", name)
        if m and not _alive(int(m.group(1), 36)):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class Host:
    index: int
    netns: str
    ip: str
    home: Path
    ray_tmp: Path


@dataclass
class Cluster:
    """N simulated hosts; use as a context manager (namespaces are removed on exit, whatever happened)."""

    hosts: int
    work: Path
    python_prefix: Path = field(default_factory=lambda: Path(sys.prefix))
    members: list[Host] = field(default_factory=list)

    def __post_init__(self):
        # Names carry the owner's pid (base 36, to fit 15-character link names) and a per-process count, so two
        # clusters of one process never meet and leftovers of a killed owner can be told apart.
        global _made
        _made += 1
        tag = f"{_base36(os.getpid())}x{_made}"
        self.bridge = f"rlcbr{tag}"
        self.subnet = f"10.250.{(os.getpid() + _made) % 250}"
        self.names = [f"rlcsim{tag}-{i}" for i in range(self.hosts)]

    # -- bring-up / tear-down ----------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        remove_leftovers()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.names):
            veth, peer = f"{self.bridge}v{i}", f"{self.bridge}p{i}"
            ip = f"{self.subnet}.{i + 1}"
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", veth, "netns", ns)
            _ip("link", "set", peer, "master", self.bridge)
            _ip("link", "set", peer, "up")
            for args in (
                ("addr", "add", f"{ip}/24", "dev", veth),
                ("link", "set", veth, "up"),
                ("link", "set", "lo", "up"),
                # A route for "which address do I have" probes (Ray's): nothing leaves the bridge's subnet.
                ("route", "add", "default", "via", f"{self.subnet}.254"),
            ):
                _ip("netns", "exec", ns, "ip", *args)
            home = self.work / f"host{i}" / "home"
            self._make_home(home)
            ray_tmp = Path(tempfile.mkdtemp(prefix=f"rs{i}", dir="/tmp"))  # Ray's socket paths must stay short
            self.members.append(Host(i, ns, ip, home, ray_tmp))

    def _make_home(self, home: Path) -> None:
        """A HOME whose ~/.rlc/venv is a venv of its own that sees this Python environment's packages and scripts."""
        venv = home / ".rlc" / "venv"
        (venv / "bin").mkdir(parents=True, exist_ok=True)
        lib = f"lib/python{sys.version_info.major}.{sys.version_info.minor}"
        (venv / lib / "site-packages").mkdir(parents=True, exist_ok=True)
        # The runtime environment's packages, as a site dir (so its .pth files, editable installs too, apply).
        shared = self.python_prefix / lib / "site-packages"
        (venv / lib / "site-packages" / "rlcsim-shared.pth").write_text(
            f"import site; site.addsitedir({str(shared)!r})\n"
        )
        (venv / "pyvenv.cfg").write_text((self.python_prefix / "pyvenv.cfg").read_text())
        for name in ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"):
            (venv / "bin" / name).symlink_to(Path(sys.executable).resolve() if name != "python" else "python3")
        for script in ("pip", "ray", "rlc"):
            if (self.python_prefix / "bin" / script).exists():
                (venv / "bin" / script).symlink_to(self.python_prefix / "bin" / script)

    def close(self) -> None:
        for i, ns in enumerate(self.names):
            self.kill(ns)
            _ip("netns", "del", ns, check=False)
            # A namespace outlives `netns del` while killed processes are being reaped; deleting the bridge-side
            # end of its veth pair removes both ends at once.
            _ip("link", "del", f"{self.bridge}p{i}", check=False)
        _ip("link", "del", self.bridge, check=False)
        for h in self.members:
            shutil.rmtree(h.ray_tmp, ignore_errors=True)

    def kill(self, ns: str) -> int:
        """SIGKILL every process in a namespace (a host losing power); how many there were."""
        p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids = [int(x) for x in p.stdout.split()] if p.returncode == 0 else []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    # -- running -----------------------------------------------------------------------------------------

    def env(self, host: Host, slots: int, extra: dict | None = None) -> dict:
        path = f"{host.home / '.rlc' / 'venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        return {
            "HOME": str(host.home),
            "PATH": path,
            "USER": "root",
            "LANG": "C.UTF-8",
            "SKYPILOT_NODE_RANK": str(host.index),
            "SKYPILOT_NODE_IPS": "\n".join(h.ip for h in self.members),
            "SKYPILOT_NUM_NODES": str(self.hosts),
            "SKYPILOT_NUM_GPUS_PER_NODE": str(slots),
            "RAY_TMPDIR": str(host.ray_tmp),
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "PIP_NO_INDEX": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "HF_HUB_OFFLINE": "1",
            "RLC_CACHE": os.environ.get("RLC_CACHE", str(host.home / ".cache" / "rlc")),
            **(extra or {}),
        }

    def start(self, host: Host, script: str, env: dict, log: Path) -> subprocess.Popen:
        workdir = host.home / "sky_workdir"
        workdir.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")
        return subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "bash", "-c", script],
            env=env,
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def load_task(sky_yaml: Path) -> dict:
    from ruamel.yaml import YAML

    task = YAML(typ="safe").load(sky_yaml.read_text())
    if not isinstance(task, dict) or "run" not in task:
        raise SimError(f"{sky_yaml} is not a SkyPilot task with a run section")
    return task


def wait_all(procs: dict[int, subprocess.Popen], timeout_s: float) -> dict[int, int | None]:
    """Exit codes by host index; None for a process still running at the deadline (then killed)."""
    deadline = time.monotonic() + timeout_s
    codes: dict[int, int | None] = {}
    for i, p in procs.items():
        try:
            codes[i] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            codes[i] = None
    return codes


def task_env(cluster: Cluster, host: Host, task: dict, slots: int, env: dict | None = None) -> dict:
    """The environment SkyPilot gives the task's commands on `host`: its envs, then the SKYPILOT_* variables."""
    return cluster.env(host, slots, {**{k: str(v) for k, v in (task.get("envs") or {}).items()}, **(env or {})})


def setup(
    cluster: Cluster,
    task: dict,
    slots: int,
    *,
    logs: Path,
    hosts: list[int] | None = None,
    timeout_s: float = 600,
    env: dict | None = None,
) -> None:
    """The task's setup section on `hosts` (default all) at once; raises when one fails."""
    logs.mkdir(parents=True, exist_ok=True)
    chosen = [cluster.members[i] for i in (hosts if hosts is not None else range(cluster.hosts))]
    if not task.get("setup") or not chosen:
        return
    codes = wait_all(
        {
            h.index: cluster.start(
                h, task["setup"], task_env(cluster, h, task, slots, env), logs / f"setup-{h.index}.log"
            )
            for h in chosen
        },
        timeout_s,
    )
    bad = {i: c for i, c in codes.items() if c != 0}
    if bad:
        raise SimError(f"setup failed on host(s) {bad}; see {logs}/setup-*.log")


def run_task(
    cluster: Cluster,
    task: dict,
    slots: int,
    *,
    logs: Path,
    hosts: list[int] | None = None,
    setup_timeout_s: float = 600,
    run_timeout_s: float = 1800,
    env: dict | None = None,
) -> dict[int, int | None]:
    """The task's setup, then its run section on `hosts` (default all) at once; run exit codes by host."""
    setup(cluster, task, slots, logs=logs, hosts=hosts, timeout_s=setup_timeout_s, env=env)
    chosen = [cluster.members[i] for i in (hosts if hosts is not None else range(cluster.hosts))]
    return wait_all(
        {
            h.index: cluster.start(h, task["run"], task_env(cluster, h, task, slots, env), logs / f"run-{h.index}.log")
            for h in chosen
        },
        run_timeout_s,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/skysim.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("sky_yaml", type=Path)
    parser.add_argument("--hosts", type=int, help="simulated hosts (default: the task's num_nodes)")
    parser.add_argument(
        "--slots-per-node", type=int, help="SKYPILOT_NUM_GPUS_PER_NODE (default: plan.json beside the task)"
    )
    parser.add_argument("--keep", type=Path, help="keep the hosts' homes and logs in this directory")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds the run section may take (default 1800)")
    args = parser.parse_args(argv)
    reason = why_unavailable()
    if reason:
        print(f"skysim: {reason}", file=sys.stderr)
        return 2
    try:
        task = load_task(args.sky_yaml)
        hosts = args.hosts or int(task.get("num_nodes", 1))
        slots = args.slots_per_node
        if slots is None:
            import json

            plan = args.sky_yaml.parent / "plan.json"
            slots = json.loads(plan.read_text())["cluster"]["gpus_per_node"] if plan.exists() else 1
        work = args.keep or Path(tempfile.mkdtemp(prefix="skysim-"))
        with Cluster(hosts, work) as cluster:
            print(f"skysim: {hosts} host(s): " + ", ".join(f"{h.netns} {h.ip}" for h in cluster.members), flush=True)
            codes = run_task(cluster, task, slots, logs=work / "logs", run_timeout_s=args.timeout)
        print(f"skysim: run exit codes by host: {codes}; logs in {work / 'logs'}")
        return 0 if all(c == 0 for c in codes.values()) else 1
    except SimError as exc:
        print(f"skysim: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
