"""How a spec field is declared: its default, one-line doc and the constraints the schema carries."""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda f: f


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


def section(cls: type, doc: str, factory: Callable[[], Any] | None = None) -> Any:
    """A nested config section (a dataclass-typed field)."""
    return setting(doc=doc, factory=factory or cls)


@dataclass_transform(field_specifiers=(dataclasses.field,))
def spec_dataclass(cls: type) -> type:
    """`@dataclass` for the spec's sections, with one __eq__ and one __repr__ shared by all of them instead of two
    generated (compiled) for each: about 30% of what building the spec's ~45 classes costs every command at
    start-up. They compare and print as dataclasses do."""
    cls = dataclasses.dataclass(eq=False, repr=False)(cls)
    cls.__eq__ = _fields_eq  # type: ignore[assignment,method-assign]
    cls.__repr__ = _fields_repr  # type: ignore[assignment,method-assign]
    cls.__hash__ = None  # type: ignore[assignment]  # mutable and compared by value, as a dataclass with eq=True
    return cls


def _values(obj: Any, compared: bool) -> tuple:
    return tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if (f.compare if compared else f.repr))


def _fields_eq(self: Any, other: Any) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self, True) == _values(other, True)


@reprlib.recursive_repr()
def _fields_repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{self.__class__.__qualname__}({shown})"
