"""A seeded fuzzer: mutated example and legacy specs through validate, plan, compile and diff in-process.

Any exit code other than 0 (ok), 1 (spec errors or a difference) or 2 (usage) -- or an exception escaping the
command -- is a bug in rlc: bad input must become a diagnostic.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rlc.compiler.cli import cli
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT.parent / "shared" / "corpus" / "skyrl-legacy"  # beside the checkout, as CI has it
SOURCES = sorted(ROOT.glob("examples/*.yaml")) + (sorted(CORPUS.glob("*.yaml")) if CORPUS.is_dir() else [])
ODD_VALUES: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    10**30,
    -(10**12),
    -1,
    0,
    0.5,
    -0.5,
    "",
    "x",
    "NaN",
    True,
    None,
    [],
    {},
    ["a", 1],
    {"k": "v"},
    "1e400",
    2**63,
    1e308,
]

NUMBERS: list[float] = [math.nan, math.inf, -math.inf, 1e308, -1e308, 1e-320, -0.0, 0.0, -1.5, 3.5, 1e9]
INTEGERS: list[int] = [0, -1, -7, 3, 7, 1000, 10**9, 2**40, 2**63, -(2**63), 10**30]

ODD_OVERRIDES = [".nan", ".inf", "-1", "1e400", "[1, x]", "{}", "null", "x", "1e308", "0", "'3'"]


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def mutate(doc: Any, rng: random.Random, times: int) -> Any:
    """Delete keys, swap types, put odd numbers and strings in lists, in place."""
    for _ in range(times):
        paths = _paths(doc)
        if not paths:
            return doc
        leaves = [p for p in paths if not isinstance(_parent(doc, p)[p[-1]], (dict, list))]
        path = rng.choice(leaves if leaves and rng.random() < 0.8 else paths)
        parent, key = _parent(doc, path), path[-1]
        what = rng.random()
        value = parent[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and rng.random() < 0.6:
            # keep the type so the value gets past the schema and reaches the rules, the planner and emit
            parent[key] = rng.choice(NUMBERS) if isinstance(value, float) else rng.choice(INTEGERS)
        elif what < 0.25 and isinstance(parent, dict):
            del parent[key]
        elif what < 0.35 and isinstance(parent[key], list):
            parent[key].append(rng.choice(ODD_VALUES))
        elif what < 0.45:
            parent[key] = [parent[key]]  # a scalar where a list was not expected, or a list in a list
        elif what < 0.55 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = str(parent[key])
        else:
            parent[key] = rng.choice(ODD_VALUES)
    return doc


def _check(result, args: list[str]) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, repr(result.exception))
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, result.output)


def fuzz(seed: int, rounds: int, tmp: Path) -> None:
    rng = random.Random(seed)
    yaml = YAML(typ="safe")
    yaml.allow_duplicate_keys = True
    runner = CliRunner()
    texts = {p: p.read_text(encoding="utf-8") for p in SOURCES}
    for i in range(rounds):
        source = rng.choice(SOURCES)
        doc = yaml.load(texts[source])
        mutate(doc, rng, rng.choice([1, 1, 2, 3]))
        spec = tmp / f"spec{i}.yaml"
        with spec.open("w", encoding="utf-8") as f:
            YAML(typ="safe").dump(doc, f)
        keys = [".".join(p) for p in _paths(doc) if all(isinstance(k, str) for k in p)]
        ovs = [f"{rng.choice(keys)}={rng.choice(ODD_OVERRIDES)}"] if keys and rng.random() < 0.3 else []
        for args in (
            ["validate", str(spec), *ovs, "--format", "json"],
            ["plan", str(spec), *ovs, "--format", "json", "--svg", str(tmp / "plan.svg")],
            ["compile", str(spec), *ovs, "-o", str(tmp / f"out{i}")],
            ["diff", str(source), str(spec), *ovs, "--format", "json"],
        ):
            _check(runner.invoke(cli, args), args)


@pytest.mark.parametrize("seed", [0, 1])
def test_mutated_specs_never_crash_the_cli(seed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fuzz(seed, 15, tmp_path)


if __name__ == "__main__":  # a longer run: python tests/test_cli_fuzz.py SEED ROUNDS
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        fuzz(int(sys.argv[1]), int(sys.argv[2]), Path(d))
