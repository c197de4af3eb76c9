#!/usr/bin/env python3
"""A real Slurm cluster on this machine: munged, slurmctld and one slurmd per simulated host, all in a temp dir.

    sudo python tools/slurmsim.py [--hosts N] [--keep DIR] -- COMMAND...

runs COMMAND with SLURM_CONF pointing at the cluster (e.g. `sbatch --wait build/<name>/slurm/job.sbatch`), then
cancels what is left and stops every daemon. With one host, slurmd runs on this machine's own network; with more,
each slurmd runs in a network namespace of its own address (tools/skysim.py makes them), entered with `nsenter
--net` only: `ip netns exec` also remounts /sys, where slurmd then finds no cgroup file system and refuses to start.
Every node is named explicitly (`slurmd -N`), so nodes need no host names of their own; spool, pid and log paths
are per node (`%n`). The daemons run as root (SlurmUser=root), as do the jobs: needs root and Debian's `slurm-wlm`
and `munge` packages.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import skysim  # noqa: E402

DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "scancel", "scontrol", "sinfo")
INSTALL = "apt-get install -y --no-install-recommends slurm-wlm munge"


class SlurmSimError(Exception):
    """The cluster cannot be started or used; the message says why."""


def why_unavailable(hosts: int = 1) -> str | None:
    """Why a Slurm cluster of `hosts` hosts cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "Slurm's daemons and jobs run as root here; run the tests as root"
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found); as root: {INSTALL}"
    if hosts > 1:
        if shutil.which("nsenter") is None:
            return "nsenter (util-linux) is not installed"
        return skysim.why_unavailable()
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    addr: str
    netns: str | None


@dataclass
class SlurmCluster:
    """`hosts` Slurm nodes of `cpus` CPUs each; use as a context manager (everything is stopped on exit)."""

    hosts: int
    work: Path
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    gpus: int = (
        0  # GPUs each node declares (a count-only GRES of type `gpu_type`): sbatch --test-only sizes, no devices
    )
    gpu_type: str = "h100"
    features: tuple[str, ...] = ()  # node features a --constraint can name
    memory_mb: int = 1000  # RealMemory each node declares
    nodes: list[Node] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    net: skysim.Cluster | None = None

    def __enter__(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def conf(self) -> Path:
        return self.work / "slurm.conf"

    def env(self, extra: dict | None = None) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def _start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        if self.hosts > 1:
            self.net = skysim.Cluster(self.hosts, self.work / "hosts").__enter__()
            ctl_addr = f"{self.net.subnet}.254"
            self.nodes = [Node(f"rlcn{h.index}", h.ip, h.netns) for h in self.net.members]
        else:
            ctl_addr = "127.0.0.1"
            self.nodes = [Node("rlcn0", "127.0.0.1", None)]
        # munge's socket path must stay short (a Unix socket path has at most 107 bytes).
        self.munge = Path(tempfile.mkdtemp(prefix="rlcmunge-", dir="/tmp"))
        key = self.munge / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={key}",
                f"--socket={self.munge / 'sock'}",
                f"--pid-file={self.munge / 'pid'}",
                f"--log-file={self.munge / 'log'}",
                f"--seed-file={self.munge / 'seed'}",
            ],
            "munged",
        )
        self._wait_for(lambda: (self.munge / "sock").exists(), 20, "munged did not create its socket")
        for sub in ("state", "spool", "log"):
            (self.work / sub).mkdir(exist_ok=True)
        self.conf.write_text(self._conf_text(ctl_addr))
        self._spawn(["slurmctld", "-D", "-f", str(self.conf)], "slurmctld")
        for node in self.nodes:
            command = ["slurmd", "-D", "-f", str(self.conf), "-N", node.name]
            if node.netns:
                command = ["nsenter", f"--net=/var/run/netns/{node.netns}", *command]
            self._spawn(command, f"slurmd-{node.name}")
        self._wait_for(self._all_idle, 60, "the Slurm nodes did not come up idle")

    def _conf_text(self, ctl_addr: str) -> str:
        w = self.work
        lines = [
            "ClusterName=rlcsim",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({ctl_addr})",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge / 'sock'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2",
            "KillWait=10",
            # Job ids of their own: the batch script names Ray's directory after the job id, and two simulated
            # clusters on one machine must not both start at job 1.
            f"FirstJobId={random.randint(1000, 60_000_000)}",
            f"StateSaveLocation={w / 'state'}",
            f"SlurmdSpoolDir={w / 'spool' / '%n'}",
            f"SlurmctldPidFile={w / 'slurmctld.pid'}",
            f"SlurmdPidFile={w / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={w / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={w / 'log' / 'slurmd-%n.log'}",
        ]
        extra = f" Gres=gpu:{self.gpu_type}:{self.gpus}" if self.gpus else ""
        extra += f" Feature={','.join(self.features)}" if self.features else ""
        if self.gpus:
            lines.append("GresTypes=gpu")
            # slurmd counts a GPU only with a device file: plain files stand in for them (nothing opens them).
            devices = w / "dev"
            devices.mkdir(exist_ok=True)
            for i in range(self.gpus):
                (devices / f"gpu{i}").touch()
            files = f"{devices}/gpu[0-{self.gpus - 1}]"
            gres = [f"NodeName={n.name} Name=gpu Type={self.gpu_type} File={files}" for n in self.nodes]
            (w / "gres.conf").write_text("\n".join(gres) + "\n")
        if self.cpus > (os.cpu_count() or 1) or self.gpus:  # nodes larger than the machine: slurmd takes the config
            lines.append("SlurmdParameters=config_overrides")
        lines += [
            f"NodeName={n.name} NodeAddr={n.addr} CPUs={self.cpus} RealMemory={self.memory_mb}{extra}"
            for n in self.nodes
        ]
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _spawn(self, command: list[str], log: str) -> None:
        out = open(self.work / f"{log}.out", "ab")
        self.procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SlurmSimError(f"{what} (exited: {dead}); see {self.work}/*.out and {self.work}/log/")
            time.sleep(0.2)

    def _reasons(self) -> str:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %E"], env=self.env(), capture_output=True, text=True)
        return p.stdout.strip()

    def _all_idle(self) -> bool:
        p = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(), capture_output=True, text=True)
        states = dict(line.split() for line in p.stdout.splitlines() if len(line.split()) == 2)
        return p.returncode == 0 and all(states.get(n.name) == "idle" for n in self.nodes)

    def run(self, *args: str, env: dict | None = None, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """A Slurm client command (sbatch, squeue, scontrol, ...) against this cluster."""
        return subprocess.run(list(args), env=self.env(env), capture_output=True, text=True, timeout=timeout, **kw)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, Comment, ...); empty once Slurm forgot the job."""
        p = self.run("scontrol", "show", "job", "--oneliner", job_id)
        fields: dict[str, str] = {}
        for word in p.stdout.split(" "):
            key, eq, value = word.partition("=")
            if eq and key:
                fields[key] = value.strip()
        return fields

    def wait(self, job_id: str, timeout_s: float) -> dict[str, str]:
        """Wait until the job has ended; its `scontrol show job` fields."""
        deadline = time.monotonic() + timeout_s
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                return fields
            if time.monotonic() > deadline:
                raise SlurmSimError(f"job {job_id} is still {fields.get('JobState')} after {timeout_s:g} s")
            time.sleep(0.5)

    def close(self) -> None:
        if self.procs and self.conf.exists():
            subprocess.run(["scancel", "--full", "--user=root"], env=self.env(), capture_output=True, timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                p = subprocess.run(["squeue", "-h"], env=self.env(), capture_output=True, text=True, timeout=30)
                if p.returncode != 0 or not p.stdout.strip():
                    break
                time.sleep(0.5)
        for proc in reversed(self.procs):  # slurmd before slurmctld before munged
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self._kill_strays()
        if self.net is not None:
            self.net.close()
        shutil.rmtree(getattr(self, "munge", self.work / "none"), ignore_errors=True)

    def _kill_strays(self) -> None:
        """Job processes that outlived their daemons (slurmstepd and what it started): their SLURM_CONF is ours."""
        import psutil

        conf = str(self.conf)
        for proc in psutil.process_iter(["cmdline", "environ"]):
            try:
                if (proc.info["environ"] or {}).get("SLURM_CONF") == conf or conf in (proc.info["cmdline"] or ()):
                    proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/slurmsim.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1, help="simulated hosts, each a Slurm node (default 1)")
    parser.add_argument("--keep", type=Path, help="keep the cluster's configuration, state and logs in this directory")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="command to run against the cluster (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command to run, e.g. -- sbatch --wait build/NAME/slurm/job.sbatch")
    reason = why_unavailable(args.hosts)
    if reason:
        print(f"slurmsim: {reason}", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="slurmsim-"))
    try:
        with SlurmCluster(args.hosts, work) as cluster:
            names = ", ".join(f"{n.name} {n.addr}" for n in cluster.nodes)
            print(f"slurmsim: {args.hosts} node(s): {names}; SLURM_CONF={cluster.conf}", flush=True)
            return subprocess.call(command, env=cluster.env())
    except SlurmSimError as exc:
        print(f"slurmsim: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
