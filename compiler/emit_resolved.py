"""resolved.yaml: the complete config, fields in model order, provenance as comments, a content hash."""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

from rlc.compiler.provenance import Provenance
from rlc.spec.model import to_plain

HEADER = "rlc resolved config (generated; edit the spec, not this file)"


def content_hash(spec: Any) -> str:
    """sha256 of the resolved values: comments, key order and written-out defaults do not change it."""
    canonical = json.dumps(to_plain(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def render(spec: Any, provenance: dict[str, Provenance], source: str) -> str:
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    def build(value: Any, path: str):
        if isinstance(value, dict):
            node = CommentedMap()
            for k, v in value.items():
                node[k] = build(v, f"{path}.{k}" if path else k)
                origin = provenance.get(f"{path}.{k}" if path else k)
                if origin is not None and not isinstance(node[k], CommentedMap) or (origin is not None and not node[k]):
                    node.yaml_add_eol_comment(str(origin), k)
            return node
        if isinstance(value, list):
            seq = CommentedSeq(build(v, path) for v in value)
            seq.fa.set_flow_style()
            return seq
        return value

    tree = build(to_plain(spec), "")
    y = YAML(typ="rt")
    y.width = 4096
    y.indent(mapping=2, sequence=2, offset=0)
    y.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    buf = io.StringIO()
    y.dump(tree, buf)
    head = f"# {HEADER}\n# source: {source}\n# content-hash: {content_hash(spec)}\n"
    return head + buf.getvalue()
