"""What the spec asks of each role, read from the typed spec: which models run (ref, critic), the GPUs an inference
engine takes, and the job's GPU demand; plus the dotted-key access every stage uses.

Resolve, the rules, the planner and the memory model all ask these questions; they live here so that none of those
stages imports another for them.
"""

from __future__ import annotations

from typing import Any

from rlc.core.dataclass import dataclass

ROLES = ("policy", "ref", "critic")
ENGINES = "generator.inference_engine.num_engines"
# The keys that size the placement: a spec that sets none of them has its placement derived from `cluster` alone.
PLACEMENT_COUNTS = (
    *(f"trainer.placement.{r}_{dim}" for r in ROLES for dim in ("num_nodes", "num_gpus_per_node")),
    ENGINES,
)


def get(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def put(obj: Any, path: str, value: Any) -> None:
    *head, last = path.split(".")
    for part in head:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def ref_on(spec) -> bool:
    alg = spec.trainer.algorithm
    return bool(alg.use_kl_loss or alg.use_kl_in_reward)


def critic_on(spec) -> bool:
    return spec.trainer.critic.model.path is not None


def strategy_of(spec, role: str) -> str:
    """The backend that trains `role` as the spec spells it (fsdp, fsdp2 or megatron): trainer.strategy, or for the
    critic trainer.critic.strategy where it is set."""
    t = spec.trainer
    return (t.critic.strategy if role == "critic" else None) or t.strategy


def on_megatron(spec, role: str) -> bool:
    return strategy_of(spec, role) == "megatron"


# What trainer_checkpoint reads beyond the roles' model paths and strategies (a rule that calls it declares it).
BF16_BASE = "trainer.policy.model.fake_int4_qat.bf16_base_path"


def trainer_checkpoint(spec, role: str) -> Any:
    """The checkpoint `role`'s trainer loads: the megatron policy's and ref's fake_int4_qat.bf16_base_path where set
    (SkyRL's Megatron worker loads it, QAT on or off, while model.path names the INT4 checkpoint the engines
    serve), else the role's model path (the ref's and critic's falling back to the policy's)."""
    t = spec.trainer
    base = t.policy.model.fake_int4_qat.bf16_base_path
    if base and role != "critic" and on_megatron(spec, role):
        return base
    return getattr(t, role).model.path or t.policy.model.path


def fsdp_roles(spec) -> list[str]:
    """The roles the job runs that train with the fsdp2 worker."""
    on = ["policy", *(["ref"] if ref_on(spec) else []), *(["critic"] if critic_on(spec) else [])]
    return [r for r in on if not on_megatron(spec, r)]


def engine_gpus(ie) -> int:
    """GPUs one inference engine takes (expert parallelism reuses them)."""
    return count(ie.tensor_parallel_size) * count(ie.pipeline_parallel_size) * count(ie.data_parallel_size)


def count(v: Any, default: int = 1) -> int:
    """An integer setting, or `default` where it is not an int yet (a reference resolved on the node, a bad value)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else default


@dataclass(frozen=True)
class Demand:
    """One term of the job's GPU demand: a role or the engines, its GPUs, and the keys multiplied to get them."""

    role: str
    gpus: int
    factors: tuple[tuple[str, int], ...]  # (dotted key, value)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.factors)

    def formula(self) -> str:
        """e.g. `trainer.placement.policy_num_nodes 2 x policy_num_gpus_per_node 8` (factors of 1 beyond the first
        are left out: they change nothing)."""
        shown = [f for i, f in enumerate(self.factors) if i == 0 or f[1] != 1]
        section = shown[0][0].rsplit(".", 1)[0]
        return " x ".join(f"{k if i == 0 else k.removeprefix(section + '.')} {v}" for i, (k, v) in enumerate(shown))


def demand_terms(spec) -> tuple[list[Demand], bool]:
    """The terms of `gpu_demand`, and whether they share GPUs (colocate_all: the demand is their largest, not
    their sum). A ref that shares the policy's bundles is no term outside colocate_all."""
    p, ie = spec.trainer.placement, spec.generator.inference_engine
    pl, eng = "trainer.placement", "generator.inference_engine"

    def role(name: str) -> Demand:
        n, g = count(getattr(p, f"{name}_num_nodes")), count(getattr(p, f"{name}_num_gpus_per_node"))
        return Demand(name, n * g, ((f"{pl}.{name}_num_nodes", n), (f"{pl}.{name}_num_gpus_per_node", g)))

    terms = [role("policy")]
    if ie.run_engines_locally:
        names = ("num_engines", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        factors = tuple((f"{eng}.{k}", count(getattr(ie, k))) for k in names)
        terms.append(Demand("inference engines", count(ie.num_engines) * engine_gpus(ie), factors))
    if critic_on(spec):
        terms.append(role("critic"))
    if ref_on(spec) and (p.colocate_all or not p.colocate_policy_ref):
        terms.append(role("ref"))
    return terms, bool(p.colocate_all)


def gpu_demand(spec) -> int:
    """GPUs the job asks of the cluster: under colocate_all the largest of the roles and the engines (they share GPUs),
    otherwise their sum (a ref that shares the policy's bundles adds none)."""
    terms, shared = demand_terms(spec)
    gpus = [t.gpus for t in terms]
    return max(gpus) if shared else sum(gpus)


def colocated_counts(spec, per_node: int, nodes: int) -> dict[str, int]:
    """The placement counts that put every role and engine on all `nodes` x `per_node` GPUs (colocate_all); the
    engines' count is left out where an engine's size does not divide them, or the engines run elsewhere."""
    roles = ["policy", *(["ref"] if ref_on(spec) else []), *(["critic"] if critic_on(spec) else [])]
    out = {}
    for role in roles:
        out[f"trainer.placement.{role}_num_nodes"] = nodes
        out[f"trainer.placement.{role}_num_gpus_per_node"] = per_node
    ie = spec.generator.inference_engine
    size = engine_gpus(ie)
    if ie.run_engines_locally and per_node * nodes % size == 0:
        out["generator.inference_engine.num_engines"] = per_node * nodes // size
    return out
