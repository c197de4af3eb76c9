"""Local: no files of its own; `rlc launch` trains the job here, on this machine's rlc runtime (what `rlc run` does)."""

from __future__ import annotations

import sys
from pathlib import Path

from rlc.compiler.targets.base import Launch, TargetInput
from rlc.compiler.trainers import TRAIN_SCRIPT


class Local:
    name = "local"
    summary = "no files of its own: `rlc launch` trains the job here on a local Ray instance, as `rlc run` does"

    def files(self, job: TargetInput) -> dict[str, str]:
        return {}

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        if TRAIN_SCRIPT in job.files:  # another trainer: its command, which starts a Ray instance of its own
            return Launch(["bash", str(out_dir / TRAIN_SCRIPT)], needs="bash")
        return Launch([sys.executable, "-m", "rlc.runtime", "run", str(out_dir / "resolved.yaml")])
