"""Launch targets: each turns the compiled job into the files that start it somewhere, and says how `rlc launch`
starts it (rlc.compiler.targets.base.Target).

TARGETS is every target: the one list that emit (which files to write), the CLI (`--target` of compile and launch),
`rlc launch` (which command runs) and `rlc explain launch.target` read. A new target is a module here and one entry
below (and its name in rlc.spec.launch.LAUNCH_TARGETS, which a test holds equal to these names).
"""

from __future__ import annotations

from rlc.compiler.targets.base import Target
from rlc.compiler.targets.kuberay import KubeRay
from rlc.compiler.targets.local import Local
from rlc.compiler.targets.ray import RayJob
from rlc.compiler.targets.skypilot import SkyPilot
from rlc.compiler.targets.slurm import Slurm

TARGETS: tuple[Target, ...] = (SkyPilot(), RayJob(), KubeRay(), Local(), Slurm())


def target(name: str) -> Target:
    """The target named `name` (a value of launch.target)."""
    return next(t for t in TARGETS if t.name == name)
