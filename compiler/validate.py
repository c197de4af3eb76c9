"""Schema validation: the document checked field by field against the spec model.

The model is the one source of the JSON Schema (spec/schema.py) and of this walker, which enforces the
same constraints (a test holds the two to the same verdicts) without importing jsonschema: that import
alone costs more than the rest of `rlc validate`. Every violation becomes a diagnostic naming the key,
the value, where it is written, and a fix (a did-you-mean for misspelt keys and values).
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Iterable
from typing import Any

from rlc.compiler.load import Document
from rlc.core.diagnostics import ERROR, Diagnostic
from rlc.spec import fields as meta
from rlc.spec import schema
from rlc.spec.model import _NONE, FieldSpec, SpecModel, _union_args, type_label

INTERPOLATION = re.compile(schema.INTERPOLATION)  # the same strings the JSON Schema lets through

UNREADABLE_VERSION = "RLC-E014"  # nothing past the schema can read a spec of an unknown version


def dotted(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def field_path(path: Iterable[Any]) -> str:
    """The model path of a document path (list indices dropped)."""
    return ".".join(str(p) for p in path if not isinstance(p, int))


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(value) if len(value) < 60 else repr(value[:57] + "...")
    return repr(value)


def _kind(value: Any) -> str:
    for t, word in (
        (type(None), "null"),
        (bool, "boolean"),
        (int, "integer"),
        (float, "number"),
        (str, "string"),
        (dict, "mapping"),
        (list, "list"),
    ):
        if isinstance(value, t):
            return word
    return type(value).__name__


def _matches(tp: Any, value: Any) -> bool:
    """Whether a plain YAML value fits a field type (JSON Schema semantics: 1.0 is an integer)."""
    if tp is Any:
        return True
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    origin = typing.get_origin(tp)
    if origin in (list, list):
        (item,) = typing.get_args(tp) or (Any,)
        return isinstance(value, list) and all(_matches(item, v) for v in value)
    if origin in (dict, dict) or tp is dict:
        return isinstance(value, dict)
    return False


class _Walker:
    def __init__(self, doc: Document, model: SpecModel):
        self.doc, self.model = doc, model
        self.diags: list[Diagnostic] = []
        self.invalid: set[str] = set()

    def report(self, diag: Diagnostic, path: list) -> None:
        self.diags.append(diag)
        self.invalid.add(field_path(path))

    def section(self, cls: type, fpath: str, data: dict, path: list) -> None:
        fields = {spec.name: spec for spec in self.model.fields_of(cls, fpath)}
        for key, value in data.items():
            spec = fields.get(key) if isinstance(key, str) else None
            if spec is None:
                self.report(self.unknown_key(path, key, sorted(fields)), path + [key])
            else:
                self.value(spec, value, path + [key])

    def value(self, spec: FieldSpec, value: Any, path: list) -> None:
        key, loc = dotted(path), self.doc.locate(tuple(path))
        if path == ["version"] and value != spec.default():
            self.report(
                Diagnostic(
                    UNREADABLE_VERSION,
                    ERROR,
                    f"version {describe(value)} is not a spec version this rlc reads",
                    key="version",
                    location=loc,
                    hint="write `version: 1`; files without `version` are read as legacy SkyRL configs",
                ),
                path,
            )
            return
        if value is None and spec.optional:
            return
        if spec.section is not None:
            if isinstance(value, dict):
                self.section(spec.section, spec.path, value, path)
            else:
                self.type_error(spec, value, path, "a mapping" + (" or null" if spec.optional else ""))
            return
        if isinstance(value, str) and INTERPOLATION.match(value):
            return  # resolved at compile time (or on the node, for ${oc.env:...})
        allowed = self.model.allowed_values(spec)
        if allowed is not None:
            if value not in allowed or isinstance(value, bool):
                # deferred: difflib, only a misspelt key needs a close match
                import difflib

                close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.5)
                hint = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(map(str, allowed))}"
                self.report(
                    Diagnostic(
                        "RLC-E012",
                        ERROR,
                        f"{key} = {describe(value)} is not an accepted value",
                        key=key,
                        location=loc,
                        hint=hint + (" (or null)" if spec.optional else ""),
                        values={"value": value, "allowed": list(allowed), **({"proposed": close[0]} if close else {})},
                    ),
                    path,
                )
            return
        types = [t for t in _union_args(spec.tp) if t is not _NONE]
        if not any(_matches(t, value) for t in types):
            self.type_error(spec, value, path, type_label(spec.tp))
            return
        self.constraints(spec, value, path)

    def constraints(self, spec: FieldSpec, value: Any, path: list) -> None:
        key, m = dotted(path), spec.meta
        if isinstance(value, float) and not math.isfinite(value):
            # .nan/.inf parse as floats in YAML; no setting of a training job means infinity or not-a-number
            self.report(
                Diagnostic(
                    "RLC-E015",
                    ERROR,
                    f"{key} = {describe(value)} is not a finite number",
                    key=key,
                    location=self.doc.locate(tuple(path)),
                    hint=f"set {key} to a finite number",
                    values={"value": value},
                ),
                path,
            )
            return
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for name, word, ok in (
                (meta.MINIMUM, ">=", lambda v, b: v >= b),
                (meta.MAXIMUM, "<=", lambda v, b: v <= b),
                (meta.EXCLUSIVE_MINIMUM, ">", lambda v, b: v > b),
            ):
                if name in m and not (not math.isnan(value) and ok(value, m[name])):
                    self.report(
                        Diagnostic(
                            "RLC-E013",
                            ERROR,
                            f"{key} = {describe(value)} is out of range: it must be {word} {m[name]}",
                            key=key,
                            location=self.doc.locate(tuple(path)),
                            hint=f"set {key} to a value {word} {m[name]}",
                            values={"value": value, "bound": m[name]},
                        ),
                        path,
                    )
                    return
        pattern = m.get(meta.PATTERN)
        if pattern is None:
            return
        if isinstance(value, str):
            bad = [] if re.search(pattern, value) else [(path, value)]
        elif isinstance(value, dict):
            bad = [(path + [k], k) for k in value if not (isinstance(k, str) and re.search(pattern, k))]
            bad += [
                (path + [k], v)
                for k, v in value.items()
                if not isinstance(v, (str, int, float, bool)) and (path + [k], k) not in bad
            ]
        elif isinstance(value, list):
            bad = [(path + [i], v) for i, v in enumerate(value) if not re.search(pattern, str(v))]
        else:  # a number where a string may also stand: the pattern is the string's
            return
        for where, what in bad:
            what_key = dotted(where)
            hint = m.get(meta.PATTERN_HINT) or (
                "use letters, digits, '.', '_' and '-' (at most 63, starting with a letter or digit)"
                if spec.name == "name"
                else "names are letters, digits and '_', not starting with a digit; values are plain strings or numbers"
            )
            self.report(
                Diagnostic(
                    "RLC-E013",
                    ERROR,
                    f"{what_key} = {describe(what)} is not allowed here",
                    key=what_key,
                    location=self.doc.locate(tuple(where), key=isinstance(value, dict)),
                    hint=hint,
                    values={"value": what},
                ),
                path,
            )

    def type_error(self, spec: FieldSpec, value: Any, path: list, expected: str) -> None:
        key = dotted(path)
        words = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(
            expected, expected
        )
        if spec.section is not None:
            words = "a mapping of its settings"
        got = (
            describe(value) if value is None or isinstance(value, (dict, list)) else f"{_kind(value)} {describe(value)}"
        )
        self.report(
            Diagnostic(
                "RLC-E011",
                ERROR,
                f"{key} should be {expected}, got {got}",
                key=key,
                location=self.doc.locate(tuple(path)),
                hint=f"write {key} as {words}",
                values={"value": value, "expected": expected},
            ),
            path,
        )

    def unknown_key(self, path: list, key: Any, props: list[str]) -> Diagnostic:
        full = dotted(path + [key])
        loc = self.doc.locate(tuple(path + [key]), key=True)
        # deferred: difflib, only a misspelt value needs a close match
        import difflib

        if not isinstance(key, str):
            return Diagnostic(
                "RLC-E010",
                ERROR,
                f"{describe(key)} is not a valid key (keys are names)",
                key=dotted(path) or None,
                location=loc,
                hint="write keys as plain names",
            )
        close = difflib.get_close_matches(key, props, n=1, cutoff=0.6)
        elsewhere = [p for p in self.model.paths() if p.endswith("." + key) and p != field_path(path + [key])]
        legacy = _legacy_hint(field_path(path + [key]))
        if close:
            hint = f"did you mean {dotted(path + [close[0]])}?"
        elif legacy:
            hint = legacy
        elif elsewhere:
            hint = f"{key} lives at {' or '.join(sorted(elsewhere)[:3])}"
        else:
            where = dotted(path) or "the top level"
            hint = (
                f"{where} takes: {', '.join(props)}"
                if len(props) <= 12
                else f"run `rlc explain {dotted(path) or 'trainer'}` to list the keys of {where}"
            )
        return Diagnostic(
            "RLC-E010",
            ERROR,
            f"unknown key {full}",
            key=full,
            location=loc,
            hint=hint,
            values={"suggestions": close or elsewhere[:3]},
        )


def _legacy_hint(path: str) -> str | None:
    # deferred: SkyRL's legacy tables are read for a key the schema refuses, never for a valid spec
    from rlc.compiler.importers.skyrl.legacy import legacy_target

    target = legacy_target(path)
    return (
        f"{path} is a legacy SkyRL key: spec v1 calls it {target} (`rlc migrate` rewrites the file)" if target else None
    )


def validate(doc: Document, data: dict, model: SpecModel) -> tuple[list[Diagnostic], set[str]]:
    """Schema diagnostics for `data` (the plain form of doc.data) and the set of invalid field paths."""
    walker = _Walker(doc, model)
    walker.section(model.root, "", data, [])
    return walker.diags, walker.invalid


def typed_spec(data: dict, model: SpecModel, invalid: set[str]) -> tuple[Any, set[str]]:
    """The typed spec of a validated document (its invalid keys left at their defaults), and the field paths the
    document writes: resolve derives none of those."""
    explicit = written_paths(data, model) - invalid
    integral_floats_to_int(data, model)
    return model.to_typed(data, frozenset(invalid)), explicit


def written_paths(data: Any, model: SpecModel, prefix: str = "") -> set[str]:
    """Field paths a document writes (sections and leaves)."""
    out: set[str] = set()
    if not isinstance(data, dict):
        return out
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        spec = model.lookup(path)
        if spec is None:
            continue
        out.add(path)
        if spec.section is not None and isinstance(value, dict):
            out |= written_paths(value, model, path)
    return out


def integral_floats_to_int(data: Any, model: SpecModel, prefix: str = "") -> None:
    """An integer field written as 1e3 (which the schema accepts) becomes the int 1000, so rules compute exactly.

    Left a float, 1e308 turns products into inf and floor divisions into NaN, which no integer conversion takes.
    """
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        spec = model.lookup(path)
        if spec is None:
            continue
        if isinstance(value, dict):
            integral_floats_to_int(value, model, path)
        elif isinstance(value, float) and value.is_integer() and _takes_int(spec.tp):
            data[key] = int(value)


def _takes_int(tp: Any) -> bool:
    return tp is int or (int in getattr(tp, "__args__", ()) and float not in getattr(tp, "__args__", ()))
