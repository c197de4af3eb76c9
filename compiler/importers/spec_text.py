"""Spec v1 text of an imported config: each value commented with the foreign keys (and lines) it came from."""

from __future__ import annotations

import io

from rlc.compiler.importers.areal_import import ImportResult


def commented_spec(result: ImportResult, label: str, header: str) -> str:
    """Spec v1 YAML of an import, each key commented with `label: ` and the foreign keys it came from."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    root = CommentedMap()
    root["version"] = 1
    for section in ("name", "cluster", "launch", "data", "trainer", "generator", "environment"):
        if any(p == section or p.startswith(section + ".") for p in result.spec):
            root[section] = CommentedMap() if section != "name" else None
    for path, value in result.spec.items():
        *head, last = path.split(".")
        node = root
        for part in head:
            if not isinstance(node.get(part), CommentedMap):
                node[part] = CommentedMap()
            node = node[part]
        node[last] = value
        sources = [s for s in result.sources.get(path, []) if s]
        if sources:
            node.yaml_add_eol_comment(
                f"{label}: {', '.join(sources)}", last, column=_comment_column(len(head), last, value)
            )
    root.yaml_set_start_comment(header)
    y = YAML(typ="rt")
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    buf = io.StringIO()
    y.dump(root, buf)
    return buf.getvalue()


def _comment_column(depth: int, key: str, value) -> int:
    """Two spaces after `key: value` (ruamel would otherwise align a comment with the one before it)."""
    if isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, (str, int, float)):
        shown = str(value)
    else:
        shown = ""  # a block list or mapping: the comment goes after `key:`
    return 2 * depth + len(key) + 2 + len(shown) + (2 if shown else 1)
