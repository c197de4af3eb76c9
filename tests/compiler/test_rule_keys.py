"""Every rule declares the spec keys it reads, so `rlc explain KEY` lists every rule a key takes part in.

Each rule runs on every example and on every rule's failing spec (test_rules.CASES) with a spec that records the
keys read through it; a key read but not declared (by itself or a section above it) fails the test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from rlc.compiler.check import RULES
from rlc.compiler.pipeline import analyze
from rlc.compiler.rules.base import Context
from test_rules import CASES, _write

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


class Recording:
    """A read-only view of a spec section that notes the dotted key of every value read through it."""

    def __init__(self, section: Any, path: str, reads: set[str]):
        object.__setattr__(self, "_section", section)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._section, name)
        key = f"{self._path}.{name}" if self._path else name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return Recording(value, key, self._reads)
        self._reads.add(key)
        return value


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> list[tuple[str, Any]]:
    out = [(p.name, analyze(p).spec) for p in EXAMPLES]
    for code, (_key, body) in sorted(CASES.items()):
        path, _line = _write(tmp_path_factory.mktemp(code), body)
        spec = analyze(path, env={}).spec
        if spec is not None:
            out.append((code, spec))
    return out


def _declares(rule, key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in rule.keys)


def test_every_rule_declares_the_keys_it_reads(specs) -> None:
    undeclared: dict[str, set[str]] = {}
    for _name, spec in specs:
        for r in RULES:
            reads: set[str] = set()
            list(r.fn(Context(Recording(spec, "", reads), lambda key, related=(): None, env={})))
            missing = {k for k in reads if not _declares(r, k)}
            if missing:
                undeclared.setdefault(r.code, set()).update(missing)
    assert not undeclared, {code: sorted(keys) for code, keys in sorted(undeclared.items())}


def test_the_recording_sees_what_a_rule_reads(specs) -> None:
    """The check above can fail: a rule that reads a key it does not declare is caught."""
    lora_alpha = next(r for r in RULES if r.code == "RLC-E602")
    narrowed = dataclasses.replace(lora_alpha, keys=("trainer.policy.model.lora.alpha",))
    reads: set[str] = set()
    list(narrowed.fn(Context(Recording(specs[0][1], "", reads), lambda key, related=(): None, env={})))
    assert "trainer.policy.model.lora.rank" in reads and not _declares(narrowed, "trainer.policy.model.lora.rank")
