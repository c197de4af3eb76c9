"""Local: no files of its own; `rlc launch` trains the job here, on this machine's rlc runtime (what `rlc run` does)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlc.compiler.targets.base import Launch, TargetInput


class Local:
    name = "local"
    summary = "no files of its own: `rlc launch` trains the job here on a local Ray instance, as `rlc run` does"

    def files(self, job: TargetInput) -> dict[str, str]:
        return {}

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        return Launch([sys.executable, "-m", "rlc.runtime", "run", str(out_dir / "resolved.yaml")])
