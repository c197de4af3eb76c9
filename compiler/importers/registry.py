"""IMPORTERS: every importer of a foreign config format, the list `rlc migrate --from` offers.

SkyRL's legacy YAML (its whole history, also migrated in memory by every command that reads a spec without
`version`, through rlc.compiler.importers.versions alone), AReaL's experiment configs and verl's jobs (launch
overrides, Hydra run directories, verl YAML), each from its format's folder. The list is a module of its own, not the
package's __init__, so that importing one format's modules (as every command may the legacy SkyRL tables) does not
import them all.
"""

from __future__ import annotations

from rlc.compiler.importers.areal.importer import AReaL
from rlc.compiler.importers.base import Importer
from rlc.compiler.importers.skyrl.importer import SkyRL
from rlc.compiler.importers.verl.importer import Verl

IMPORTERS: tuple[Importer, ...] = (SkyRL(), AReaL(), Verl())


def importer(name: str) -> Importer:
    return next(i for i in IMPORTERS if i.name == name)
