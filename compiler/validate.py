"""Schema validation: the document against the JSON Schema generated from the spec model.

Every schema violation becomes a diagnostic that names the key, the value, where it is written,
and a fix (a did-you-mean for misspelt keys and enum values).
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable

from rlc.compiler.diagnostics import ERROR, Diagnostic
from rlc.compiler.load import Document
from rlc.spec.model import SpecModel, type_label

_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "object": "a mapping", "array": "a list", "null": "null"}


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
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


class _Validator:
    _cache: dict[int, Any] = {}

    @classmethod
    def for_schema(cls, schema: dict):
        cached = cls._cache.get(id(schema))
        if cached is None or cached[0] is not schema:  # the schema object is kept, so its id is never reused
            from jsonschema import Draft202012Validator

            cached = cls._cache[id(schema)] = (schema, Draft202012Validator(schema))
        return cached[1]


def validate(doc: Document, data: dict, model: SpecModel, schema: dict) -> tuple[list[Diagnostic], set[str]]:
    """Schema diagnostics for `data` (the plain form of doc.data) and the set of invalid field paths."""
    validator = _Validator.for_schema(schema)
    diags: list[Diagnostic] = []
    invalid: set[str] = set()
    seen: set[tuple] = set()
    for err in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        for d, fpath in _translate(err, doc, model):
            ident = (d.code, d.key)
            if ident in seen:
                continue
            seen.add(ident)
            diags.append(d)
            invalid.add(fpath)
    return diags, invalid


def _translate(err, doc: Document, model: SpecModel):
    path = list(err.absolute_path)
    fpath = field_path(path)
    if err.validator == "additionalProperties":
        props = sorted(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in props]
        for key in extra:
            yield _unknown_key(doc, model, path, key, props), field_path(path + [key])
        return
    if err.validator == "propertyNames":
        for key in err.instance:
            if isinstance(key, str) and not _matches(err.schema.get("propertyNames", {}), key):
                yield Diagnostic("RLC-E013", ERROR, f"{describe(key)} is not a valid environment variable name",
                                 key=dotted(path + [key]), location=doc.locate(tuple(path + [key]), key=True),
                                 hint="names are letters, digits and '_', not starting with a digit"), fpath
        return
    value = err.instance
    spec = model.lookup(fpath)
    loc = doc.locate(tuple(path))
    key = dotted(path)
    if path == ["version"]:
        yield Diagnostic("RLC-E014", ERROR, f"version {describe(value)} is not a spec version this rlc reads",
                         key="version", location=loc, hint="write `version: 1`; files without `version` are read as legacy SkyRL configs"), fpath
        return
    if err.validator in ("anyOf", "oneOf"):
        inner = _best_branch(err)
        if inner is not None and inner.validator not in ("type", "pattern"):
            yield from _translate(inner, doc, model)
            return
    if err.validator == "enum" or (spec is not None and model.allowed_values(spec) and isinstance(value, str)):
        allowed = model.allowed_values(spec) if spec is not None else err.validator_value
        allowed = [a for a in (allowed or []) if a is not None]
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(map(str, allowed))}"
        if spec is not None and spec.optional:
            hint += " (or null)"
        yield Diagnostic("RLC-E012", ERROR, f"{key} = {describe(value)} is not an accepted value",
                         key=key, location=loc, hint=hint, values={"value": value, "allowed": list(allowed)}), fpath
        return
    if err.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        word = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[err.validator]
        yield Diagnostic("RLC-E013", ERROR, f"{key} = {describe(value)} is out of range: it must be {word} {err.validator_value}",
                         key=key, location=loc, hint=f"set {key} to a value {word} {err.validator_value}",
                         values={"value": value, "bound": err.validator_value}), fpath
        return
    if err.validator == "pattern" and spec is not None and spec.meta.get("pattern") and isinstance(value, str):
        yield Diagnostic("RLC-E013", ERROR, f"{key} = {describe(value)} has characters that are not allowed",
                         key=key, location=loc, hint=_pattern_hint(spec), values={"value": value}), fpath
        return
    if spec is not None and spec.section is not None:
        expected = "a mapping" + (" or null" if spec.optional else "")
    elif spec is not None:
        expected = type_label(spec.tp)
    else:
        expected = _TYPE_WORDS.get(str(err.validator_value), str(err.validator_value))
    if spec is None and path and isinstance(path[-1], int):
        parent = model.lookup(field_path(path))
        expected = type_label(parent.tp) + " items" if parent else expected
    hint = f"write {key} as {_expected_words(spec, expected)}"
    yield Diagnostic("RLC-E011", ERROR, f"{key} should be {expected}, got {_kind(value)} {describe(value)}",
                     key=key, location=loc, hint=hint, values={"value": value, "expected": expected}), fpath


def _pattern_hint(spec) -> str:
    if spec.name == "name":
        return "use letters, digits, '.', '_' and '-' (at most 63, starting with a letter or digit)"
    return "use letters, digits and '_' (not starting with a digit)"


def _expected_words(spec, expected: str) -> str:
    if spec is not None and spec.section is not None:
        return "a mapping of its settings"
    return {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}.get(expected, expected)


def _matches(schema: dict, key: str) -> bool:
    import re

    pat = schema.get("pattern")
    return bool(re.search(pat, key)) if pat else True


def _best_branch(err):
    """The error of the anyOf branch the value was most likely meant for (same JSON type)."""
    best = None
    for sub in err.context or []:
        if sub.validator in ("type", "pattern") and sub.relative_schema_path and len(sub.relative_schema_path) <= 2:
            continue
        if best is None or len(sub.relative_path) > len(best.relative_path):
            best = sub
    return best


def _unknown_key(doc: Document, model: SpecModel, path: list, key: Any, props: list[str]) -> Diagnostic:
    full = dotted(path + [key])
    loc = doc.locate(tuple(path + [key]), key=True)
    if not isinstance(key, str):
        return Diagnostic("RLC-E010", ERROR, f"{describe(key)} is not a valid key (keys are names)", key=dotted(path) or None,
                          location=loc, hint="write keys as plain names")
    close = difflib.get_close_matches(key, props, n=1, cutoff=0.6)
    elsewhere = [p for p in model.paths() if p.endswith("." + key) and p != field_path(path + [key])]
    if close:
        hint = f"did you mean {dotted(path + [close[0]])}?"
    elif elsewhere:
        hint = f"{key} lives at {' or '.join(sorted(elsewhere)[:3])}"
    else:
        where = dotted(path) or "the top level"
        hint = f"{where} takes: {', '.join(props)}" if len(props) <= 12 else f"run `rlc explain {dotted(path) or 'trainer'}` to list the keys of {where}"
    return Diagnostic("RLC-E010", ERROR, f"unknown key {full}", key=full, location=loc, hint=hint,
                      values={"suggestions": close or elsewhere[:3]})
