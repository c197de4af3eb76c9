"""Plan: from the resolved spec to where every role and inference engine runs, as SkyRL places them.

The plan is what the runtime creates, not a guess at what Ray will do: each placement group below, with each
bundle on the node and GPUs named here, and each actor pinned to its bundle. A node is a logical index
0..N-1 in node-major order (the order SkyRL's ResolvedPlacementGroup sorts bundles into); a gpu is a device
index on that node, or a CPU slot when cluster.accelerator is none.

Layout rules. Every node fills from GPU 0 up and blocks are placed first fit, node-major:
- an engine of tp*pp*dp GPUs that fits a node sits inside one node (the rest of a node too small for it is
  skipped, never straddled); a larger engine starts on an empty node and takes the next nodes whole;
- colocate_all: one PACK group of per-GPU bundles, the engines' GPUs in engine order; rank r of every
  model sits on bundle r, engine i on bundles i*E..(i+1)*E-1 (E = tp*pp*dp);
- otherwise: the engines get their own per-GPU group; policy and ref share whole-node bundles when
  colocate_policy_ref and a ref is used; each other model gets whole-node bundles, or no group when it has
  1 GPU per node (Ray schedules those actors; node/gpu is where the plan counts them). Larger blocks are
  placed first (first fit decreasing), ties in the order policy, ref, critic, engines.
Blocks that do not fit go on extra nodes past the last (nodes_needed > nodes, fits false), and plan() returns
an RLC-E210 error naming them; such a plan is only good for the message.

The plan's data types and its JSON form live in `rlc.core.plan`, which the runtime reads too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field

from rlc.compiler.roles import critic_on, engine_gpus, ref_on
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, Diagnostic, Location
from rlc.core.plan import (
    COLOCATED_SHARE,
    ROLE_LETTERS,
    SHARED_POLICY_SHARE,
    SHARED_REF_SHARE,
    Bundle,
    Engine,
    PlacementGroup,
    Plan,
    RemoteEngine,
    Role,
)

NOT_PLACED = "RLC-E210"
IE = "generator.inference_engine"

Block = list  # the (node, gpu) pairs of one bundle or engine, in order


class _Nodes:
    """GPUs taken per node. A node always fills from GPU 0 up, so what it has taken is a prefix."""

    def __init__(self, per_node: int):
        self.per_node = per_node
        self.used: list[int] = []

    def _grow(self, n: int) -> None:
        # Placing past the cluster's last node is allowed: how far it goes is what the diagnostic reports.
        if n >= len(self.used):
            self.used.extend([0] * (n + 1 - len(self.used)))

    def place(self, count: int, size: int) -> list[Block]:
        """`count` blocks of `size` GPUs, first fit node-major; linear because the scan never moves back."""
        per, out, n = self.per_node, [], 0
        for _ in range(count):
            if size <= per:
                self._grow(n)
                while self.used[n] + size > per:
                    n += 1
                    self._grow(n)
                first = self.used[n]
                self.used[n] = first + size
                out.append([(n, g) for g in range(first, first + size)])
                continue
            span, k = -(-size // per), 0
            while k < span:  # a run of `span` empty nodes, so the block starts on a node boundary
                self._grow(n + k)
                n, k = (n + k + 1, 0) if self.used[n + k] else (n, k + 1)
            block: list[tuple[int, int]] = []
            left = size
            for m in range(n, n + span):
                self.used[m] = min(per, left)
                block.extend((m, g) for g in range(self.used[m]))
                left -= self.used[m]
            out.append(block)
        return out

    def needed(self) -> int:
        return max((n + 1 for n, u in enumerate(self.used) if u), default=0)


@dataclass
class _Demand:
    """Blocks one group asks for, and what to call them when they do not fit."""

    what: str  # "engine", a role name, or "policy+ref"
    count: int
    size: int
    whole_node: bool  # whole-node bundles: each must sit on one node
    keys: list[str]
    blocks: list[Block] = field(default_factory=list)
    first: int = 0  # number of the first block in messages


def plan(spec, locate: Callable[[str], Location | None] = lambda key: None) -> tuple[Plan, list[Diagnostic]]:
    """The placement plan of a resolved spec, and an RLC-E210 error when it does not fit the cluster."""
    c, p, ie = spec.cluster, spec.trainer.placement, spec.generator.inference_engine
    per_node, nodes = int(c.gpus_per_node), int(c.num_nodes)
    cpu = c.accelerator == "none"
    device = {"CPU": 1} if cpu else {"GPU": 1, "CPU": 1}
    world = {r: getattr(p, f"{r}_num_nodes") * getattr(p, f"{r}_num_gpus_per_node") for r in ROLE_LETTERS}
    roles = ["policy"] + (["ref"] if ref_on(spec) else []) + (["critic"] if critic_on(spec) else [])
    size = engine_gpus(ie)
    engines = ie.num_engines if ie.run_engines_locally else 0
    engine_demand = _Demand("engine", engines, size, False, [f"{IE}.tensor_parallel_size", f"{IE}.num_engines"])
    alloc = _Nodes(per_node)
    out = Plan(spec.name, nodes, per_node, c.accelerator, 0, ie.backend)

    if p.colocate_all:
        extra = max([world[r] for r in roles] + [engines * size]) - engines * size
        extras = _Demand(
            "training", extra, 1, False, ["trainer.placement.policy_num_gpus_per_node"], first=engines * size
        )
        demands = [engine_demand, extras]
        for d in demands:
            d.blocks = alloc.place(d.count, d.size)
        pg = PlacementGroup("colocate", device, [Bundle(n, [g]) for d in demands for b in d.blocks for n, g in b])
        out.placement_groups.append(pg)
        out.roles = [Role(r, pg.name, COLOCATED_SHARE, _per_gpu_ranks(pg, world[r])) for r in roles]
        out.worker_share = COLOCATED_SHARE
    else:
        shared = "ref" in roles and p.colocate_policy_ref
        groups = [("policy+ref" if shared else "policy", ["policy", "ref"] if shared else ["policy"])]
        groups += [(r, [r]) for r in roles[1:] if not (r == "ref" and shared)]
        demands = []
        for what, members in groups:
            lead = members[0]
            gpn = getattr(p, f"{lead}_num_gpus_per_node")
            keys = [f"trainer.placement.{lead}_num_gpus_per_node", f"trainer.placement.{lead}_num_nodes"]
            whole = (shared and lead == "policy") or gpn > 1
            demands.append(
                _Demand(
                    what, getattr(p, f"{lead}_num_nodes") if whole else world[lead], gpn if whole else 1, whole, keys
                )
            )
        demands.append(engine_demand)
        order = {id(d): i for i, d in enumerate(demands)}
        for d in sorted(demands, key=lambda d: (-d.size, order[id(d)])):
            d.blocks = alloc.place(d.count, d.size)
        for (what, members), d in zip(groups, demands):
            out.roles += _group_roles(out, what, members, d, world, device)
        out.roles.sort(key=lambda r: list(ROLE_LETTERS).index(r.name))
        if engines:
            out.placement_groups.append(
                PlacementGroup("inference", device, [Bundle(n, [g]) for b in engine_demand.blocks for n, g in b])
            )
    if engines:
        out.engine_group = out.placement_groups[0].name if p.colocate_all else "inference"
        out.engines = [_engine(i, ie, size, b) for i, b in enumerate(engine_demand.blocks)]
    else:
        urls = list(ie.remote_urls) + list(ie.external_server_urls or [])
        out.remote_engines = [RemoteEngine(i, u, "server") for i, u in enumerate(urls)]
        if ie.external_proxy_url:
            out.remote_engines.append(RemoteEngine(len(urls), ie.external_proxy_url, "proxy"))
    out.nodes_needed = alloc.needed()
    return out, _not_placed(out, demands, alloc, locate)


def _per_gpu_ranks(pg: PlacementGroup, world: int) -> list:
    return [(pg.bundles[r].node, pg.bundles[r].gpus[0], r) for r in range(world)]


def _group_roles(out: Plan, what: str, members: list[str], d: _Demand, world: dict, device: dict) -> list[Role]:
    if not d.whole_node:  # 1 GPU per node and no shared group: SkyRL makes no placement group
        return [Role(what, None, 1.0, [(n, g, None) for b in d.blocks for n, g in b])]
    shape = {k: d.size for k in device}
    pg = PlacementGroup(what.replace("+", "_"), shape, [Bundle(b[0][0], [g for _, g in b]) for b in d.blocks])
    out.placement_groups.append(pg)
    shares = {"policy": SHARED_POLICY_SHARE, "ref": SHARED_REF_SHARE} if len(members) > 1 else {members[0]: 1.0}
    total = len(pg.bundles) * d.size
    roles = []
    for m in members:
        ranks: list[tuple[int, int, int | None]] = []
        for r in range(world[m]):
            # Rank r sits on bundle r // g, as in SkyRL; the modulo only keeps a mis-sized ref (RLC-E202) in range.
            k = r % total // d.size
            ranks.append((pg.bundles[k].node, pg.bundles[k].gpus[r % d.size], k))
        roles.append(Role(m, pg.name, shares[m], ranks))
    return roles


def _engine(index: int, ie, size: int, block: Block) -> Engine:
    tp = ie.tensor_parallel_size
    # vLLM numbers workers pp-stage-major, tp innermost: each run of tp workers is one tensor-parallel group.
    spans = any(block[k][0] != block[k + tp - 1][0] for k in range(0, len(block), tp))
    return Engine(
        index,
        tp,
        ie.pipeline_parallel_size,
        ie.data_parallel_size,
        ie.expert_parallel_size,
        range(index * size, (index + 1) * size),
        block,
        spans,
    )


def _not_placed(out: Plan, demands: list[_Demand], alloc: _Nodes, locate) -> list[Diagnostic]:
    nodes, per = out.nodes, out.gpus_per_node
    unit = "CPU slots" if out.device == "CPU" else "GPUs"
    parts, keys, hints, missing = [], [], [], 0
    for d in demands:
        too_big = d.whole_node and d.size > per
        outside = [d.first + i for i, b in enumerate(d.blocks) if too_big or b[-1][0] >= nodes]
        if not outside:
            continue
        keys += [k for k in d.keys if k not in keys]
        missing += sum(1 for b in d.blocks for n, _ in b if n >= nodes)
        many = len(outside) > 1
        span = f"{outside[0]}-{outside[-1]}" if many else f"{outside[0]}"
        if d.what == "engine":
            where = "must sit on one node" if d.size <= per else "must start on an empty node"
            parts.append(f"engine{'s' * many} {span} ({d.size} {unit}{' each' * many}, {where})")
            if d.size <= per and per % d.size:
                hints.append(
                    f"make tp*pp*dp ({d.size}) divide gpus_per_node ({per}): a node holds "
                    f"{per // d.size} such engine(s) and leaves {per % d.size} idle"
                )
        elif too_big:
            parts.append(f"{d.what} (whole-node bundles of {d.size} {unit}, more than a node's {per})")
            hints.append(f"give {d.what} at most {per} {unit} per node and more nodes")
        elif d.whole_node:
            parts.append(f"{d.what} bundle{'s' * many} {span} (whole-node bundles of {d.size} {unit})")
        else:
            parts.append(f"{d.what} rank{'s' * many} {span}")
    if not parts:
        return []
    message = (
        f"the placement does not fit the cluster of {nodes} x {per} {unit}: no room for {'; '.join(parts)}; "
        f"the layout needs {out.nodes_needed} node(s), {missing} {unit} more than the cluster has"
    )
    free = [(n, per - u) for n, u in enumerate(alloc.used[:nodes]) if u < per]
    if free:
        shown = ", ".join(f"node {n}: {f}" for n, f in free[:8]) + (", ..." if len(free) > 8 else "")
        message += f" ({sum(f for _, f in free)} {unit} stay free in pieces too small: {shown})"
    hint = ", or ".join(
        [f"raise cluster.num_nodes to {out.nodes_needed}"] * (out.nodes_needed > nodes)
        + hints
        + ["shrink the placement"]
    )
    return [
        Diagnostic(
            NOT_PLACED,
            ERROR,
            message,
            key="cluster.num_nodes",
            location=locate("cluster.num_nodes"),
            hint=hint,
            related=keys,
            values={"nodes_needed": out.nodes_needed, "missing": missing},
        )
    ]


def node_ranges(nodes: list[int]) -> str:
    """0-3,5,7-8: a sorted list of node indices, compressed."""
    runs: list[list[int]] = []
    for n in nodes:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
