#!/usr/bin/env python3
"""Benchmark: `rlc validate`'s whole process against the floor of its own imports, paired.

    python bench/startup_bench.py              # measure, print, update bench/RESULTS.md
    python bench/startup_bench.py --no-write   # measure and print only

A: `rlc validate examples/gsm8k-grpo-2node.yaml` (the `rlc` next to this Python). B, the floor: the same Python
running `import ruamel.yaml, click`, the two libraries every rlc command loads before it does anything. They run in
turn (A B A B ...) after --warmups of each, and each pair gives a ratio A/B of CPU time (user + system, the
operating system's own accounting of the finished child) and of wall time; the medians of the ratios are the result,
so that a machine whose speed drifts during the run moves both sides of a pair alike. Bytecode caches are allowed
(PYTHONDONTWRITEBYTECODE is dropped from the environment), as any installed rlc has them. Goal: A/B at most 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results import cpu_model, loadavg, nproc, publish, require_rlc  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
SPEC = "examples/gsm8k-grpo-2node.yaml"
GOAL = 2.0


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one whole process, its output thrown away."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"startup_bench: `{' '.join(argv)}` exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="pairs timed (default 20)")
    ap.add_argument("--warmups", type=int, default=2, help="untimed runs of each side first (default 2)")
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = ap.parse_args()
    rlc = require_rlc("startup_bench")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "RLC_DEBUG")}
    env["NO_COLOR"] = "1"
    a = [rlc, "validate", SPEC]
    b = [sys.executable, "-c", "import ruamel.yaml, click"]
    for _ in range(args.warmups):
        timed(a, env), timed(b, env)
    before = loadavg()
    pairs = [(timed(a, env), timed(b, env)) for _ in range(args.runs)]
    cpu_ratio = statistics.median(x[0] / y[0] for x, y in pairs)
    wall_ratio = statistics.median(x[1] / y[1] for x, y in pairs)

    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:.0f} ms"

    verdict = "met" if cpu_ratio <= GOAL else "NOT met"
    text = "\n".join(
        [
            "## Start-up: `rlc validate` against its imports' floor (bench/startup_bench.py)",
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {nproc()} cores ({cpu_model()}), "
            f"`{os.path.relpath(rlc, ROOT) if rlc.startswith(str(ROOT)) else rlc}`; load average {before} before, {loadavg()} after. {args.runs} pairs, A and B in turn, "
            "whole processes, bytecode caches allowed.",
            "",
            "| | CPU (user + system), median | wall, median |",
            "| --- | --- | --- |",
            f"| A: `rlc validate {SPEC}` | {ms([x[0] for x, _ in pairs])} | {ms([x[1] for x, _ in pairs])} |",
            f"| B: `python -c 'import ruamel.yaml, click'` | {ms([y[0] for _, y in pairs])} | "
            f"{ms([y[1] for _, y in pairs])} |",
            f"| A/B, median of the pairs' ratios | {cpu_ratio:.2f}x | {wall_ratio:.2f}x |",
            "",
            f"Goal: A/B at most {GOAL:.0f}x in CPU time: {verdict}.",
        ]
    )
    publish("startup-bench", text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
