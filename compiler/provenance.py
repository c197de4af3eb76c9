"""Where each value of the resolved config came from: spec (file:line), default, derived, migrated, override."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from rlc.compiler.resolve import Resolution
from rlc.core.dataclass import dataclass


@dataclass(frozen=True)
class Provenance:
    kind: str  # spec | default | derived | migrated | override
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.detail}".strip()


def leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every field of a dataclass tree; mappings and lists are leaves."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from leaves(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)
    else:
        yield path, obj


def trace(resolution: Resolution, doc, migration=None, label: str | None = None) -> dict[str, Provenance]:
    """Provenance of every leaf of the resolved spec; `label` names the spec file (default: as it was given)."""
    migrated: dict[str, Any] = {}
    if migration is not None:
        for c in migration.changes:
            if c.new and c.kind in ("moved", "transformed"):
                migrated.setdefault(c.new, c)
    out: dict[str, Provenance] = {}
    for path, _ in leaves(resolution.spec):
        out[path] = _origin(path, resolution, doc, migrated, label or (doc.name if doc is not None else ""))
    return out


def _origin(path: str, resolution: Resolution, doc, migrated: dict, label: str) -> Provenance:
    parts = tuple(path.split("."))
    for n in range(len(parts), 0, -1):
        text = doc.overrides.get(parts[:n]) if doc is not None else None
        if text is not None:
            return Provenance("override", text)
    derived = _derived_from(path, resolution)
    if derived is not None:
        return Provenance("derived", "from " + ", ".join(derived))
    change = migrated.get(path)
    if change is not None:
        where = f" ({label}:{change.line})" if change.line else ""
        return Provenance("migrated", f"from {change.old}{where}")
    if _written(path, resolution):
        loc = doc.locate(parts) if doc is not None else None
        if loc is not None and loc.file != doc.name:
            return Provenance("spec", loc.file)
        return Provenance("spec", f"{label}:{loc.line}" if loc and loc.line else label)
    return Provenance("default")


def _derived_from(path: str, resolution: Resolution) -> list[str] | None:
    for p, sources in resolution.derived.items():
        if path == p or path.startswith(p + "."):
            return sources
    return None


def _written(path: str, resolution: Resolution) -> bool:
    return path in resolution.explicit
