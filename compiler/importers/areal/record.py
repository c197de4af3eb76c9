"""One AReaL file being imported: its values read with `${...}` references resolved, and the spec v1 keys written so
far, each with the AReaL keys it came from (rlc.compiler.importers.areal.importer runs the import)."""

from __future__ import annotations

import re
from typing import Any

from rlc.compiler.importers.base import Change, ImportResult, leaves

REF = re.compile(r"\$\{([^{}]+)\}")
MISSING = object()


class ArealImport:
    """The AReaL file (plain data), the AReaL keys read so far, and the spec keys written from them."""

    def __init__(self, data: dict, line_of):
        self.raw = data
        self.line_of = line_of
        self.used: set[str] = set()
        self.result = ImportResult({}, {})

    # -- reading the AReaL file, ${...} references resolved ----------------------------------

    def _raw(self, path: str) -> Any:
        node: Any = self.raw
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    def get(self, path: str, default: Any = None) -> Any:
        value = self._resolve(self._raw(path), [path])
        return default if value is MISSING or value is None else value

    def has(self, path: str) -> bool:
        return self._raw(path) not in (MISSING, None)

    def _resolve(self, value: Any, chain: list[str]) -> Any:
        if isinstance(value, dict):  # a reference in a value that cannot resolve (a cycle) reads as unset
            return {k: None if (r := self._resolve(v, chain)) is MISSING else r for k, v in value.items()}
        if not isinstance(value, str) or "${" not in value:
            return value
        whole = REF.fullmatch(value)
        if whole and ":" not in whole.group(1):
            ref = whole.group(1)
            return MISSING if ref in chain else self._resolve(self._raw(ref), chain + [ref])
        return REF.sub(lambda m: self._text(m.group(1), chain), value)

    def _text(self, ref: str, chain: list[str]) -> str:
        if ":" in ref or ref in chain:
            return "${" + ref + "}"
        target = self._resolve(self._raw(ref), chain + [ref])
        return "${" + ref + "}" if target is MISSING else str(target)

    # -- recording ------------------------------------------------------------------------------

    def put(self, new: str, value: Any, *old: str, reason: str = "", severity: str = "info") -> None:
        """Write spec key `new` from AReaL keys `old` (the first one is the one reported)."""
        self.result.spec[new] = value
        self.result.sources[new] = list(old)
        self.used.update(old)
        if not old:
            self.result.changes.append(Change("added", None, new, new_value=value, reason=reason, severity=severity))
            return
        first = old[0]
        if len(old) > 1:
            reason = f"{reason}; with {', '.join(old[1:])}" if reason else f"with {', '.join(old[1:])}"
        if self._raw(first) is MISSING:
            why = f"AReaL's default of {first}" + (f"; {reason}" if reason else "")
            self.result.changes.append(Change("added", None, new, new_value=value, reason=why, severity=severity))
            return
        before = self.get(first)
        kind = "moved" if not reason and before == value else "transformed"
        self.result.changes.append(Change(kind, first, new, self.line_of(first), before, value, reason, severity))

    def drop(self, old: str, reason: str, severity: str = "info") -> None:
        if self._raw(old) is MISSING:
            return
        for leaf, _ in leaves(self._raw(old), old):
            if leaf in self.used:
                continue
            self.used.add(leaf)
            self.result.changes.append(
                Change("dropped", leaf, None, self.line_of(leaf), reason=reason, severity=severity)
            )
