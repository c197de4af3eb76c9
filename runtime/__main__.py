"""`python -m rlc.runtime check|run RESOLVED.yaml`: what the launch artifacts execute on the cluster."""

from __future__ import annotations

import argparse
import sys

from rlc.runtime.cluster_gate import wait_cluster
from rlc.runtime.config import CompiledJobError, load
from rlc.runtime.stopping import exec_holding_sigterm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlc.runtime", description="Run a job compiled by `rlc compile`.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="load resolved.yaml and plan.json with the runtime's typed loader and exit")
    check.add_argument("resolved")
    run = sub.add_parser("run", help="train: place workers and engines as plan.json says and run the RL loop")
    run.add_argument("resolved")
    run.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else a local Ray instance)")
    run.add_argument("--no-progress", action="store_true", help="print a line per step instead of a progress bar")
    gate = sub.add_parser("wait-cluster", help="wait until all nodes and devices of the plan joined Ray (head node)")
    gate.add_argument("--address", required=True)
    gate.add_argument("--nodes", type=int, required=True)
    gate.add_argument("--devices", type=int, required=True)
    gate.add_argument("--kind", choices=("GPU", "CPU"), default="GPU")
    gate.add_argument("--timeout", type=float, default=600)
    gate.add_argument(
        "--expect-ips", default="", help="comma-separated node addresses, to name the ones that never joined"
    )
    hold = sub.add_parser(
        "hold-sigterm",
        help="run a command with SIGTERM blocked for it and what it starts (`ray start` on a node: docs/faults.md)",
    )
    hold.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND ...")
    args = parser.parse_args(argv)
    if args.command == "hold-sigterm":
        if not args.argv:
            parser.error("hold-sigterm needs a command")
        exec_holding_sigterm(args.argv)
    if args.command == "wait-cluster":
        return wait_cluster(
            args.address,
            args.nodes,
            args.devices,
            args.kind,
            args.timeout,
            expect_ips=[ip for ip in args.expect_ips.split(",") if ip.strip()],
        )

    try:
        job = load(args.resolved)
    except CompiledJobError as exc:
        print(f"rlc.runtime: {exc}", file=sys.stderr)
        return 1
    if args.command == "run":
        return run_job(job, args.address, progress=not args.no_progress)
    roles = ", ".join(f"{r.name} x{r.world_size}" for r in job.plan.roles)
    print(
        f"{job.spec.name}: config and plan load ({job.content_hash[:19]}); {roles}; {len(job.plan.engines)} engine(s) "
        f"on {job.plan.nodes} node(s)"
    )
    return 0


def run_job(job, address: str | None = None, progress: bool = True) -> int:
    """Run a loaded job; a RunError or a bad dataset is a message and exit 1, never a traceback."""
    # deferred: torch, Ray and transformers, not needed to parse arguments or wait for the cluster
    from rlc.runtime.checkpoint import resume_hint
    from rlc.runtime.driver import RunError, run
    from rlc.runtime.stopping import Stopped

    try:
        result = run(job, address=address, progress=progress)
    except RunError as exc:
        print(f"rlc.runtime: {exc}", file=sys.stderr)
        return 1
    except Stopped as stop:  # SIGTERM or SIGINT: the last finished step saved (docs/faults.md)
        settings = job.decisions.checkpoints
        after = f" after step {stop.step}" if stop.step is not None else ""
        kept = " (trainer.ckpt_interval -1: no checkpoint is kept)" if settings.ckpt_interval <= 0 else ""
        print(f"rlc.runtime: stopped by {stop}{after}{kept}; {resume_hint(settings)}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # before the run's own handlers are in place
        print(f"rlc.runtime: interrupted; {resume_hint(job.decisions.checkpoints)}", file=sys.stderr)
        return 130
    summary = f"{job.spec.name}: trained to step {result.steps}"
    if result.first_reward is not None and result.closing_reward is not None:
        last = len(result.recent_rewards)
        over = f"the last {last} steps" if last > 1 else "the last step"
        summary += f", mean reward {result.first_reward:.3f} at step {result.first_step} -> {result.closing_reward:.3f} over {over}"
    print(f"{summary}\nrun directory: {result.run_dir} (metrics.jsonl; `rlc plot {result.run_dir}`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
