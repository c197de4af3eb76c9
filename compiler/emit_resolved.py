"""resolved.yaml: the complete config, fields in model order, provenance as comments, a content hash."""

from __future__ import annotations

import json
from typing import Any

from rlc.compiler.provenance import Provenance
from rlc.core.digest import content_hash
from rlc.spec.model import to_plain

HEADER = "rlc resolved config (generated; edit the spec, not this file)"


def _scalar(value: Any) -> str:
    """One value as YAML: JSON scalars and flow collections are YAML too, and need no quoting rules of their own."""
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


def render(spec: Any, provenance: dict[str, Provenance], source: str) -> str:
    """Block mappings for sections, one `key: value  # origin` line per field, in the model's field order."""
    lines = [f"# {HEADER}", f"# source: {source}", f"# content-hash: {content_hash(spec)}"]

    def emit(node: dict, path: str, depth: int) -> None:
        pad = "  " * depth
        for key, value in node.items():
            here = f"{path}.{key}" if path else key
            origin = provenance.get(here)
            if isinstance(value, dict) and origin is None:  # a section (fields are leaves, sections are not)
                lines.append(f"{pad}{key}:")
                emit(value, here, depth + 1)
            else:
                note = f"  # {origin}" if origin is not None else ""
                lines.append(f"{pad}{key}: {_scalar(value)}{note}")

    emit(to_plain(spec), "", 0)
    return "\n".join(lines) + "\n"
