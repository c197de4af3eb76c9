"""JSON Schema (draft 2020-12) generated from the spec model."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

from rlc.spec import fields as meta
from rlc.spec.model import _NONE, SpecModel, _union_args, section_type, to_plain

SCHEMA_ID = "https://rlc.dev/schema/rlc-spec-v1.json"
INTERPOLATION = r"^\$\{[^{}]+\}$"
COMMITTED = Path(__file__).parent / "schema" / "rlc-spec-v1.schema.json"


def _json_default(value: Any) -> Any:
    plain = to_plain(value)
    json.dumps(plain)  # fails loudly if a default cannot be written to JSON
    return plain


def _scalar(tp: Any) -> dict:
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    if tp is Any:
        return {}
    origin = typing.get_origin(tp)
    if origin in (list, list):
        (item,) = typing.get_args(tp) or (Any,)
        return {"type": "array", "items": _scalar(item)}
    if origin in (dict, dict) or tp is dict:
        return {"type": "object"}
    raise TypeError(f"no schema for type {tp!r}")


def _field_schema(model: SpecModel, spec, defs: dict) -> dict:
    args = [a for a in _union_args(spec.tp) if a is not _NONE]
    nullable = _NONE in _union_args(spec.tp)
    sec = section_type(spec.tp)
    if sec is not None:
        ref = {"$ref": f"#/$defs/{_def_name(sec)}"}
        _define(model, sec, spec.path, defs)
        out: dict = {"anyOf": [ref, {"type": "null"}]} if nullable else dict(ref)
    else:
        branches = [_scalar(a) for a in args]
        m = spec.meta
        for b in branches:
            if b.get("type") in ("integer", "number"):
                for key, word in (
                    (meta.MINIMUM, "minimum"),
                    (meta.MAXIMUM, "maximum"),
                    (meta.EXCLUSIVE_MINIMUM, "exclusiveMinimum"),
                ):
                    if key in m:
                        b[word] = m[key]
            if meta.PATTERN in m:
                if b.get("type") == "string":
                    b["pattern"] = m[meta.PATTERN]
                elif b.get("type") == "object":
                    b["propertyNames"] = {"pattern": m[meta.PATTERN]}
                    b["additionalProperties"] = {"type": ["string", "number", "boolean"]}
                elif b.get("type") == "array":
                    b["items"]["pattern"] = m[meta.PATTERN]
        values = model.allowed_values(spec)
        if values is not None:
            branches = [{"enum": list(values)}]
        if nullable:
            branches.append({"type": "null"})
        # Non-string scalars may hold a ${...} interpolation, resolved at compile time.
        # So may a string held to a pattern: rlc resolves the interpolation at compile time, as it does the others'.
        if any(
            b.get("type") not in ("string", None) or "enum" in b or "pattern" in b
            for b in branches
            if b.get("type") != "null"
        ):
            branches.append({"type": "string", "pattern": INTERPOLATION})
        out = branches[0] if len(branches) == 1 else {"anyOf": branches}
    out = {"description": spec.doc, **out}
    if sec is None or nullable:
        out["default"] = _json_default(spec.default())
    return out


def _def_name(cls: type) -> str:
    path = getattr(cls, "__rlc_path__", None)
    return f"{cls.__name__}@{path}" if path is not None else cls.__name__


def _define(model: SpecModel, cls: type, path: str, defs: dict) -> None:
    name = _def_name(cls)
    if name in defs:
        return
    defs[name] = {}  # placeholder against recursion
    props = {spec.name: _field_schema(model, spec, defs) for spec in model.fields_of(cls, path)}
    doc = (cls.__doc__ or "").strip()
    body: dict = {"type": "object", "properties": props, "additionalProperties": False}
    if doc and not doc.startswith(cls.__name__ + "("):
        body = {"description": doc.splitlines()[0], **body}
    defs[name] = body


def build_schema(model: SpecModel) -> dict:
    defs: dict = {}
    root_props = {spec.name: _field_schema(model, spec, defs) for spec in model.fields_of(model.root, "")}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "rlc spec v1",
        "description": "An rlc job spec: cluster and launch settings around SkyRL's training config.",
        "type": "object",
        "properties": root_props,
        "additionalProperties": False,
        "$defs": dict(sorted(defs.items())),
    }


def dumps(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


def committed_schema() -> dict:
    return json.loads(COMMITTED.read_text(encoding="utf-8"))
