"""verl's example scripts (tests/fixtures/verl), extracted as verl's repository holds them."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verl"


def extract(release: str, root: Path) -> None:
    """A release's example scripts under `root`, with the reward function files they name in verl's repository
    where they look for them ($REPO_ROOT/verl/utils/reward_score/...)."""
    with tarfile.open(FIXTURES / f"verl-examples-{release}.tar.xz") as tar:
        # The fixture is the repository's own; the 'data' filter where the Python has it (not Debian 12's 3.11.2).
        tar.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    scores = root / "verl" / "utils" / "reward_score"
    scores.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "reward_score" / "rlla.py", scores / "rlla.py")
