"""`python -m rlc.runtime check|run RESOLVED.yaml`: what the launch artifacts execute on the cluster."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlc.runtime", description="Run a job compiled by `rlc compile`.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="load resolved.yaml and plan.json with the runtime's typed loader and exit")
    check.add_argument("resolved")
    args = parser.parse_args(argv)

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
