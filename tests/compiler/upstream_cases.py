"""Specs that set SkyRL 0.4 settings the runtime does not run yet: one per key of rules_upstream.UNSUPPORTED."""

from __future__ import annotations

from typing import Any

from rlc.compiler.rules.upstream import UNSUPPORTED
from rlc.spec.model import default_model, to_plain


def group_of(key: str):
    return next(g for g in UNSUPPORTED if key in g.keys)


def non_default(key: str) -> Any:
    """A value of `key`'s type that is neither its default nor one the runtime also accepts."""
    refused = [v for k, v in group_of(key).refused_values if k == key]
    if refused:
        return refused[0]
    field = default_model().lookup(key)
    assert field is not None, key
    default = to_plain(field.default())
    if field.section is not None:
        return {"sync_dir": "/tmp/deltas"}
    values = default_model().allowed_values(field)
    if values:
        return next(v for v in values if v != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 3
    if isinstance(default, list):
        return [*default, 1] if default and isinstance(default[0], int) else ["x"]
    if isinstance(default, dict):
        return {"extra": 1}
    label = str(field.tp)
    if "int" in label:
        return 7
    if "float" in label:
        return 0.5
    if "bool" in label:
        return True
    if "list" in label:
        return ["x"]
    if "dict" in label:
        return {"extra": 1}
    return "custom"


def context(key: str) -> dict[str, Any]:
    """Settings under which `key` is read: each condition of its group met by its example value."""
    return {c.key: c.example for c in group_of(key).when(key)}


def nested_yaml(key: str, value: Any, others: dict[str, Any] | None = None) -> str:
    """`key: value` and the `others` (dotted key -> value) as nested YAML, the line of `key` marked `# <-`."""
    import json

    tree: dict = {}
    for dotted, v in {**(others or {}), key: value}.items():
        node = tree
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = v

    def lines(node: dict, path: tuple, depth: int) -> list[str]:
        out = []
        for name, v in node.items():
            here = (*path, name)
            if isinstance(v, dict) and ".".join(here) != key:
                out += [f"{'  ' * depth}{name}:", *lines(v, here, depth + 1)]
            else:
                mark = "  # <-" if ".".join(here) == key else ""
                out.append(f"{'  ' * depth}{name}: {json.dumps(v)}{mark}")
        return out

    return "\n".join(lines(tree, (), 0)) + "\n"


def refused_case(key: str) -> str:
    """A spec body that sets `key` to a value the runtime does not run, where it is read."""
    return nested_yaml(key, non_default(key), context(key))


# code -> (key, spec body) for the first key of each group, in the shape tests/compiler/test_rules.py uses
UPSTREAM_CASES = {g.code: (g.keys[0], refused_case(g.keys[0])) for g in UNSUPPORTED}
ALL_KEYS = [(g.code, key) for g in UNSUPPORTED for key in g.keys]
# keys whose non-default values are read only under conditions: (code, key), for the inert-value test
CONDITIONAL_KEYS = [(g.code, key) for g in UNSUPPORTED for key in g.keys if g.when(key)]
