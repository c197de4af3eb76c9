"""Whole-process wall time of `rlc compile` on the 2-node example (goal: at most 0.25 s on 2 cores).

Run with the Python of an environment where rlc is installed (`make bench` uses a plain install). Each run
writes every artifact (resolved.yaml, plan.json, sky.yaml, ray/, kuberay/) into a fresh directory; the
median of 15 runs after 2 warm-ups is reported and written to this benchmark's section of RESULTS.md.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import find_rlc, loadavg, write_section  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "gsm8k-grpo-2node.yaml"
GOAL_S = 0.25


def rlc() -> str:
    return find_rlc() or sys.exit("rlc is not installed")


def main() -> int:
    exe, times = rlc(), []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(17):
            out = Path(tmp) / f"run{i}"
            start = time.perf_counter()
            proc = subprocess.run([exe, "compile", str(SPEC), "-o", str(out)], capture_output=True, text=True)
            elapsed = time.perf_counter() - start
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            if i >= 2:
                times.append(elapsed)
        files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    median = statistics.median(times)
    verdict = "met" if median <= GOAL_S else "NOT met"
    line = (
        f"`rlc compile examples/gsm8k-grpo-2node.yaml` (whole process, writes {', '.join(files)}): median "
        f"{median * 1000:.0f} ms of 15 runs (min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}); "
        f"goal at most {GOAL_S * 1000:.0f} ms: **{verdict}**."
    )
    print(line)
    write_section(
        "compile-bench",
        "\n".join(
            [
                "## rlc compile",
                "",
                line,
                "",
                f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}; "
                f"load average {loadavg()}. Run: `make bench`.",
            ]
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
