"""The runtime's typed view of a compiled job: resolved.yaml and the plan.json beside it.

The runtime reads only what the compiler decided; it re-derives nothing. Loading checks that the two files
belong together (the same content hash) and that the plan's world sizes are the config's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CompiledJobError(Exception):
    """resolved.yaml or plan.json is missing, changed by hand, or from another compile."""


@dataclass
class CompiledJob:
    spec: Any  # rlc.spec.root.RlcSpec
    plan: dict
    content_hash: str
    directory: Path


def _header_hash(text: str) -> str:
    for line in text.splitlines()[:5]:
        if line.startswith("# content-hash: "):
            return line.split(": ", 1)[1].strip()
    raise CompiledJobError("resolved.yaml has no content-hash header; compile the spec with `rlc compile`")


def load(resolved_path: str | Path) -> CompiledJob:
    from rlc.compiler.emit_resolved import content_hash
    from rlc.spec.model import default_model
    from ruamel.yaml import YAML

    path = Path(resolved_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CompiledJobError(f"cannot read {path}: {exc.strerror or exc}") from None
    data = YAML(typ="safe", pure=True).load(text)
    if not isinstance(data, dict) or data.get("version") != 1:
        raise CompiledJobError(f"{path} is not a resolved rlc config (version 1)")
    model = default_model()
    spec = model.to_typed(data)
    declared, actual = _header_hash(text), content_hash(spec)
    if declared != actual:
        raise CompiledJobError(f"{path} was edited after compiling (hash {actual} != header {declared}); recompile the spec")
    plan_path = path.with_name("plan.json")
    try:
        plan = json.loads(plan_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CompiledJobError(f"cannot read the plan {plan_path}: {exc}") from None
    if plan.get("content_hash") != actual:
        raise CompiledJobError(f"{plan_path} belongs to another compile (hash {plan.get('content_hash')} != {actual})")
    _check_plan(spec, plan)
    return CompiledJob(spec, plan, actual, path.parent)


def _check_plan(spec: Any, plan: dict) -> None:
    if plan.get("format") != "rlc-plan" or plan.get("version") != 1:
        raise CompiledJobError("plan.json is not an rlc plan of version 1")
    if not plan.get("fits"):
        raise CompiledJobError("the plan does not fit its cluster")
    p = spec.trainer.placement
    for role in plan.get("roles", []):
        want = getattr(p, f"{role['name']}_num_nodes") * getattr(p, f"{role['name']}_num_gpus_per_node")
        if role["world_size"] != want or len(role["ranks"]) != want:
            raise CompiledJobError(f"plan.json places {role['world_size']} {role['name']} ranks, the config asks for {want}")
    engines = plan.get("inference", {}).get("engines", [])
    ie = spec.generator.inference_engine
    if ie.run_engines_locally and len(engines) != ie.num_engines:
        raise CompiledJobError(f"plan.json has {len(engines)} engines, the config asks for {ie.num_engines}")
