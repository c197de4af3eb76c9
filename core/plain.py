"""Plain Python values (dict, list, str, int, float, bool, None) from YAML round-trip nodes and from dataclass trees."""

from __future__ import annotations

import dataclasses
from typing import Any


def plain_yaml(node: Any) -> Any:
    """Round-trip nodes (ruamel's CommentedMap, ScalarFloat, ...) as plain values."""
    if isinstance(node, dict):
        return {_plain_key(k): plain_yaml(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [plain_yaml(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def _plain_key(k: Any) -> Any:
    if isinstance(k, str):
        return str(k)
    if isinstance(k, (list, tuple)):
        return tuple(plain_yaml(list(k)))
    return k


def plain_dataclass(obj: Any) -> Any:
    """A dataclass tree as plain dicts and lists, in field order."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain_dataclass(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: plain_dataclass(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_dataclass(v) for v in obj]
    return obj
