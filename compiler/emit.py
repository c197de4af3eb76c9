"""Emit: the compiled job written to a directory (resolved.yaml and plan.json; launch targets add theirs).

Files are written whole to a temporary name and renamed into place, so a reader never sees half a file;
the same input gives the same bytes (no timestamps, no absolute paths of the compiling machine).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlc.compiler.emit_resolved import render
from rlc.compiler.provenance import trace
from rlc.core.digest import content_hash

RESOLVED, PLAN = "resolved.yaml", "plan.json"


@dataclass
class Compiled:
    """The "what" of a job: every artifact as text, by relative path."""

    name: str
    files: dict[str, str]
    digest: str


TARGETS = ("skypilot", "ray", "kuberay", "slurm")


def build(analysis, plan, source: str, wanted: tuple[str, ...] = TARGETS) -> Compiled:
    spec = analysis.spec
    digest = content_hash(spec)
    label = Path(source).name  # not the compiling machine's path: the bytes must not depend on it
    resolved = render(spec, trace(analysis.resolution, analysis.doc, analysis.migration, label), label)
    from rlc.compiler.decide import decide

    plan_json = {**plan.to_json(), "content_hash": digest, "runtime": decide(spec, plan).to_json()}
    files = {RESOLVED: resolved, PLAN: json.dumps(plan_json, indent=2, sort_keys=False) + "\n"}
    from rlc.compiler import targets

    if "skypilot" in wanted:
        files["sky.yaml"] = targets.skypilot(spec, plan_json, dict(files), label, digest, f"build/{spec.name}/sky.yaml")
    if "ray" in wanted:
        files.update(targets.ray_job(spec, digest, label))
    if "kuberay" in wanted:
        files["kuberay/rayjob.yaml"] = targets.kuberay(spec, plan_json, dict(files), label, digest)
    if "slurm" in wanted:  # interim hook until the target registry lands
        from rlc.compiler.targets.base import TargetInput
        from rlc.compiler.targets.slurm import Slurm

        job = TargetInput(spec, plan_json, dict(files), label, digest, f"build/{spec.name}")
        files.update(Slurm().files(job))
    return Compiled(spec.name, files, digest)


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
