#!/usr/bin/env python3
"""Benchmark: `rlc validate` against SkyRL's own config building and validation.

    python bench/validate_bench.py            # measure both sides, print a table, update bench/RESULTS.md
    python bench/validate_bench.py --help     # options (runs, skipping or reinstalling the peer, --check)

rlc side: the whole-process wall time of `rlc validate` (the `rlc` next to this interpreter, else the one on
PATH) on examples/gsm8k-grpo-2node.yaml and on a broken copy of it (policy_mini_batch_size 300, which does
not divide train_batch_size 1024, plus a misspelt key). Median of --runs runs after --warmups warm-ups.

Peer side: the whole-process wall time of bench/skyrl_peer.py, run with the Python of a separate venv
(bench/.venv-skyrl) that holds skyrl-train 0.3.1 and only what its config path imports. The driver builds
the same job's config with Hydra from SkyRL's base config and calls SkyRL's `validate_cfg`. The venv is
created on first use (about 1.2 GB on disk from the package registry, one to two minutes); when it cannot be
set up or imported, the peer is skipped with the reason printed, and rlc is still measured. Median of
--peer-runs runs after --peer-warmups warm-ups; the timed runs of both sides are interleaved.

Goals printed with the results: `rlc validate` under 0.25 s, and at least 20x faster than the peer.
The results go to bench/RESULTS.md between this benchmark's own markers; other sections are left alone.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from results import RESULTS, cpu_model, find_rlc, loadavg, make_venv, nproc, write_section  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
GOOD_SPEC = "examples/gsm8k-grpo-2node.yaml"  # relative to ROOT, as a user would type it

GOAL_SECONDS = 0.25
GOAL_RATIO = 20.0

# The two edits that turn the good spec into the broken one: (old text, new text, what it breaks).
BREAKAGES = [
    ("policy_mini_batch_size: 256", "policy_mini_batch_size: 300", "300 does not divide train_batch_size 1024"),
    ("micro_forward_batch_size_per_gpu:", "micro_forward_batch_size_per_gpus:", "misspelt key"),
]

# The peer: its own venv, never rlc's. skyrl-train declares Python 3.12 and GPU-only requirements, so it goes
# in with --no-deps --ignore-requires-python, after a CPU torch, and then only what its config path imports.
PEER_VENV = BENCH / ".venv-skyrl"
PEER_DRIVER = BENCH / "skyrl_peer.py"
PEER_MARKER = PEER_VENV / ".validate-bench-setup.json"
PEER_SETUP_LOG = PEER_VENV / "setup.log"
# torch goes in with --no-deps (its small deps are listed below), so that a machine without a CPU wheel at
# hand can never pull the CUDA libraries (gigabytes) in as torch's dependencies.
PEER_TORCH = ["torch==2.13.0"]
PEER_TORCH_DEPS = [
    "filelock",
    "typing-extensions>=4.10.0",
    "setuptools>=77.0.3",
    "sympy>=1.13.3",
    "networkx>=2.5.1",
    "jinja2",
    "fsspec>=0.8.5",
]
PEER_PACKAGE = ["skyrl-train==0.3.1"]
# hydra-core and ray at the versions skyrl-train 0.3.1 pins; the rest is what its config path imports.
PEER_DEPS = ["hydra-core==1.3.2", "omegaconf", "ray==2.51.1", "loguru", "jaxtyping", "numpy", "fsspec"]
PEER_PROBE = "import skyrl_train.utils.utils, skyrl_train.config.utils, hydra"


class BenchError(RuntimeError):
    """A side could not be measured as intended (wrong exit status, unexpected output)."""


# ----------------------------------------------------------------------------------------------- helpers


@dataclass
class Case:
    """One command to time: which side, which config, how to run it, what it must exit with."""

    side: str  # "rlc" or "peer"
    name: str  # "good" or "broken"
    argv: list[str]
    env: dict
    cwd: Path
    expect_rc: int
    warmups: int
    runs: int
    check: Callable[[subprocess.CompletedProcess], None] | None = None  # on every run's output
    times: list[float] = field(default_factory=list)
    last: subprocess.CompletedProcess | None = None

    def run_once(self) -> float:
        """Wall time of one run of argv, spawn to exit, output captured through pipes."""
        t0 = time.perf_counter()
        proc = subprocess.run(
            self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True
        )
        elapsed = time.perf_counter() - t0
        if proc.returncode != self.expect_rc:
            raise BenchError(
                f"`{' '.join(self.argv)}` exited {proc.returncode}, expected {self.expect_rc}\n"
                f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
            )
        if self.check:
            self.check(proc)
        self.last = proc
        return elapsed


def run_interleaved(cases: list[Case]) -> str:
    """Warm every case up, then time them in rounds, each round running every case its share of times.

    Interleaving spreads whatever else the machine is doing over both sides alike, so the ratio holds up
    better than the absolute numbers on a busy machine. A failing peer case drops the peer (its reason is
    returned) and the rlc cases go on; a failing rlc case ends the benchmark.
    """
    peer_failure = ""

    def attempt(case: Case, record: bool) -> None:
        nonlocal peer_failure
        try:
            elapsed = case.run_once()
        except (BenchError, ValueError, KeyError) as exc:  # ValueError/KeyError: no readable peer report
            if case.side != "peer":
                raise
            peer_failure = f"the SkyRL peer did not run as intended ({case.name} config): {exc}"
            print(f"peer: SKIPPED: {peer_failure}", flush=True)
            cases[:] = [c for c in cases if c.side != "peer"]
            return
        if record:
            case.times.append(elapsed)

    for case in list(cases):
        for _ in range(case.warmups):
            if case in cases:
                attempt(case, record=False)
    rounds = min(c.runs for c in cases)
    for r in range(rounds):
        for case in list(cases):
            target = -(-case.runs * (r + 1) // rounds)  # ceil: this case's runs spread evenly over the rounds
            while case in cases and len(case.times) < target:
                attempt(case, record=True)
    return peer_failure


def summary(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


# -------------------------------------------------------------------------------------------- rlc side


def write_broken(tmp: Path) -> Path:
    text = (ROOT / GOOD_SPEC).read_text(encoding="utf-8")
    for old, new, why in BREAKAGES:
        if text.count(old) != 1:
            raise BenchError(f"{GOOD_SPEC} no longer holds `{old}` exactly once; cannot make the {why}")
        text = text.replace(old, new)
    path = tmp / "gsm8k-grpo-2node-broken.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def rlc_cases(rlc: str, broken: Path, warmups: int, runs: int) -> tuple[list[Case], dict]:
    """Check once (untimed, JSON output) that rlc says what it should about each spec; return the timed cases."""
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("RLC_DEBUG", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # let the warm-ups leave bytecode caches, as any normal run does
    info: dict = {"exe": rlc, "errors": {}}
    cases = []
    for name, spec, rc in (("good", GOOD_SPEC, 0), ("broken", str(broken), 1)):
        check = subprocess.run(
            [rlc, "validate", "--format", "json", spec],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if check.returncode != rc:
            raise BenchError(
                f"rlc validate {spec} exited {check.returncode}, expected {rc}:\n"
                f"{check.stdout[-2000:]}{check.stderr[-2000:]}"
            )
        report = json.loads(check.stdout)
        errors = [d for d in report["diagnostics"] if d["severity"] == "error"]
        if name == "broken":
            text = json.dumps(errors)
            for needle in ("300", "micro_forward_batch_size_per_gpus"):
                if needle not in text:
                    raise BenchError(f"rlc validate did not report `{needle}` in the broken spec:\n{check.stdout}")
        info["errors"][name] = [f"{d['code']}: {d['message']}" for d in errors]
        # The timed runs: the default text format, as a user runs it.
        cases.append(Case("rlc", name, [rlc, "validate", spec], env, ROOT, rc, warmups, runs))
    version = subprocess.run([rlc, "--version"], capture_output=True, text=True, env=env).stdout.strip()
    info["version"] = version.rsplit(" ", 1)[-1] if version else "unknown"
    return cases, info


def rlc_results(cases: list[Case], info: dict) -> dict:
    out = {"exe": info["exe"], "version": info["version"]}
    for c in cases:
        if c.side == "rlc":
            out[c.name] = {**summary(c.times), "errors": info["errors"][c.name]}
    return out


# ------------------------------------------------------------------------------------------- peer side


def peer_python() -> Path:
    return PEER_VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def peer_setup_spec() -> dict:
    return {"torch": PEER_TORCH, "torch_deps": PEER_TORCH_DEPS, "package": PEER_PACKAGE, "deps": PEER_DEPS}


def _probe(py: Path) -> str | None:
    """None when SkyRL's config path imports in the peer venv, else the reason it does not."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="rlc-bench-home-") as home:
        env["HOME"] = home
        p = subprocess.run([str(py), "-c", PEER_PROBE], env=env, cwd=home, capture_output=True, text=True)
    if p.returncode == 0:
        return None
    last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return f"SkyRL's config path does not import in {PEER_VENV.relative_to(ROOT)}: {last}"


def setup_peer(reinstall: bool) -> tuple[Path | None, str]:
    """Create or repair the peer venv. Returns (its python, note) or (None, reason it is unusable)."""
    py = peer_python()
    spec = peer_setup_spec()
    if reinstall and PEER_VENV.exists():
        shutil.rmtree(PEER_VENV)
    if py.exists() and PEER_MARKER.exists():
        try:
            recorded = json.loads(PEER_MARKER.read_text())
        except (OSError, ValueError):
            recorded = None
        if recorded == spec:
            reason = _probe(py)
            if reason is None:
                return py, "peer venv already set up"
            print(f"peer: {reason}; reinstalling its packages", flush=True)

    print(
        f"peer: setting up {PEER_VENV.relative_to(ROOT)} (skyrl-train 0.3.1, CPU torch; "
        f"log in {PEER_SETUP_LOG.relative_to(ROOT)}) ...",
        flush=True,
    )
    t0 = time.perf_counter()
    if not py.exists():
        error = make_venv(PEER_VENV)
        if error:
            return None, error
    PEER_MARKER.unlink(missing_ok=True)
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    steps = [
        ("CPU torch", pip + ["--no-deps", *PEER_TORCH]),
        ("torch's small deps", pip + PEER_TORCH_DEPS),
        (
            "skyrl-train (no deps, declared for Python 3.12)",
            pip + ["--no-deps", "--ignore-requires-python", *PEER_PACKAGE],
        ),
        ("SkyRL's config-path imports", pip + PEER_DEPS),
    ]
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    with open(PEER_SETUP_LOG, "a", encoding="utf-8") as log:
        for what, argv in steps:
            log.write(f"\n$ {' '.join(argv)}\n")
            log.flush()
            p = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
            if p.returncode != 0:
                return None, (
                    f"pip could not install {what} (exit {p.returncode}); see {PEER_SETUP_LOG.relative_to(ROOT)}"
                )
    reason = _probe(py)
    if reason is not None:
        return None, reason
    PEER_MARKER.write_text(json.dumps(spec))
    return py, f"peer venv set up in {time.perf_counter() - t0:.0f} s"


def peer_env(home: Path) -> dict:
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),  # nothing lands in the real home
        "TMPDIR": str(home / "tmp"),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        # validate_cfg insists on this env var for logger=wandb; the spec names it as a launch secret.
        "WANDB_API_KEY": "dummy-for-validate-bench",
        "NO_COLOR": "1",
    }
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE"):
        env.pop(var, None)
    return env


def _peer_report(proc: subprocess.CompletedProcess) -> dict:
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BenchError(f"the peer driver printed no report; stderr: {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def _check_peer(name: str) -> Callable[[subprocess.CompletedProcess], None]:
    def check(proc: subprocess.CompletedProcess) -> None:
        report = _peer_report(proc)
        if report.get("ray_initialized") or report.get("cuda_initialized"):
            raise BenchError(f"SkyRL peer touched Ray or CUDA while validating: {report}")
        if name == "broken" and "300" not in (report.get("error") or ""):
            raise BenchError(f"SkyRL peer rejected the broken config for another reason: {report.get('error')}")

    return check


def peer_cases(py: Path, home: Path, warmups: int, runs: int) -> list[Case]:
    env = peer_env(home)
    return [
        Case("peer", name, [str(py), str(PEER_DRIVER), name], env, home, rc, warmups, runs, _check_peer(name))
        for name, rc in (("good", 0), ("broken", 1))
    ]


def peer_results(cases: list[Case], py: Path, home: Path) -> dict | None:
    mine = {c.name: c for c in cases if c.side == "peer"}
    if set(mine) != {"good", "broken"}:
        return None
    out: dict = {"python_exe": str(py)}
    for name, c in mine.items():
        assert c.last is not None
        out[name] = {**summary(c.times), "report": _peer_report(c.last)}
    out["home_files"] = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    out["versions"] = out["good"]["report"]["versions"]
    out["python"] = out["good"]["report"]["python"]
    return out


# ---------------------------------------------------------------------------------------------- report


def ratio(peer: dict | None, rlc: dict, name: str) -> float | None:
    return peer[name]["median"] / rlc[name]["median"] if peer else None


def print_table(rlc: dict, peer: dict | None, peer_reason: str) -> None:
    n_rlc = rlc["good"]["n"]
    n_peer = peer["good"]["n"] if peer else 0
    head = ["config", f"rlc validate (median of {n_rlc})", f"SkyRL build+validate (median of {n_peer})", "SkyRL / rlc"]
    rows = []
    for name in ("good", "broken"):
        r = rlc[name]
        cells = [name, f"{fmt_s(r['median'])}  [{fmt_s(r['min'])} .. {fmt_s(r['max'])}]"]
        if peer:
            p = peer[name]
            cells += [
                f"{fmt_s(p['median'])}  [{fmt_s(p['min'])} .. {fmt_s(p['max'])}]",
                f"{ratio(peer, rlc, name):.1f}x",
            ]
        else:
            cells += ["skipped", "-"]
        rows.append(cells)
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]
    for cells in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    print()
    for name in ("good", "broken"):
        m = rlc[name]["median"]
        print(
            f"goal: rlc validate ({name}) under {GOAL_SECONDS} s: {fmt_s(m)} -> {'met' if m < GOAL_SECONDS else 'NOT met'}"
        )
    if peer:
        for name in ("good", "broken"):
            x = ratio(peer, rlc, name)
            print(
                f"goal: rlc >= {GOAL_RATIO:.0f}x faster than SkyRL ({name}): {x:.1f}x -> "
                f"{'met' if x >= GOAL_RATIO else 'NOT met'}"
            )
        s = peer["good"]["report"]["seconds"]
        print(
            f"SkyRL time inside its process (good, last run): imports {fmt_s(s['import'])}, "
            f"Hydra compose {fmt_s(s['compose'])}, validate_cfg {fmt_s(s['validate'])}; "
            f"Ray initialized: no, CUDA initialized: no"
        )
    else:
        print(f"SkyRL peer skipped: {peer_reason}")


def goals_met(rlc: dict, peer: dict | None) -> bool:
    ok = all(rlc[n]["median"] < GOAL_SECONDS for n in ("good", "broken"))
    if peer:
        ok = ok and all(ratio(peer, rlc, n) >= GOAL_RATIO for n in ("good", "broken"))
    return ok


def results_section(rlc: dict, peer: dict | None, peer_reason: str, args, loads: tuple[str, str]) -> str:
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    gpu = "no GPU" if not shutil.which("nvidia-smi") else "GPU present (not used)"
    rlc_py = platform.python_version()
    L = [
        "## rlc validate vs SkyRL config validation",
        "",
        f"Measured {now} with `python bench/validate_bench.py` on {platform.system()} {platform.machine()}, "
        f"nproc {nproc()} ({cpu_model()}), {gpu}; load average (1, 5, 15 min) {loads[0]} before and "
        f"{loads[1]} after (wall-clock numbers on a busy machine come out slower).",
        f"rlc side: rlc {rlc['version']}, Python {rlc_py}. "
        + (
            f"Peer side: skyrl-train {peer['versions']['skyrl-train']}, Python {peer['python']}, "
            f"torch {peer['versions']['torch']}, ray {peer['versions']['ray']}, "
            f"hydra-core {peer['versions']['hydra-core']}, omegaconf {peer['versions']['omegaconf']}."
            if peer
            else f"Peer side: skipped ({peer_reason})."
        ),
        "",
        f"| config | rlc validate (median of {rlc['good']['n']}) | SkyRL build + validate "
        f"(median of {peer['good']['n'] if peer else 0}) | SkyRL / rlc |",
        "| --- | --- | --- | --- |",
    ]
    for name in ("good", "broken"):
        r = rlc[name]
        row = f"| {name} | {fmt_s(r['median'])} (min {fmt_s(r['min'])}, max {fmt_s(r['max'])}) |"
        if peer:
            p = peer[name]
            row += f" {fmt_s(p['median'])} (min {fmt_s(p['min'])}, max {fmt_s(p['max'])}) | {ratio(peer, rlc, name):.1f}x |"
        else:
            row += " skipped | - |"
        L.append(row)
    L.append("")
    goal_t = ", ".join(f"{n} {fmt_s(rlc[n]['median'])}" for n in ("good", "broken"))
    t_ok = all(rlc[n]["median"] < GOAL_SECONDS for n in ("good", "broken"))
    L.append(f"- Goal `rlc validate` under {GOAL_SECONDS} s: **{'met' if t_ok else 'not met'}** ({goal_t}).")
    if peer:
        goal_x = ", ".join(f"{n} {ratio(peer, rlc, n):.1f}x" for n in ("good", "broken"))
        x_ok = all(ratio(peer, rlc, n) >= GOAL_RATIO for n in ("good", "broken"))
        L.append(
            f"- Goal rlc at least {GOAL_RATIO:.0f}x faster than SkyRL: **{'met' if x_ok else 'not met'}** ({goal_x})."
        )
        s = peer["good"]["report"]["seconds"]
        L.append(
            f"- Where SkyRL's time goes (good config, inside its process, last run): imports "
            f"{fmt_s(s['import'])} (torch, ray, Hydra), Hydra compose {fmt_s(s['compose'])}, "
            f"`validate_cfg` {fmt_s(s['validate'])}."
        )
    L += [
        "",
        "What was timed (wall clock from spawning the process to its exit, output captured through pipes; "
        f"{args.warmups} warm-up run(s) for rlc and {args.peer_warmups} for SkyRL dropped first, "
        "`PYTHONDONTWRITEBYTECODE` unset for both so that bytecode caches are warm; the timed runs of both "
        "sides interleaved in rounds, so that other load on the machine falls on both alike):",
        "",
        f"- **rlc**: `rlc validate {GOOD_SPEC}` run from the repository root with `NO_COLOR=1`, default text "
        "output: interpreter start-up, the console-script entry point, imports, YAML load, schema and semantic "
        "checks, rendering the diagnostics. The broken config is a copy in a temporary directory with "
        + "; ".join(f"`{old.rstrip(':')}` changed to `{new.rstrip(':')}` ({why})" for old, new, why in BREAKAGES)
        + f". rlc reported {len(rlc['broken']['errors'])} error(s) on it: "
        + "; ".join(f"`{e.split(':', 1)[0]}`" for e in rlc["broken"]["errors"])
        + ".",
        "- **SkyRL**: `bench/.venv-skyrl/bin/python bench/skyrl_peer.py good|broken`: interpreter start-up, "
        "`import skyrl_train.utils.utils` (which imports torch, ray, numpy, loguru, jaxtyping) and Hydra, "
        "building the config as `skyrl_train.entrypoints.main_base` does (Hydra, `ppo_base_config.yaml`, the "
        "same job given as command-line overrides: 2 nodes x 8 GPUs, policy and ref on 16 GPUs, colocate_all, "
        "8 vLLM engines of TP=2, train_batch_size 1024, mini 256, micro 16, n_samples_per_prompt 8, "
        "Qwen/Qwen2.5-7B-Instruct), then `skyrl_train.utils.utils.validate_cfg(cfg)`, the check `main_base.main` "
        "runs before it starts Ray. The broken variant sets `trainer.policy_mini_batch_size=300`; SkyRL stops "
        "at its first failed assertion" + (f': "{peer["broken"]["report"]["error"]}".' if peer else "."),
        "",
        "Notes:",
        "",
        "- SkyRL's validation here is static: it needs no GPU and no network. The driver checks after each run "
        "that Ray was not initialized and CUDA not touched; `validate_cfg`'s loss/estimator registry look-ups stay "
        "local while Ray is down. Not timed on the SkyRL side: importing `main_base` itself (transformers, vLLM "
        "and the rest of its training stack, not installed here), `ray.init` and anything after validation, so "
        "the SkyRL numbers are a lower bound on what a SkyRL user waits for a config error.",
        "- The peer venv holds skyrl-train 0.3.1 installed with `--no-deps --ignore-requires-python` on this "
        "Python (it declares 3.12), a CPU-only torch 2.13.0, and only the packages its config path imports "
        "(hydra-core, omegaconf, ray, loguru, jaxtyping, numpy, fsspec). SkyRL on a GPU machine imports the CUDA "
        "build of torch instead; that was not measured here.",
        "- SkyRL's peer process runs with a temporary `HOME`, `RAY_AUTH_MODE=disabled` and a dummy "
        "`WANDB_API_KEY` (`validate_cfg` requires that variable for `logger: wandb`; `rlc validate` does not "
        "read secrets)." + (f" Files it left in that `HOME`: {len(peer['home_files'])}." if peer else ""),
        "- The misspelt key is not in SkyRL's broken variant: Hydra rejects an unknown override "
        "(`Could not override ...`) while composing, before `validate_cfg` runs, so SkyRL would report that one "
        "problem and not reach the batch-size check. rlc reports all of them in one run.",
    ]
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=15, help="timed runs of rlc per config (default 15)")
    ap.add_argument("--warmups", type=int, default=2, help="untimed rlc runs first (default 2)")
    ap.add_argument("--peer-runs", type=int, default=5, help="timed runs of the SkyRL peer per config (default 5)")
    ap.add_argument("--peer-warmups", type=int, default=1, help="untimed peer runs first (default 1)")
    ap.add_argument("--skip-peer", action="store_true", help="measure rlc only")
    ap.add_argument(
        "--no-peer-setup",
        action="store_true",
        help="never create or repair bench/.venv-skyrl; skip the peer when it is not ready",
    )
    ap.add_argument("--reinstall-peer", action="store_true", help="delete and recreate bench/.venv-skyrl first")
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when a goal is not met")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.peer_runs < 1 or args.warmups < 0 or args.peer_warmups < 0:
        ap.error("runs must be >= 1 and warm-ups >= 0")

    rlc_exe = find_rlc()
    if rlc_exe is None:
        print(
            "validate_bench: no `rlc` next to this Python nor on PATH; run `make venv` and use .venv/bin/python",
            file=sys.stderr,
        )
        return 2
    print(f"machine: {platform.system()} {platform.machine()}, nproc {nproc()}, Python {platform.python_version()}")
    print(f"rlc: {rlc_exe}")

    # The peer first: setting it up (when needed) is the slow part, and it is better to know early.
    peer_py, peer_reason = None, ""
    if args.skip_peer:
        peer_reason = "--skip-peer given"
    elif args.no_peer_setup:
        reason = _probe(peer_python()) if peer_python().exists() else f"{PEER_VENV.relative_to(ROOT)} does not exist"
        if reason is None:
            peer_py = peer_python()
        else:
            peer_reason = f"{reason} (and --no-peer-setup was given)"
    else:
        peer_py, note = setup_peer(args.reinstall_peer)
        print(f"peer: {note}" if peer_py else f"peer: SKIPPED: {note}", flush=True)
        peer_reason = "" if peer_py else note

    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="rlc-bench-") as tmp:
        broken = write_broken(Path(tmp))
        cases, rlc_info = rlc_cases(rlc_exe, broken, args.warmups, args.runs)
        home = Path(tmp) / "peer-home"
        if peer_py is not None:
            cases += peer_cases(peer_py, home, args.peer_warmups, args.peer_runs)
            print(
                f"timing, interleaved: rlc validate {args.warmups} warm-up + {args.runs} runs per config, "
                f"SkyRL peer {args.peer_warmups} warm-up + {args.peer_runs} runs per config ...",
                flush=True,
            )
        else:
            print(f"timing rlc validate: {args.warmups} warm-up + {args.runs} runs per config ...", flush=True)
        failure = run_interleaved(cases)
        rlc = rlc_results(cases, rlc_info)
        peer = peer_results(cases, peer_py, home) if peer_py is not None else None
        if peer_py is not None and peer is None:
            peer_reason = failure or "the SkyRL peer did not run"

    load_after = loadavg()
    print()
    print_table(rlc, peer, peer_reason)
    print(f"load average (1, 5, 15 min): {load_before} before, {load_after} after")
    if not args.no_write:
        write_section("validate-bench", results_section(rlc, peer, peer_reason, args, (load_before, load_after)))
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 1 if args.check and not goals_met(rlc, peer) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"validate_bench: {exc}", file=sys.stderr)
        sys.exit(2)
