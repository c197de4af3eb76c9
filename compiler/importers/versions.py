"""Spec versions and the ordered migrations between them.

A document without `version` is a legacy SkyRL config. Each migration is a named, pure step on the
round-trip document that returns what it changed; `upgrade` runs the steps a document needs, in order.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import field
from typing import Any

from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, WARNING, Diagnostic, Location
from rlc.core.overrides import Override, apply_overrides
from rlc.spec.model import default_model
from rlc.spec.root import CURRENT_VERSION
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

LEGACY = 0  # the version number given to documents that have no `version` key


@dataclass(frozen=True)
class Migration:
    source: int
    target: int
    name: str
    step: Callable[[Any], list]  # edits the round-trip tree in place, returns its changes


def _from_legacy(data: Any) -> list:
    # deferred: SkyRL's legacy tables (skyrl.legacy and skyrl.history, the largest modules on `rlc validate`'s way)
    # are read only for a document or an override that has a legacy key, here and in _is_legacy_key
    from rlc.compiler.importers.skyrl import legacy

    return legacy.migrate(data)


MIGRATIONS: list[Migration] = [
    Migration(LEGACY, 1, "legacy SkyRL YAML -> spec v1", _from_legacy),
]


class VersionError(Exception):
    """The document names a version this rlc cannot read."""


def version_of(data: Any) -> int:
    if not isinstance(data, dict) or "version" not in data:
        return LEGACY
    v = data["version"]
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # 1.0 is the integer 1, as in the JSON Schema
    if isinstance(v, bool) or not isinstance(v, int):
        raise VersionError(f"version must be an integer, got {v!r}")
    if v < 1 or v > CURRENT_VERSION:
        raise VersionError(f"version {v} is not known to this rlc (it reads versions 1 to {CURRENT_VERSION})")
    return v


def plan(source: int) -> list[Migration]:
    steps, at = [], source
    while at != CURRENT_VERSION:
        step = next(m for m in MIGRATIONS if m.source == at)
        steps.append(step)
        at = step.target
    return steps


@dataclass
class MigrationReport:
    source: int
    changes: list = field(default_factory=list)  # legacy.Change items, in the order made
    steps: list[str] = field(default_factory=list)
    from_overrides: bool = False

    @property
    def errors(self) -> list:
        return [c for c in self.changes if c.severity == "error"]

    def lines(self) -> list[str]:
        """One line a change; a change that alters what runs says so at the start of its own line."""
        return [f"{'ALTERS WHAT RUNS: ' if c.severity == 'error' else ''}{c.describe()}" for c in self.changes]

    def diagnostics(self, doc) -> list:
        """What commands that read specs print: one warning pointing to `rlc migrate`, plus behaviour changes."""
        what = "legacy override keys" if self.from_overrides else "a legacy SkyRL config (no `version` key)"
        out = [
            Diagnostic(
                "RLC-W010",
                WARNING,
                f"{doc.name} uses {what}; migrated in memory ({len(self.changes)} change(s))",
                location=Location(doc.name, 0, 0),
                hint=f"run `rlc migrate {doc.name} --in-place` to update the file and see the report",
            )
        ]
        for c in self.changes:
            if c.severity in ("error", "warning"):
                error = c.severity == "error"
                where = Location(doc.name, c.line, 1 if c.line else 0, doc.line_text(c.line))
                out.append(
                    Diagnostic(
                        c.code or ("RLC-E020" if error else "RLC-W020"),
                        ERROR if error else WARNING,
                        f"migration: {c.describe()}",
                        key=c.old,
                        location=where,
                        hint="remove the key or rewrite the setting by hand, then run `rlc migrate`",
                    )
                )
        return out


def migrate_data(data: Any) -> MigrationReport | None:
    """Bring a round-trip tree to the current version in place; None when it is already current."""
    source = version_of(data)
    if source == CURRENT_VERSION:
        return None
    report = MigrationReport(source)
    for m in plan(source):
        report.steps.append(m.name)
        report.changes.extend(m.step(data))
    return report


def upgrade(doc, overrides: list) -> MigrationReport | None:
    """Apply overrides and migrate the document in memory; overrides may use legacy keys either way."""
    try:
        source = version_of(doc.data)
    except VersionError:
        apply_overrides(doc, overrides)
        return None  # the schema reports the bad version with its location
    if source != CURRENT_VERSION:
        # A `version=` override says what the result should be; the file's own shape decides the migration.
        version_ovs = [o for o in overrides if o.key == "version"]
        apply_overrides(doc, [o for o in overrides if o.key != "version"])
        try:
            report = migrate_data(doc.data)
        except VersionError:
            report = None  # a `version` key the overrides made invalid: the schema reports it
        if report is not None:
            _rekey_overrides(doc, report)
        apply_overrides(doc, version_ovs)
        return report
    legacy_ovs = [o for o in overrides if _is_legacy_key(o.key)]
    apply_overrides(doc, [o for o in overrides if o not in legacy_ovs])
    if not legacy_ovs:
        return None
    scratch = CommentedMap()
    for o in legacy_ovs:
        node = scratch
        for part in o.path[:-1]:
            node = node.setdefault(part, CommentedMap())
        node[o.path[-1]] = o.value
    report = MigrationReport(LEGACY, from_overrides=True)
    report.steps.append(MIGRATIONS[0].name)
    report.changes = [c for c in _from_legacy(scratch) if c.kind != "added"]
    scratch.pop("version", None)
    texts = " ".join(o.text for o in legacy_ovs)
    apply_overrides(doc, [Override(k, v, texts) for k, v in _leaves(scratch)])
    return report


def _is_legacy_key(key: str) -> bool:
    if default_model().lookup(key) is not None:
        return False  # a key spec v1 has (SkyRL 0.4 brought back some legacy names) means what v1 says
    top = key.split(".")[0]
    from rlc.compiler.importers.skyrl import legacy  # deferred: SkyRL's legacy tables, as in _from_legacy

    if key in legacy.MOVES or key in legacy.SPLITS or legacy.legacy_target(key):
        return True
    dropped = any(key == d or key.startswith(d + ".") for d, _, _ in legacy.DROPS)
    return dropped or top in ("megatron_config", "deepspeed_config")


def _leaves(node, prefix: str = ""):
    for k, v in node.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            yield from _leaves(v, path)
        else:
            yield path, v


def _rekey_overrides(doc, report: MigrationReport) -> None:
    """Overrides written with legacy keys are reported at their new paths."""
    moved = {
        tuple(c.old.split(".")): c.new for c in report.changes if c.kind in ("moved", "transformed") and c.old and c.new
    }
    for path, text in list(doc.overrides.items()):
        if path in moved:
            doc.overrides[tuple(moved[path].split("."))] = text


def _indentation(text: str) -> tuple[int, int]:
    """(mapping indent, block-sequence dash offset) as the file writes them."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    keys = [len(ln) - len(ln.lstrip()) for ln in lines if re.match(r"^\s+[^\s-][^:]*:(\s|$)", ln)]
    indent = min(keys) if keys else 2
    offset = 0
    for prev, ln in zip(lines, lines[1:]):
        if ln.lstrip().startswith("- ") and prev.rstrip().endswith(":"):
            offset = max(0, (len(ln) - len(ln.lstrip())) - (len(prev) - len(prev.lstrip())))
            break
    return indent, offset


def _dumper(text: str):
    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long lines the user wrote
    indent, offset = _indentation(text)
    y.indent(mapping=indent, sequence=offset + 2, offset=offset)
    y.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    return y


def migrated_text(doc) -> str:
    buf = io.StringIO()
    _dumper(doc.text).dump(doc.data, buf)
    return buf.getvalue()
