"""The placement plan as data: which role rank and which inference engine runs on which node and GPU, and the
Ray placement groups that hold them. `rlc.compiler.plan` builds it; plan.json is `Plan.to_json()`; the runtime
reads it back with `Plan.from_json()` (the two round-trip: same plan, same JSON).

`Plan.to_json()` gives (keys in this order, same spec -> same value):
  format "rlc-plan", version 1, name,
  cluster {nodes, gpus_per_node, accelerator, device "GPU"|"CPU"}, fits, nodes_needed,
  placement_groups [{name, strategy "PACK", bundle {GPU, CPU} (each bundle's resources), num_bundles,
                     bundles [{index, node, gpus [..]}]}],
  roles [{name policy|ref|critic, world_size, placement_group (null: none), num_gpus, num_cpus (per rank
          actor), ranks [{rank, node, gpu, bundle}]}],
  inference {local, backend, placement_group, server_actor {num_gpus, num_cpus}, worker {num_gpus, num_cpus},
             engines [{index, tp, pp, dp, ep, bundles [..], gpus [[node, gpu]..], nodes [..], spans_nodes,
                       tp_spans_nodes}],
             remote_engines [{index, url, kind server|proxy}]}.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from rlc.core.dataclass import dataclass

FORMAT = "rlc-plan"
FORMAT_VERSION = 1
ROLE_LETTERS = {"policy": "P", "ref": "R", "critic": "C"}

# Per-actor shares of a bundle's GPU (and CPU), as SkyRL's placement hands them out: colocated actors take a
# fifth of a GPU each; a policy and a ref sharing whole-node bundles take three quarters and a quarter.
COLOCATED_SHARE = 0.2
SHARED_POLICY_SHARE, SHARED_REF_SHARE = 0.75, 0.25
SERVER_ACTOR_CPUS = 0.2

Block = list  # the (node, gpu) pairs of one bundle or engine, in order


class PlanFormatError(ValueError):
    """plan.json is not a plan this version of rlc reads."""


@dataclass(frozen=True)
class Resources:
    """What one Ray actor asks for."""

    num_gpus: float
    num_cpus: float


@dataclass
class Bundle:
    node: int
    gpus: list[int]


@dataclass
class PlacementGroup:
    name: str
    shape: dict  # resources of every bundle
    bundles: list[Bundle]
    strategy: str = "PACK"


@dataclass
class Role:
    name: str
    placement_group: str | None
    share: float  # of a GPU (and as many CPUs) per rank actor
    ranks: list[tuple[int, int, int | None]]  # (node, gpu, bundle) of each rank

    @property
    def world_size(self) -> int:
        return len(self.ranks)


@dataclass
class Engine:
    index: int
    tp: int
    pp: int
    dp: int
    ep: int
    bundles: range
    gpus: Block
    tp_spans_nodes: bool

    @property
    def nodes(self) -> list[int]:
        return sorted({n for n, _ in self.gpus})

    @property
    def workers(self) -> int:
        """GPU worker processes of the engine (tp x pp), each a member of the weight-update group."""
        return self.tp * self.pp


@dataclass
class RemoteEngine:
    index: int
    url: str
    kind: str  # server | proxy


@dataclass
class Plan:
    name: str
    nodes: int
    gpus_per_node: int
    accelerator: str
    nodes_needed: int
    backend: str
    worker_share: float = 1.0
    engine_group: str | None = None
    placement_groups: list[PlacementGroup] = field(default_factory=list)
    roles: list[Role] = field(default_factory=list)
    engines: list[Engine] = field(default_factory=list)
    remote_engines: list[RemoteEngine] = field(default_factory=list)

    @property
    def device(self) -> str:
        return "CPU" if self.accelerator == "none" else "GPU"

    @property
    def fits(self) -> bool:
        return self.nodes_needed <= self.nodes

    def role(self, name: str) -> Role:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    def group(self, name: str) -> PlacementGroup:
        for pg in self.placement_groups:
            if pg.name == name:
                return pg
        raise KeyError(name)

    def share(self, amount: float) -> Resources:
        """An actor's request for `amount` of a bundle: GPU share and as many CPUs, or CPUs alone on a CPU cluster."""
        amount = _num(amount)
        return Resources(0, amount) if self.device == "CPU" else Resources(amount, amount)

    @property
    def engine_worker(self) -> Resources:
        """An engine actor that runs its one model worker itself (or one GPU worker of a larger engine)."""
        amount = _num(self.worker_share)
        return Resources(0, amount) if self.device == "CPU" else Resources(amount, 0)

    @property
    def engine_server(self) -> Resources:
        """An engine actor that only drives GPU workers of its own (tp x pp > 1)."""
        return Resources(0, SERVER_ACTOR_CPUS)

    def cells(self) -> dict[tuple[int, int], list[str]]:
        """The labels on each (node, gpu): P3 = policy rank 3, R/C = ref/critic, E2.1 = engine 2 worker 1."""
        out: dict[tuple[int, int], list[str]] = {}
        for role in self.roles:
            letter = ROLE_LETTERS[role.name]
            for r, (n, g, _) in enumerate(role.ranks):
                out.setdefault((n, g), []).append(f"{letter}{r}")
        for e in self.engines:
            for j, ng in enumerate(e.gpus):
                out.setdefault(ng, []).append(f"E{e.index}.{j}")
        return out

    def to_json(self) -> dict:
        def res(r: Resources) -> dict:
            return {"num_gpus": r.num_gpus, "num_cpus": r.num_cpus}

        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "name": self.name,
            "cluster": {
                "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node,
                "accelerator": self.accelerator,
                "device": self.device,
            },
            "fits": self.fits,
            "nodes_needed": self.nodes_needed,
            "placement_groups": [
                {
                    "name": pg.name,
                    "strategy": pg.strategy,
                    "bundle": pg.shape,
                    "num_bundles": len(pg.bundles),
                    "bundles": [{"index": i, "node": b.node, "gpus": b.gpus} for i, b in enumerate(pg.bundles)],
                }
                for pg in self.placement_groups
            ],
            "roles": [
                {
                    "name": r.name,
                    "world_size": len(r.ranks),
                    "placement_group": r.placement_group,
                    **res(self.share(r.share)),
                    "ranks": [{"rank": i, "node": n, "gpu": g, "bundle": b} for i, (n, g, b) in enumerate(r.ranks)],
                }
                for r in self.roles
            ],
            "inference": {
                "local": bool(self.engines),
                "backend": self.backend,
                "placement_group": self.engine_group,
                "server_actor": res(self.engine_server),
                "worker": res(self.engine_worker),
                "engines": [
                    {
                        "index": e.index,
                        "tp": e.tp,
                        "pp": e.pp,
                        "dp": e.dp,
                        "ep": e.ep,
                        "bundles": list(e.bundles),
                        "gpus": [[n, g] for n, g in e.gpus],
                        "nodes": e.nodes,
                        "spans_nodes": len(e.nodes) > 1,
                        "tp_spans_nodes": e.tp_spans_nodes,
                    }
                    for e in self.engines
                ],
                "remote_engines": [{"index": r.index, "url": r.url, "kind": r.kind} for r in self.remote_engines],
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> Plan:
        """The plan that `to_json()` wrote; PlanFormatError when `data` is not one."""
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
            raise PlanFormatError(f"not an rlc plan of version {FORMAT_VERSION}")
        try:
            c, inf = data["cluster"], data["inference"]
            roles = [
                Role(
                    r["name"],
                    r["placement_group"],
                    _share_of(r, c["device"]),
                    [(k["node"], k["gpu"], k["bundle"]) for k in r["ranks"]],
                )
                for r in data["roles"]
            ]
            worker = inf["worker"]
            plan = cls(
                name=data["name"],
                nodes=c["nodes"],
                gpus_per_node=c["gpus_per_node"],
                accelerator=c["accelerator"],
                nodes_needed=data["nodes_needed"],
                backend=inf["backend"],
                worker_share=worker["num_cpus"] if c["device"] == "CPU" else worker["num_gpus"],
                engine_group=inf["placement_group"],
                placement_groups=[
                    PlacementGroup(
                        pg["name"],
                        dict(pg["bundle"]),
                        [Bundle(b["node"], list(b["gpus"])) for b in pg["bundles"]],
                        pg["strategy"],
                    )
                    for pg in data["placement_groups"]
                ],
                roles=roles,
                engines=[
                    Engine(
                        e["index"],
                        e["tp"],
                        e["pp"],
                        e["dp"],
                        e["ep"],
                        _range(e["bundles"]),
                        [(n, g) for n, g in e["gpus"]],
                        e["tp_spans_nodes"],
                    )
                    for e in inf["engines"]
                ],
                remote_engines=[RemoteEngine(r["index"], r["url"], r["kind"]) for r in inf["remote_engines"]],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanFormatError(f"plan.json is malformed ({type(exc).__name__}: {exc})") from None
        if plan.to_json() != {k: v for k, v in data.items() if k not in ("content_hash", "runtime")}:
            raise PlanFormatError("plan.json does not read back as the plan it describes (edited by hand?)")
        return plan


def _share_of(role: dict, device: str) -> float:
    return role["num_cpus"] if device == "CPU" else role["num_gpus"]


def _range(bundles: list[int]) -> range:
    if not bundles:
        return range(0)
    if bundles != list(range(bundles[0], bundles[-1] + 1)):
        raise ValueError(f"engine bundles {bundles} are not consecutive")
    return range(bundles[0], bundles[-1] + 1)


def _num(x: float):
    return int(x) if float(x).is_integer() else x
