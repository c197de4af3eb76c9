"""The effective spec model: the v1 dataclasses plus whatever installed extensions add.

Field facts (type, default, doc, constraints) are read from the dataclasses here and nowhere else;
the JSON Schema, validation, typed conversion and `rlc explain` all go through this module.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from functools import cache, lru_cache
from typing import Any, Optional, Union

from rlc.core.dataclass import dataclass
from rlc.core.plain import plain_dataclass as to_plain  # noqa: F401  (re-exported)
from rlc.spec import fields as meta
from rlc.spec.extensions import ExtensionError, Extensions
from rlc.spec.root import RlcSpec

_NONE = type(None)


@dataclass(frozen=True)
class FieldSpec:
    """One field of the effective model, addressed by its dotted path."""

    path: str
    name: str
    tp: Any
    field: dataclasses.Field
    section: type | None  # the dataclass when this field is a (possibly optional) section

    @property
    def doc(self) -> str:
        return self.field.metadata.get(meta.DOC, "")

    @property
    def meta(self) -> typing.Mapping[str, Any]:
        return self.field.metadata

    def default(self) -> Any:
        if self.field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            return self.field.default_factory()  # type: ignore[misc]
        return copy.deepcopy(self.field.default)

    @property
    def optional(self) -> bool:
        return _NONE in _union_args(self.tp)


def _union_args(tp: Any) -> tuple:
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(tp)
    return (tp,)


def section_type(tp: Any) -> type | None:
    """The dataclass inside a type such as `X` or `Optional[X]`, else None."""
    for arg in _union_args(tp):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


@cache
def _hints(cls: type) -> dict:
    """Each field's type. The spec's modules write them as objects, which are the types as they stand; written as text
    (`from __future__ import annotations`, in an extension's module) they are evaluated, which costs `rlc validate`
    about 3 ms for the spec's ~50 classes."""
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    if all(_evaluated(tp) for tp in hints.values()):
        return hints
    return typing.get_type_hints(cls)


def _evaluated(tp: Any) -> bool:
    """A type object with no text left in it to evaluate (`list["X"]` holds a forward reference)."""
    if isinstance(tp, (str, typing.ForwardRef)) or tp is None:
        return False
    return all(_evaluated(arg) for arg in typing.get_args(tp))


def type_label(tp: Any) -> str:
    """A short human name of a field type: int, float, list[str], bool | int, ... ."""
    args = _union_args(tp)
    if len(args) > 1:
        parts = [type_label(a) for a in args if a is not _NONE]
        label = " | ".join(parts)
        return f"{label} | null" if _NONE in args else label
    origin = typing.get_origin(tp)
    if origin in (list, list):
        (item,) = typing.get_args(tp) or (Any,)
        return f"list[{type_label(item)}]"
    if origin in (dict, dict) or tp is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "section"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


class SpecModel:
    """The v1 model, optionally widened by extensions."""

    def __init__(self, extensions: Extensions | None = None):
        self.extensions = extensions or Extensions()
        self.root = self._effective("", RlcSpec)
        self._by_path: dict[str, FieldSpec] = {}
        self._index(self.root, "")

    # -- building -----------------------------------------------------------------------------

    def _effective(self, path: str, base: type) -> type:
        """`base` with extension fields/sections at `path` and below merged in (a subclass)."""
        ext = self.extensions
        overrides: list[tuple[str, Any, dataclasses.Field]] = []
        for f in dataclasses.fields(base):
            tp = _hints(base)[f.name]
            child = section_type(tp)
            if child is None:
                continue
            sub = self._effective(f"{path}.{f.name}" if path else f.name, child)
            if sub is not child:
                new_tp = Optional[sub] if _NONE in _union_args(tp) else sub  # noqa: UP045 (a type built at run time)
                factory = None if _NONE in _union_args(tp) and f.default is None else sub
                # One of default / default_factory is given, the other left MISSING.
                new_field: Any = (
                    dataclasses.field(default=None, metadata=f.metadata)
                    if factory is None
                    else dataclasses.field(default_factory=factory, metadata=f.metadata)
                )
                overrides.append((f.name, new_tp, new_field))
        extra: list[tuple[str, Any, dataclasses.Field]] = []
        own = {f.name for f in dataclasses.fields(base)}
        for cls in ext.fields.get(path, []):
            for f in dataclasses.fields(cls):
                if f.name in own:
                    raise ExtensionError(f"extension field {path}.{f.name} already exists in the spec")
                own.add(f.name)
                extra.append((f.name, _hints(cls)[f.name], f))
        prefix = f"{path}." if path else ""
        for sec_path, cls in ext.sections.items():
            if sec_path.startswith(prefix) and "." not in sec_path[len(prefix) :]:
                name = sec_path[len(prefix) :]
                if name in own:
                    raise ExtensionError(f"extension section {sec_path} already exists in the spec")
                own.add(name)
                sub = self._effective(sec_path, cls)
                doc = (cls.__doc__ or f"{name} settings (extension).").strip().splitlines()[0]
                extra.append((name, sub, meta.section(sub, doc)))
        if not overrides and not extra:
            return base
        spec = [(n, t, f) for n, t, f in overrides] + extra
        new = dataclasses.make_dataclass(base.__name__, spec, bases=(base,))
        new.__rlc_path__ = path  # type: ignore[attr-defined]
        return new

    def _index(self, cls: type, path: str) -> None:
        for f in dataclasses.fields(cls):
            tp = _hints(cls)[f.name]
            p = f"{path}.{f.name}" if path else f.name
            sec = section_type(tp)
            self._by_path[p] = FieldSpec(p, f.name, tp, f, sec)
            if sec is not None:
                self._index(sec, p)

    # -- queries ------------------------------------------------------------------------------

    def lookup(self, path: str) -> FieldSpec | None:
        return self._by_path.get(path)

    def paths(self) -> list[str]:
        return list(self._by_path)

    def fields_of(self, cls: type, path: str) -> list[FieldSpec]:
        prefix = f"{path}." if path else ""
        return [self._by_path[prefix + f.name] for f in dataclasses.fields(cls)]

    def allowed_values(self, spec: FieldSpec) -> tuple | None:
        base = spec.meta.get(meta.ENUM)
        added = tuple(self.extensions.values.get(spec.path, ()))
        if base is None:
            return added or None
        return tuple(base) + tuple(v for v in added if v not in base)

    # -- typed conversion ---------------------------------------------------------------------

    def to_typed(self, data: Any, skip: frozenset = frozenset()) -> Any:
        """Build the dataclass tree from plain data; paths in `skip` (invalid values) keep their defaults."""
        return self._build(self.root, "", data if isinstance(data, dict) else {}, skip)

    def _build(self, cls: type, path: str, data: dict, skip: frozenset) -> Any:
        kwargs: dict[str, Any] = {}
        for spec in self.fields_of(cls, path):
            if spec.name not in data or spec.path in skip:
                continue
            value = data[spec.name]
            if spec.section is not None and isinstance(value, dict):
                kwargs[spec.name] = self._build(spec.section, spec.path, value, skip)
            elif spec.section is not None and value is not None:
                continue  # wrong type, already reported by the schema
            else:
                kwargs[spec.name] = copy.deepcopy(value)
        return cls(**kwargs)


@lru_cache(maxsize=1)
def default_model() -> SpecModel:
    """The model with every installed extension loaded."""
    from rlc.spec.extensions import load_installed

    return SpecModel(load_installed())
