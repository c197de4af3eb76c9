"""One verl job being imported: its composed config read key by key, and the spec v1 keys written from it, each
with the verl keys (and launch-script lines) it came from (rlc.compiler.importers.verl.importer runs the import)."""

from __future__ import annotations

from typing import Any

from rlc.compiler.importers.base import Change, ImportResult
from rlc.compiler.importers.verl.compose import Composed
from rlc.compiler.importers.verl.hydra_overrides import MISSING, lookup
from rlc.spec.model import default_model, to_plain

SETTINGS = "launch.trainer_settings.verl"


def rlc_default(path: str) -> Any:
    """The spec's default of a dotted key (MISSING when it has none, e.g. a derived count)."""
    spec = default_model().lookup(path)
    if spec is None or spec.section is not None:
        return MISSING
    return to_plain(spec.default())


class VerlImport:
    """The composed verl config, the verl keys read so far, and the spec keys written from them."""

    def __init__(self, composed: Composed):
        self.c = composed
        self.used: set[str] = set()
        self.result = ImportResult({}, {})
        # verl's own settings the spec has no place for, kept for verl's trainer (launch.trainer_settings.verl)
        self.settings: dict[str, Any] = {}

    def keep(self, key: str, value: Any) -> None:
        """Keep a verl setting for verl's trainer: it applies when launch.trainer is verl."""
        self.settings[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        value = lookup(self.c.config, key)
        return default if value is MISSING or value is None else value

    def has(self, key: str) -> bool:
        return lookup(self.c.config, key) is not MISSING

    def written(self, *keys: str) -> bool:
        return any(self.c.is_written(k) for k in keys)

    def read(self, *keys: str) -> None:
        """Mark keys (and every leaf under them) as read: what they say is carried by some other key."""
        for key in keys:
            self.used.add(key)
            self.used.update(k for k in self.c.written if k.startswith(key + "."))

    def keep_written(self, *keys: str) -> None:
        """Keep every written leaf under `keys` no section has read, for verl's trainer, and mark them read."""
        for key in keys:
            for k in sorted(self.c.written):
                if (k == key or k.startswith(key + ".")) and k not in self.used and self._leaf(k):
                    if lookup(self.c.config, k) is not MISSING:
                        self.keep(k, lookup(self.c.config, k))
            self.read(key)

    def _leaf(self, key: str) -> bool:
        return not any(k.startswith(key + ".") for k in self.c.written)

    def put(self, new: str, value: Any, *old: str, reason: str = "", severity: str = "info") -> None:
        """Write spec key `new` from verl keys `old`; verl's own defaults are reported where rlc's differ."""
        self.result.spec[new] = value
        old = tuple(dict.fromkeys(old))
        self.read(*old)
        shown = [f"{k} (line {self.c.line(k)})" if self.c.line(k) else k for k in old if self.c.is_written(k)]
        self.result.sources[new] = shown or [f"{k} (verl {self.c.release} default)" for k in old[:1]]
        if not old:
            self.result.changes.append(Change("added", None, new, new_value=value, reason=reason, severity=severity))
            return
        first = next((k for k in old if self.c.is_written(k)), None)
        if len(old) > 1:
            more = ", ".join(k for k in old if k != (first or old[0]))
            reason = f"{reason}; from {more}" if reason else f"from {more}"
        if first is None:
            if value == rlc_default(new) and severity == "info":
                return  # verl's default is rlc's: written into the spec, nothing to say
            why = f"verl {self.c.release}'s default of {old[0]}" + (f"; {reason}" if reason else "")
            self.result.changes.append(Change("added", None, new, new_value=value, reason=why, severity=severity))
            return
        before = self.get(first)
        kind = "moved" if not reason and before == value else "transformed"
        self.result.changes.append(Change(kind, first, new, self.c.line(first), before, value, reason, severity))

    def drop(self, old: str, reason: str, severity: str = "info", kept: bool = True) -> None:
        """Report a written verl key (or every written key under it) as not carried by the spec, with the reason;
        `kept`: its value is kept for verl's trainer (launch.trainer_settings.verl), as it is none of the spec's."""
        for key in sorted(k for k in self.c.written if k == old or k.startswith(old + ".")):
            if key in self.used or any(key.startswith(u + ".") for u in self.used if u in self.c.written):
                continue
            self.used.add(key)
            leaf = self._leaf(key)
            why = reason
            # "read as X": carried by the spec after all, not a setting of verl's own
            if (
                kept
                and leaf
                and not reason.startswith("read ")
                and not key.startswith("hydra.")
                and lookup(self.c.config, key) is not MISSING
            ):
                self.keep(key, lookup(self.c.config, key))
                why += f"; kept in {SETTINGS} (it applies when launch.trainer is verl)"
            self.result.changes.append(Change("dropped", key, None, self.c.line(key), reason=why, severity=severity))

    def problem(self, key: str, reason: str, severity: str = "error") -> None:
        """A finding on a verl key whatever was written (a default of verl's that rlc cannot run as verl does)."""
        self.used.add(key)
        self.result.changes.append(Change("dropped", key, None, self.c.line(key), reason=reason, severity=severity))
