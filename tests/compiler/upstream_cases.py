"""Specs that set SkyRL 0.4 settings the runtime does not run yet: one per key of rules_upstream.UNSUPPORTED."""

from __future__ import annotations

from typing import Any

from rlc.compiler.rules.upstream import UNSUPPORTED
from rlc.spec.model import default_model, to_plain


def non_default(key: str) -> Any:
    """A value of `key`'s type that is neither its default nor one the runtime also accepts."""
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


def nested_yaml(key: str, value: Any) -> str:
    """`key: value` as nested YAML, its value line marked `# <-`."""
    import json

    parts = key.split(".")
    lines = [f"{'  ' * i}{p}:" for i, p in enumerate(parts[:-1])]
    lines.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}: {json.dumps(value)}  # <-")
    return "\n".join(lines) + "\n"


# code -> (key, spec body) for the first key of each group, in the shape tests/compiler/test_rules.py uses
UPSTREAM_CASES = {g.code: (g.keys[0], nested_yaml(g.keys[0], non_default(g.keys[0]))) for g in UNSUPPORTED}
ALL_KEYS = [(g.code, key) for g in UNSUPPORTED for key in g.keys]
