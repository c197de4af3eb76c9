"""`python -m rlc.runtime check|run RESOLVED.yaml`: what the launch artifacts execute on the cluster."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlc.runtime", description="Run a job compiled by `rlc compile`.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="load resolved.yaml and plan.json with the runtime's typed loader and exit")
    check.add_argument("resolved")
    gate = sub.add_parser("wait-cluster", help="wait until all nodes and devices of the plan joined Ray (head node)")
    gate.add_argument("--address", required=True)
    gate.add_argument("--nodes", type=int, required=True)
    gate.add_argument("--devices", type=int, required=True)
    gate.add_argument("--kind", choices=("GPU", "CPU"), default="GPU")
    gate.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    if args.command == "wait-cluster":
        from rlc.runtime.cluster_gate import wait_cluster

        return wait_cluster(args.address, args.nodes, args.devices, args.kind, args.timeout)

    from rlc.runtime.config import CompiledJobError, load

    try:
        job = load(args.resolved)
    except CompiledJobError as exc:
        print(f"rlc.runtime: {exc}", file=sys.stderr)
        return 1
    roles = ", ".join(f"{r['name']} x{r['world_size']}" for r in job.plan.get("roles", []))
    engines = len(job.plan.get("inference", {}).get("engines", []))
    print(f"{job.spec.name}: config and plan load ({job.content_hash[:19]}); {roles}; {engines} engine(s) on "
          f"{job.plan['cluster']['nodes']} node(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
