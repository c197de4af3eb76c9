"""The runtime's one way in: resolved.yaml and the plan.json beside it, loaded as a typed `CompiledJob`.

The runtime reads only what the compiler decided (the resolved spec, the plan and its runtime decisions); it
re-derives nothing. Loading checks that the two files belong together (the same content hash), that the plan
reads back as itself, and that its world sizes are the config's.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlc.core.dataclass import dataclass
from rlc.core.digest import content_hash
from rlc.core.job import Decisions, JobFormatError
from rlc.core.plan import Plan, PlanFormatError
from rlc.spec.model import default_model
from rlc.spec.root import RlcSpec
from ruamel.yaml import YAML

__all__ = ["CompiledJob", "CompiledJobError", "load"]


@dataclass(frozen=True)
class CompiledJob:
    """What the runtime trains from: the resolved spec, its plan and the compiler's decisions, read back together."""

    spec: RlcSpec  # resolved: every derived value explicit
    plan: Plan
    decisions: Decisions
    content_hash: str
    directory: Path


class CompiledJobError(Exception):
    """resolved.yaml or plan.json is missing, changed by hand, or from another compile."""


def _header_hash(text: str) -> str:
    for line in text.splitlines()[:5]:
        if line.startswith("# content-hash: "):
            return line.split(": ", 1)[1].strip()
    raise CompiledJobError("resolved.yaml has no content-hash header; compile the spec with `rlc compile`")


def load(resolved_path: str | Path) -> CompiledJob:
    path = Path(resolved_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CompiledJobError(f"cannot read {path}: {exc.strerror or exc}") from None
    data = YAML(typ="safe", pure=True).load(text)
    if not isinstance(data, dict) or data.get("version") != 1:
        raise CompiledJobError(f"{path} is not a resolved rlc config (version 1)")
    spec = default_model().to_typed(data)
    declared, actual = _header_hash(text), content_hash(spec)
    if declared != actual:
        raise CompiledJobError(
            f"{path} was edited after compiling (hash {actual} != header {declared}); recompile the spec"
        )
    plan_path = path.with_name("plan.json")
    try:
        raw = json.loads(plan_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CompiledJobError(f"cannot read the plan {plan_path}: {exc}") from None
    if not isinstance(raw, dict) or raw.get("content_hash") != actual:
        found = raw.get("content_hash") if isinstance(raw, dict) else None
        raise CompiledJobError(f"{plan_path} belongs to another compile (hash {found} != {actual})")
    try:
        plan = Plan.from_json(raw)
        decisions = Decisions.from_json(raw.get("runtime"))
    except (PlanFormatError, JobFormatError) as exc:
        raise CompiledJobError(f"{plan_path}: {exc}; recompile the spec") from None
    _check_plan(spec, plan, decisions)
    return CompiledJob(spec, plan, decisions, actual, path.parent)


def _check_plan(spec, plan: Plan, decisions: Decisions) -> None:
    if not plan.fits:
        raise CompiledJobError("the plan does not fit its cluster")
    p = spec.trainer.placement
    for role in plan.roles:
        want = getattr(p, f"{role.name}_num_nodes") * getattr(p, f"{role.name}_num_gpus_per_node")
        if role.world_size != want:
            raise CompiledJobError(f"plan.json places {role.world_size} {role.name} ranks, the config asks for {want}")
        if role.name not in decisions.workers:
            raise CompiledJobError(f"plan.json has no worker settings for the {role.name} role; recompile the spec")
    ie = spec.generator.inference_engine
    if ie.run_engines_locally and len(plan.engines) != ie.num_engines:
        raise CompiledJobError(f"plan.json has {len(plan.engines)} engines, the config asks for {ie.num_engines}")
