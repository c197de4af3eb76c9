"""The head node's gate: wait until every node and the plan's GPU (or CPU-slot) total have joined Ray."""

from __future__ import annotations

import sys
import time

from rlc.core.plan import Plan


def wait_cluster(
    address: str,
    nodes: int,
    devices: int,
    kind: str,
    timeout_s: float,
    poll_s: float = 2.0,
    expect_ips: list[str] | None = None,
) -> int:
    import ray  # deferred: Ray, not needed to parse `python -m rlc.runtime`'s arguments (it imports this module)

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            have = sum(n.get("Resources", {}).get(kind, 0) for n in alive)
            if len(alive) >= nodes and have >= devices:
                print(f"rlc: {len(alive)} node(s) with {have:g} {kind} joined the Ray cluster", file=sys.stderr)
                return 0
            if time.monotonic() > deadline:
                ips = sorted(n.get("NodeManagerAddress", "?") for n in alive)
                absent = [ip.strip() for ip in expect_ips or [] if ip.strip() and ip.strip() not in ips]
                named = f" ({', '.join(absent)})" if absent else ""
                print(
                    f"rlc: after {timeout_s:g} s the Ray cluster at {address} has {len(alive)} of {nodes} node(s) "
                    f"and {have:g} of {devices} {kind}; joined: {', '.join(ips) or 'none'}. "
                    f"Missing {max(nodes - len(alive), len(absent))} node(s){named}: check that every node ran its "
                    "`ray start`.",
                    file=sys.stderr,
                )
                return 1
            time.sleep(poll_s)
    finally:
        ray.shutdown()


def device_shortfall(plan: Plan, nodes: list[dict]) -> str | None:
    """What the Ray cluster lacks for the plan, per node, or None when it fits.

    `nodes` is `ray.nodes()`. The plan places `gpus_per_node` GPUs (CPU slots on a CPU run) on each of
    `nodes` nodes; a node with fewer cannot hold its bundles, and Ray would wait for them forever.
    """
    kind = plan.device
    want_nodes, per_node = plan.nodes, plan.gpus_per_node
    alive = [n for n in nodes if n.get("Alive")]
    have = sorted(
        ((n.get("Resources", {}).get(kind, 0), n.get("NodeManagerAddress", "?")) for n in alive), reverse=True
    )
    enough = [h for h in have if h[0] >= per_node]
    if len(enough) >= want_nodes:
        return None
    unit = "GPUs" if kind == "GPU" else "CPUs"
    seen = ", ".join(f"{addr}: {count:g} {unit}" for count, addr in have) or "no live node"
    return (
        f"the plan needs {want_nodes} node(s) with {per_node} {unit} each, but Ray has {len(enough)} such node(s) "
        f"({seen}); start the job on a cluster that matches cluster.gpus_per_node and cluster.num_nodes, "
        "or change them"
    )
