#!/usr/bin/env python3
"""Benchmark: `rlc fit` against `rlc plan` on the examples, whole processes and in-process.

    python bench/fit_bench.py              # measure, print a table, update bench/RESULTS.md
    python bench/fit_bench.py --no-write   # measure and print only

For each example (and one that does not fit: the 1-node GSM8K example with a 32B policy) `rlc fit SPEC` and
`rlc plan SPEC --svg /dev/null` run --runs times each, in turn (fit, plan, fit, plan, ...), and the median wall
time of each and the median of the pairwise ratios fit / plan are reported. In-process, `fit()` is timed against
`compile_job()` (the pipeline every command runs) the same way. Goal printed with the results: `rlc fit` answers
in under a second for every example.
"""

from __future__ import annotations

import argparse
import datetime as _dt
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


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def paired(a, b, runs: int) -> tuple[float, float, float]:
    """Median of a's times, of b's, and of the pairwise ratios a/b (a and b alternate, after one warm-up each)."""
    a(), b()
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
    rows = []
    for label, spec, overrides in CASES:
        fit_cmd = [rlc, "fit", spec, *overrides]
        plan_cmd = [rlc, "plan", spec, *overrides, "--svg", "/dev/null"]
        wf, wp, wr = paired(lambda c=fit_cmd: timed(c), lambda c=plan_cmd: timed(c), args.runs)
        f, c = in_process(spec, overrides)
        pf, pc, pr = paired(f, c, args.runs)
        rows.append((label, wf, wp, wr, pf, pc, pr))
    met = all(r[1] < GOAL_SECONDS for r in rows)
    lines = [
        "## `rlc fit` against `rlc plan` (bench/fit_bench.py)",
        "",
        f"Measured {_dt.date.today()} on {cpu_model()} ({nproc()} cores, load {loadavg()}), median of {args.runs} "
        "runs each, fit and its peer in turn; the ratio is the median of the pairwise ratios.",
        "",
        "| example | `rlc fit` wall | `rlc plan` wall | **fit / plan** | `fit()` in-process | `compile_job()` | **fit / compile** |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, wf, wp, wr, pf, pc, pr in rows:
        lines.append(
            f"| {label} | {wf * 1000:.0f} ms | {wp * 1000:.0f} ms | **{wr:.2f}x** | {pf * 1000:.1f} ms | "
            f"{pc * 1000:.1f} ms | **{pr:.2f}x** |"
        )
    lines += [
        "",
        f"- Goal `rlc fit` under {GOAL_SECONDS:.0f} s for every example, whole process: **{'met' if met else 'not met'}** "
        f"(slowest {max(r[1] for r in rows) * 1000:.0f} ms).",
    ]
    publish("fit_bench", "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
