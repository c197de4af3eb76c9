"""Paths as a job names them: `~` and `$VARIABLES` expanded, as a shell would (no package beyond the standard
library, so every module may read a path with it)."""

from __future__ import annotations

import os
from pathlib import Path


def expand(path: str) -> Path:
    return Path(os.path.expandvars(os.path.expanduser(path)))
