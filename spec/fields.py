"""How a spec field is declared: its default, one-line doc and the constraints the schema carries."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

# Metadata keys read by the schema generator and by `rlc explain`.
DOC = "doc"
ENUM = "enum"
MINIMUM = "minimum"
MAXIMUM = "maximum"
EXCLUSIVE_MINIMUM = "exclusive_minimum"
PASSTHROUGH = "passthrough"
PATTERN = "pattern"
PATTERN_HINT = "pattern_hint"  # the fix a diagnostic gives for a value the pattern refuses
RLC_ONLY = "rlc_only"  # an rlc addition with no SkyRL counterpart


def setting(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    factory: Callable[[], Any] | None = None,
    enum: Sequence[Any] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    passthrough: bool = False,
    pattern: str | None = None,
    pattern_hint: str | None = None,
    rlc_only: bool = False,
) -> Any:
    """A dataclass field with its documentation and schema constraints attached."""
    if not doc:
        raise ValueError("every spec field needs a one-line doc")
    meta: dict[str, Any] = {DOC: doc}
    if enum is not None:
        meta[ENUM] = tuple(enum)
    if minimum is not None:
        meta[MINIMUM] = minimum
    if maximum is not None:
        meta[MAXIMUM] = maximum
    if exclusive_minimum is not None:
        meta[EXCLUSIVE_MINIMUM] = exclusive_minimum
    if passthrough:
        meta[PASSTHROUGH] = True
    if pattern is not None:
        meta[PATTERN] = pattern
    if pattern_hint is not None:
        meta[PATTERN_HINT] = pattern_hint
    if rlc_only:
        meta[RLC_ONLY] = True
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type, doc: str, factory: Callable[[], Any] | None = None, rlc_only: bool = False) -> Any:
    """A nested config section (a dataclass-typed field)."""
    return setting(doc=doc, factory=factory or cls, rlc_only=rlc_only)
