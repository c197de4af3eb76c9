"""`rlc migrate` (`--from skyrl`, the default): SkyRL's legacy YAML brought to the current spec version in place,
by the migrations of rlc.compiler.importers.versions."""

from __future__ import annotations

from rlc.compiler.importers.base import Imported, NotImportable
from rlc.compiler.importers.versions import VersionError, migrate_data, migrated_text
from rlc.compiler.load import Document


class SkyRL:
    """SkyRL's legacy YAML (a file without `version`) brought to the current version, comments and layout kept."""

    name = "skyrl"
    what = "legacy SkyRL config"
    rewrites = True  # the file is edited as it stands: --in-place, --check and --diff apply

    def convert(self, doc: Document) -> Imported | None:
        try:
            report = migrate_data(doc.data)
        except VersionError as exc:
            raise NotImportable(str(exc)) from None
        if report is None:
            return None
        return Imported(
            migrated_text(doc),
            " then ".join(report.steps),
            report.changes,
            [f"  {line}" for line in report.lines()],
            f"{len(report.errors)} change(s) alter what runs; review them before launching",
        )
