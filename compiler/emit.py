"""Emit: the compiled job written to a directory (resolved.yaml and plan.json, train.sh for a trainer other than
rlc's; launch targets add theirs).

Files are written whole to a temporary name and renamed into place, so a reader never sees half a file;
the same input gives the same bytes (no timestamps, no absolute paths of the compiling machine).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

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
