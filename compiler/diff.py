"""Diff: what will actually run differently between two specs, after both are migrated and resolved."""

from __future__ import annotations

import json
from dataclasses import field
from typing import Any

from rlc.compiler.provenance import Provenance, leaves
from rlc.core.dataclass import dataclass


@dataclass
class Change:
    key: str
    old: Any
    new: Any
    old_origin: str
    new_origin: str

    @property
    def section(self) -> str:
        parts = self.key.split(".")
        return ".".join(parts[:2]) if parts[0] in ("trainer", "generator") and len(parts) > 2 else parts[0]


@dataclass
class Difference:
    changes: list[Change] = field(default_factory=list)
    placement: list[str] = field(default_factory=list)  # human lines: what moved between GPUs

    @property
    def same(self) -> bool:
        return not self.changes and not self.placement

    def to_json(self) -> dict:
        return {
            "same": self.same,
            "changes": [
                {
                    "key": c.key,
                    "section": c.section,
                    "old": c.old,
                    "new": c.new,
                    "old_origin": c.old_origin,
                    "new_origin": c.new_origin,
                }
                for c in self.changes
            ],
            "placement": self.placement,
        }


def compare(
    a_spec, a_origin: dict[str, Provenance], a_plan: dict, b_spec, b_origin: dict[str, Provenance], b_plan: dict
) -> Difference:
    diff = Difference()
    b_values = dict(leaves(b_spec))
    for key, old in leaves(a_spec):
        new = b_values.get(key)
        if old != new:
            diff.changes.append(Change(key, old, new, str(a_origin.get(key, "")), str(b_origin.get(key, ""))))
    diff.placement = _placement(a_plan, b_plan)
    return diff


def _where(plan: dict) -> dict[str, list]:
    out = {}
    for role in plan.get("roles", []):
        out[role["name"]] = [(r["node"], r["gpu"]) for r in role["ranks"]]
    for engine in plan.get("inference", {}).get("engines", []):
        out[f"engine {engine['index']}"] = [tuple(g) for g in engine["gpus"]]
    return out


def _placement(a: dict, b: dict) -> list[str]:
    lines = []
    if a.get("cluster") != b.get("cluster"):
        ca, cb = a.get("cluster", {}), b.get("cluster", {})
        lines.append(
            f"cluster: {ca.get('nodes')} x {ca.get('gpus_per_node')} {ca.get('device')} -> "
            f"{cb.get('nodes')} x {cb.get('gpus_per_node')} {cb.get('device')}"
        )
    wa, wb = _where(a), _where(b)
    for name in sorted(set(wa) | set(wb), key=lambda n: (n.startswith("engine"), len(n), n)):
        if name not in wb:
            lines.append(f"{name}: removed (was on {_span(wa[name])})")
        elif name not in wa:
            lines.append(f"{name}: added on {_span(wb[name])}")
        elif wa[name] != wb[name]:
            lines.append(f"{name}: {_span(wa[name])} -> {_span(wb[name])}")
    return lines


def _span(gpus: list) -> str:
    nodes = sorted({n for n, _ in gpus})
    return f"{len(gpus)} GPU(s) on node(s) {','.join(map(str, nodes))}"


def render_text(diff: Difference, a: str, b: str) -> str:
    if diff.same:
        return f"{a} and {b} resolve to the same job"
    out = [f"--- {a}", f"+++ {b}"]
    section = None
    for c in sorted(diff.changes, key=lambda c: (c.section, c.key)):
        if c.section != section:
            section = c.section
            out.append(f"[{section}]")
        out.append(f"  {c.key}: {_show(c.old)} -> {_show(c.new)}")
        out.append(f"      ({c.old_origin} -> {c.new_origin})")
    if diff.placement:
        out.append("[placement]")
        out.extend(f"  {line}" for line in diff.placement)
    return "\n".join(out)


def _show(value: Any) -> str:

    return json.dumps(value, default=str)
