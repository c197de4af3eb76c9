#!/usr/bin/env python3
"""Benchmark: `rlc fit` against `rlc plan` on the examples, whole processes and in-process.

    python bench/fit_bench.py              # measure, print a table, update bench/RESULTS.md
    python bench/fit_bench.py --no-write   # measure and print only

For each example (and one that does not fit: the 1-node GSM8K example with a 32B policy) `rlc fit SPEC` and
`rlc plan SPEC --svg /dev/null` run --runs times each, in turn (fit, plan, fit, plan, ...), and the median wall
time of each, the median CPU time (user + system) of the process, and the median of the pairwise ratios fit / plan
are reported. In-process, `fit()` is timed against `compile_job()` (the pipeline every command runs) the same way.
Goal printed with the results: `rlc fit` answers in under a second for every example. On a shared machine the wall
time is mostly the other jobs' (the load is printed): the CPU time is what the command itself costs.

The commands run as an installed rlc runs on a user's machine: with Python's bytecode cache (the warm-up run writes
it where PYTHONDONTWRITEBYTECODE, set in some sandboxes, would have every run compile rlc's modules again, about
0.15 s of CPU).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results import cpu_model, find_rlc, loadavg, nproc, publish  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
GOAL_SECONDS = 1.0
CASES = [
    ("gsm8k-grpo-8xh100 (fits)", "examples/gsm8k-grpo-8xh100.yaml", ()),
    ("gsm8k-grpo-2node (fits)", "examples/gsm8k-grpo-2node.yaml", ()),
    ("gsm8k-grpo-megatron-8xh100 (fits)", "examples/gsm8k-grpo-megatron-8xh100.yaml", ()),
    ("local-cpu (CPU)", "examples/local-cpu.yaml", ()),
    (
        "gsm8k-grpo-8xh100 + 32B (does not fit)",
        "examples/gsm8k-grpo-8xh100.yaml",
        ("trainer.policy.model.path=Qwen/Qwen2.5-32B-Instruct",),
    ),
]


ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
CPU_SECONDS: dict[str, list[float]] = {}  # each command's CPU time (user + system), by its first two words


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str]) -> float:
    """Wall seconds of one run of argv; its CPU seconds go to CPU_SECONDS."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
    wall = time.perf_counter() - start
    CPU_SECONDS.setdefault(" ".join(argv[1:3]), []).append(_children_cpu() - cpu)
    return wall


def paired(a, b, runs: int) -> tuple[float, float, float]:
    """Median of a's times, of b's, and of the pairwise ratios a/b (a and b alternate, after one warm-up each)."""
    a(), b()
    CPU_SECONDS.clear()  # the warm-ups' CPU (the bytecode cache written) is not a run's
    ta, tb = [], []
    for _ in range(runs):
        ta.append(a())
        tb.append(b())
    return statistics.median(ta), statistics.median(tb), statistics.median(x / y for x, y in zip(ta, tb))


def in_process(spec: str, overrides: tuple[str, ...]):
    from rlc.compiler.fit import fit
    from rlc.compiler.pipeline import compile_job
    from rlc.core.overrides import parse_override

    ovs = [parse_override(o) for o in overrides]

    def run_fit() -> float:
        start = time.perf_counter()
        fit(str(ROOT / spec), ovs)
        return time.perf_counter() - start

    def run_compile() -> float:
        start = time.perf_counter()
        compile_job(str(ROOT / spec), ovs)
        return time.perf_counter() - start

    return run_fit, run_compile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rlc = find_rlc()
    if rlc is None:
        print("fit_bench: no `rlc` next to this Python or on PATH", file=sys.stderr)
        return 2
    rows, start_load, started = [], loadavg(), _dt.datetime.now(_dt.timezone.utc)
    for label, spec, overrides in CASES:
        fit_cmd = [rlc, "fit", spec, *overrides]
        plan_cmd = [rlc, "plan", spec, *overrides, "--svg", "/dev/null"]
        wf, wp, wr = paired(lambda c=fit_cmd: timed(c), lambda c=plan_cmd: timed(c), args.runs)
        cf, cp = (statistics.median(CPU_SECONDS[" ".join(c[1:3])]) for c in (fit_cmd, plan_cmd))
        f, c = in_process(spec, overrides)
        pf, pc, pr = paired(f, c, args.runs)
        rows.append((label, wf, cf, wp, cp, wr, pf, pc, pr))
    met = all(r[1] < GOAL_SECONDS for r in rows)
    cpu_met = all(r[2] < GOAL_SECONDS for r in rows)
    lines = [
        "## `rlc fit` against `rlc plan` (bench/fit_bench.py)",
        "",
        f"Measured {started:%Y-%m-%d %H:%M} UTC on {cpu_model()} ({nproc()} cores, load "
        f"{start_load} at the start and {loadavg()} at the end), median of {args.runs} runs each, fit and its peer in "
        "turn; the ratio is the median of the pairwise wall-time ratios. CPU: user + system seconds of the process.",
        "",
        "| example | `rlc fit` wall | CPU | `rlc plan` wall | CPU | **fit / plan** | `fit()` in-process | "
        "`compile_job()` | **fit / compile** |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, wf, cf, wp, cp, wr, pf, pc, pr in rows:
        lines.append(
            f"| {label} | {wf * 1000:.0f} ms | {cf * 1000:.0f} ms | {wp * 1000:.0f} ms | {cp * 1000:.0f} ms | "
            f"**{wr:.2f}x** | {pf * 1000:.1f} ms | {pc * 1000:.1f} ms | **{pr:.2f}x** |"
        )
    lines += [
        "",
        f"- Goal `rlc fit` under {GOAL_SECONDS:.0f} s for every example, whole process: wall "
        f"**{'met' if met else 'not met'}** (slowest {max(r[1] for r in rows) * 1000:.0f} ms), CPU "
        f"**{'met' if cpu_met else 'not met'}** (most {max(r[2] for r in rows) * 1000:.0f} ms).",
    ]
    publish("fit_bench", "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
