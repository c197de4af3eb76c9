#!/usr/bin/env python3
"""Benchmark: the placement planner alone, on 1, 16, 128 and 1024 nodes of 8 GPUs.

    python bench/plan_bench.py              # measure, print a table, update bench/RESULTS.md
    python bench/plan_bench.py --no-write   # measure and print only

For each size and each of two layouts (colocate_all with policy, ref, critic and TP=2 engines; and
separate groups: policy+ref whole-node bundles of 4, a critic of 2 per node, TP=2 engines on the rest) a
spec is generated and resolved once with `analyze`. Then `plan()` alone is timed in-process: the median
of --runs calls after one warm-up, the garbage collector off during each call (as timeit does).
`Plan.to_json()` is timed the same way but reported apart, and `analyze` of the same spec (median of 3) is the
peer: it shows what planning adds to a compile.

Goals printed with the results: plan() under 1 s at 1024 nodes, and time growing about linearly with
GPUs (the fastest call's time per GPU at 1024 nodes within 2x of that at 16 nodes; the fastest call, because
the median of sub-millisecond calls moves with whatever else the machine runs). The results go to bench/RESULTS.md
between this benchmark's own markers; other sections are left alone.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from results import RESULTS, write_section  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1, 16, 128, 1024)
PER_NODE = 8
GOAL_SECONDS = 1.0
GOAL_LINEAR = 2.0  # the most the time per GPU may grow from 16 to 1024 nodes


def spec_text(layout: str, nodes: int) -> str:
    """A valid spec of `nodes` x 8 GPUs; batch sizes scale with the nodes so the batch rules hold."""
    if layout == "colocate_all":
        placement = "{colocate_all: true}"
    else:
        placement = (
            f"{{colocate_all: false, policy_num_nodes: {nodes}, policy_num_gpus_per_node: 4, "
            f"critic_num_nodes: {nodes}, critic_num_gpus_per_node: 2}}"
        )
    return textwrap.dedent(f"""\
        version: 1
        name: plan-bench
        cluster: {{accelerator: H100, gpus_per_node: {PER_NODE}, num_nodes: {nodes}}}
        trainer:
          placement: {placement}
          critic: {{model: {{path: Qwen/Qwen2.5-0.5B}}}}
          algorithm: {{advantage_estimator: gae, use_kl_loss: true}}
          logger: console
          train_batch_size: {64 * nodes}
          policy_mini_batch_size: {16 * nodes}
          critic_mini_batch_size: {16 * nodes}
          eval_batch_size: 64
        generator:
          n_samples_per_prompt: 8
          inference_engine: {{tensor_parallel_size: 2}}
        """)


def _times(fn, runs: int) -> list[float]:
    fn()
    times = []
    for _ in range(runs):
        # As timeit does: a collection that happens to fall inside one call says more about the heap than the call.
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        finally:
            gc.enable()
    return times


def measure(layout: str, nodes: int, runs: int, workdir: Path) -> dict:
    from rlc.compiler.pipeline import analyze
    from rlc.compiler.plan import plan

    path = workdir / f"{layout}-{nodes}.yaml"
    path.write_text(spec_text(layout, nodes), encoding="utf-8")
    analysis = analyze(path)
    analyze_s = statistics.median(_times(lambda: analyze(path), 3))
    errors = [d.code for d in analysis.diagnostics if d.is_error]
    if errors:
        raise SystemExit(f"plan_bench: the generated {layout} spec for {nodes} nodes has errors: {errors}")
    spec = analysis.spec
    layout_plan, diags = plan(spec)
    if diags or not layout_plan.fits:
        raise SystemExit(f"plan_bench: the {layout} plan for {nodes} nodes does not fit: {[d.message for d in diags]}")
    return {
        "layout": layout,
        "nodes": nodes,
        "gpus": nodes * PER_NODE,
        "groups": len(layout_plan.placement_groups),
        "engines": len(layout_plan.engines),
        "plan_s": statistics.median(plan_times := _times(lambda: plan(spec), runs)),
        "plan_min_s": min(plan_times),
        "json_s": statistics.median(_times(layout_plan.to_json, runs)),
        "analyze_s": analyze_s,
    }


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def report(rows: list[dict], runs: int) -> tuple[list[str], list[str]]:
    """The table lines and the verdict lines."""
    table = [
        "| layout | nodes x GPUs | groups / engines | plan() median | plan() min | min per GPU | growth of min vs previous size "
        "| to_json() median | analyze (peer) median | plan / analyze |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    verdicts = []
    for layout in dict.fromkeys(r["layout"] for r in rows):
        mine = [r for r in rows if r["layout"] == layout]
        prev = None
        for r in mine:
            growth = (
                f"{r['plan_min_s'] / prev['plan_min_s']:.1f}x for {r['gpus'] // prev['gpus']}x GPUs" if prev else "-"
            )
            table.append(
                f"| {layout} | {r['nodes']} x {PER_NODE} | {r['groups']} / {r['engines']} | {_fmt(r['plan_s'])} "
                f"| {_fmt(r['plan_min_s'])} | {_fmt(r['plan_min_s'] / r['gpus'])} | {growth} | {_fmt(r['json_s'])} | {_fmt(r['analyze_s'])} "
                f"| {r['plan_s'] / r['analyze_s']:.2f} |"
            )
            prev = r
        by = {r["nodes"]: r for r in mine}
        big, mid = by[max(by)], by[16]
        linear = (big["plan_min_s"] / big["gpus"]) / (mid["plan_min_s"] / mid["gpus"])
        ok_time, ok_linear = big["plan_s"] <= GOAL_SECONDS, linear <= GOAL_LINEAR
        verdicts.append(
            f"- {layout}: plan() at {big['nodes']} nodes {_fmt(big['plan_s'])}, goal under {GOAL_SECONDS:g} s: "
            f"**{'met' if ok_time else 'not met'}**; fastest time per GPU at {big['nodes']} nodes is {linear:.2f}x that at "
            f"16 nodes (goal at most {GOAL_LINEAR:g}x, about linear): **{'met' if ok_linear else 'not met'}**."
        )
    return table, verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed calls per size (median reported); default 15")
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(layout, n, args.runs, Path(tmp)) for layout in ("colocate_all", "separate") for n in SIZES]
    load_after = os.getloadavg()
    table, verdicts = report(rows, args.runs)
    print("\n".join(table))
    print()
    print("\n".join(verdicts))
    if args.no_write:
        return 0
    from importlib.metadata import version

    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = lambda la: " ".join(f"{x:.2f}" for x in la)  # noqa: E731
    section = "\n".join(
        [
            "## rlc placement planner (`plan()` alone)",
            "",
            f"Measured {when} with `python bench/plan_bench.py` on {platform.system()} {platform.machine()}, nproc {os.cpu_count()}, "
            f"rlc {version('rlc')}, Python {platform.python_version()}; load average (1, 5, 15 min) {load(load_before)} before "
            f"and {load(load_after)} after.",
            "",
            *table,
            "",
            *verdicts,
            "",
            f"What was timed: `rlc.compiler.plan.plan(spec)` in-process on a spec resolved once beforehand with `analyze` (not "
            f"timed), median and fastest of {args.runs} calls after one warm-up, with the garbage collector off during each call as `timeit` "
            "does; `to_json()` of the same plan apart. Layouts: colocate_all "
            "(one per-GPU group shared by policy, ref, critic and TP=2 engines) and separate (policy+ref whole-node bundles of 4 "
            "GPUs, critic bundles of 2, an inference group of TP=2 engines on the rest). The peer is `analyze` (load, validate, "
            "resolve, check; median of 3 after a warm-up) of the same generated spec, to show what planning adds to a compile.",
        ]
    )
    write_section("plan-bench", section)
    print(f"\nupdated {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
