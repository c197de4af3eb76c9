"""Emit: the compiled job written to a directory (resolved.yaml and plan.json, train.sh for a trainer other than
rlc's; launch targets add theirs).

Files are written whole to a temporary name and renamed into place, so a reader never sees half a file;
the same input gives the same bytes (no timestamps, no absolute paths of the compiling machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlc.compiler.emit_resolved import render
from rlc.compiler.pipeline import CompileResult
from rlc.compiler.provenance import trace
from rlc.compiler.targets.base import Target, TargetInput
from rlc.compiler.trainers import TRAIN_SCRIPT, train_script
from rlc.core.dataclass import dataclass
from rlc.core.digest import content_hash

RESOLVED, PLAN = "resolved.yaml", "plan.json"


@dataclass
class Compiled:
    """The "what" of a job: every artifact as text, by relative path, and what the targets rendered from."""

    name: str
    files: dict[str, str]
    digest: str
    job: TargetInput


def build(result: CompileResult, targets: Sequence[Target], out_dir: str) -> Compiled:
    """The compiled job as text: resolved.yaml, plan.json (with the runtime decisions) and the `targets`' files."""
    analysis, plan, decisions = result.analysis, result.plan, result.decisions
    spec, resolution = analysis.spec, analysis.resolution
    assert spec is not None and resolution is not None and plan is not None and decisions is not None, "not compiled"
    spec = with_reward_source(spec)
    digest = content_hash(spec)
    label = Path(result.source).name  # not the compiling machine's path: the bytes must not depend on it
    resolved = render(spec, trace(resolution, analysis.doc, analysis.migration, label), label)
    plan_json = {**plan.to_json(), "content_hash": digest, "runtime": decisions.to_json()}
    files = {RESOLVED: resolved, PLAN: json.dumps(plan_json, indent=2, sort_keys=False) + "\n"}
    script = train_script(spec, plan_json, label, digest)
    if script is not None:  # a trainer other than rlc's: the command every target runs on the head
        files[TRAIN_SCRIPT] = script
    job = TargetInput(spec, plan_json, dict(files), label, digest, out_dir)
    for target in targets:
        files.update(target.files(job))
    return Compiled(spec.name, files, digest, job)


def with_reward_source(spec: Any) -> Any:
    """The spec with the user's reward file's text in environment.skyrl_gym.reward_function.source: every target
    carries resolved.yaml to the nodes, so the file travels with the job (RLC-E905 has checked it reads)."""
    env = spec.environment
    rf = env.skyrl_gym.reward_function
    if env.env_class != "reward_function" or not rf.path or rf.source is not None or "${" in rf.path:
        return spec
    text = Path(rf.path).expanduser().read_text(encoding="utf-8")
    gym = dataclasses.replace(env.skyrl_gym, reward_function=dataclasses.replace(rf, source=text))
    return dataclasses.replace(spec, environment=dataclasses.replace(env, skyrl_gym=gym))


def write(compiled: Compiled, out_dir: Path) -> list[Path]:
    written = []
    for rel, text in sorted(compiled.files.items()):
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o755 if rel.endswith(".sh") else 0o644)
        os.replace(tmp, path)
        written.append(path)
    return written
