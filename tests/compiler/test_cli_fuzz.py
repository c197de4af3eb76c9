"""A seeded fuzzer of every command, in process: mutated specs, legacy files, AReaL configs, overrides, keys,
datasets and run directories through validate, plan, compile, diff, migrate (both sources), explain, schema,
data gsm8k and plot.

Any exit code other than 0 (ok), 1 (spec errors or a difference) or 2 (usage) -- or an exception escaping the
command -- is a bug in rlc: bad input must become a diagnostic. Each CI run fuzzes a few hundred inputs from a
fresh seed, printed on failure; `RLC_FUZZ_SEED=N` replays one, and `python tests/compiler/test_cli_fuzz.py SEED
INPUTS` runs longer.
"""

from __future__ import annotations

import json
import math
import os
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
SOURCES += sorted((ROOT / "tests" / "fixtures" / "skyrl-history").glob("*.yaml"))  # every historical SkyRL shape
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
# References: to a number (in any field), to a section, to nothing, two in one value.
ODD_OVERRIDES += ["${trainer.train_batch_size}", "${trainer}", "${nope.key}", "${trainer.epochs}-${name}"]


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


KEY_RENAMES = ["", "1024", "x", "trainer", "policy_mini_batch", "version", "0"]
AREAL_SOURCES = sorted((ROOT / "tests" / "fixtures" / "areal").glob("*.yaml"))
BAD_OVERRIDES = ["a.b", "=1", "+trainer.epochs=1", "trainer.epochs", "trainer..epochs=1", "trainer.epochs=[", "ß.x=1"]


class Fuzzer:
    """One seed's inputs and the commands they go through; `failures` collects what broke."""

    def __init__(self, seed: int, tmp: Path):
        self.seed, self.tmp, self.rng = seed, tmp, random.Random(seed)
        self.runner = CliRunner()
        self.yaml = YAML(typ="safe")
        self.yaml.allow_duplicate_keys = True
        self.texts = {p: p.read_text(encoding="utf-8") for p in [*SOURCES, *AREAL_SOURCES]}
        self.count = 0

    def invoke(self, *args: str) -> None:
        self.count += 1
        result = self.runner.invoke(cli, list(args))
        where = f"seed {self.seed} (replay: RLC_FUZZ_SEED={self.seed}), input {self.count}: rlc {' '.join(args)}"
        escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
        assert not escaped, f"{where}\n{result.exception!r}"
        assert result.exit_code in (0, 1, 2), f"{where}\nexit {result.exit_code}\n{result.output[-2000:]}"

    def _write(self, name: str, doc: Any) -> Path:
        path = self.tmp / name
        with path.open("w", encoding="utf-8") as f:
            YAML(typ="safe").dump(doc, f)
        return path

    def _garbled(self, name: str, text: str) -> Path:
        """The file's bytes cut short, with a few bytes changed: malformed YAML, odd bytes, a half key."""
        data = bytearray(text.encode("utf-8"))
        if data and self.rng.random() < 0.5:
            del data[self.rng.randrange(len(data)) :]
        for _ in range(self.rng.choice([0, 1, 3])):
            if data:
                data[self.rng.randrange(len(data))] = self.rng.choice(b"{}[]:-'\"\t\n#&*!|>%@`\xff\x00")
        path = self.tmp / name
        path.write_bytes(bytes(data))
        return path

    def _mutated(self, source: Path, name: str) -> tuple[Path, list[str]]:
        """A mutated copy of `source` and the dotted keys it has."""
        if self.rng.random() < 0.1:
            return self._garbled(name, self.texts[source]), []
        doc = self.yaml.load(self.texts[source])
        mutate(doc, self.rng, self.rng.choice([1, 1, 2, 3]))
        if isinstance(doc, dict) and self.rng.random() < 0.15:  # a key renamed (typos, numbers, empty)
            paths = [p for p in _paths(doc) if isinstance(_parent(doc, p), dict)]
            if paths:
                path = self.rng.choice(paths)
                parent = _parent(doc, path)
                parent[self.rng.choice(KEY_RENAMES) or str(path[-1])[:-1]] = parent.pop(path[-1])
        keys = [".".join(p) for p in _paths(doc) if all(isinstance(k, str) for k in p)]
        if keys and self.rng.random() < 0.15:  # a value that refers to another key (of any type)
            path = tuple(self.rng.choice(keys).split("."))
            _parent(doc, path)[path[-1]] = "${" + self.rng.choice([*keys, "nope"]) + "}"
        return self._write(name, doc), keys

    def _overrides(self, keys: list[str]) -> list[str]:
        out = []
        for _ in range(self.rng.choice([0, 0, 1, 2])):
            if keys and self.rng.random() < 0.85:
                out.append(f"{self.rng.choice(keys)}={self.rng.choice(ODD_OVERRIDES)}")
            else:
                out.append(self.rng.choice(BAD_OVERRIDES))
        return out

    def spec_round(self, i: int) -> None:
        source = self.rng.choice(SOURCES)
        spec, keys = self._mutated(source, f"spec{i}.yaml")
        ovs = self._overrides(keys)
        t = str(self.tmp)
        self.invoke("validate", str(spec), *ovs, "--format", self.rng.choice(["json", "text"]))
        self.invoke("plan", str(spec), *ovs, "--format", self.rng.choice(["json", "text"]), "--svg", f"{t}/plan.svg")
        target = self.rng.choice(["skypilot", "ray", "kuberay", "all"])
        self.invoke("compile", str(spec), *ovs, "-o", f"{t}/out{i}", "--target", target)
        self.invoke("diff", str(source), str(spec), *ovs, "--format", "json")
        migrate = self.rng.choice([[], ["--check"], ["--diff"], ["-o", f"{t}/migrated{i}.yaml"]])
        self.invoke("migrate", str(spec), *migrate)
        key = self.rng.choice([*keys, "memory", "trainer", "nope.key", "RLC-E702", ""] if keys else ["x.y"])
        self.invoke("explain", key)

    def areal_round(self, i: int) -> None:
        spec, _ = self._mutated(self.rng.choice(AREAL_SOURCES), f"areal{i}.yaml")
        self.invoke("migrate", "--from", "areal", str(spec), *self.rng.choice([[], ["-o", f"{self.tmp}/imp{i}.yaml"]]))

    def data_round(self, i: int) -> None:
        records = [{"question": "2 + 3?", "answer": "5 #### 5"}, {"question": "x", "answer": "#### 7"}]
        for _ in range(self.rng.choice([1, 2])):
            rec = self.rng.choice(records)
            key = self.rng.choice([*rec, "extra"])
            rec[key] = self.rng.choice(ODD_VALUES[:20] + ["no number", "#### x", "#### 1e400"])
        text = "\n".join(json.dumps(r, default=str) for r in records)
        path = self._garbled(f"gsm8k{i}.jsonl", text) if self.rng.random() < 0.3 else self.tmp / f"gsm8k{i}.jsonl"
        if not path.exists():
            path.write_text(text, encoding="utf-8")
        val = str(self.rng.choice([0, 1, 2, 5]))
        self.invoke("data", "gsm8k", str(path), "-o", f"{self.tmp}/data{i}", "--validation", val)

    def plot_round(self, i: int) -> None:
        run = self.tmp / f"run{i}"
        run.mkdir()
        rows = [{"step": s, "reward": 0.1 * s, "policy_loss": 0.5, "eval/accuracy": 0.2} for s in range(1, 4)]
        for _ in range(self.rng.choice([1, 2])):
            row = self.rng.choice(rows)
            row[self.rng.choice([*row, "kl"])] = self.rng.choice(ODD_VALUES)
        text = "\n".join(json.dumps(r, default=str) for r in rows)
        (run / "metrics.jsonl").write_text(text, encoding="utf-8")
        if self.rng.random() < 0.3:
            self._garbled(f"run{i}/metrics.jsonl", text)
        self.invoke("plot", str(run), "-o", f"{self.tmp}/curves{i}.png")

    def run(self, inputs: int) -> int:
        """Rounds (most of them specs) until `inputs` commands ran; returns how many did."""
        self.invoke("schema")
        kinds = [self.spec_round] * 14 + [self.areal_round] * 4 + [self.data_round] * 2 + [self.plot_round]
        i = 0
        while self.count < inputs:
            self.rng.choice(kinds)(i)
            i += 1
        return self.count


def fresh_seed() -> int:
    return int(os.environ.get("RLC_FUZZ_SEED") or random.SystemRandom().randrange(2**32))


def test_a_fresh_seed_never_crashes_a_command(tmp_path, monkeypatch):
    """A few hundred inputs through every command; the seed is printed in the failure message."""
    monkeypatch.chdir(tmp_path)  # `plan` and `compile` write under build/ by default
    seed = fresh_seed()
    print(f"fuzz seed {seed}")
    assert Fuzzer(seed, tmp_path).run(260) >= 260


@pytest.mark.parametrize("seed", [0, 1])
def test_fixed_seeds_never_crash_a_command(seed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Fuzzer(seed, tmp_path).run(60)


if __name__ == "__main__":  # a longer run: python tests/compiler/test_cli_fuzz.py SEED INPUTS
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)
        print(Fuzzer(int(sys.argv[1]), Path(d)).run(int(sys.argv[2])), "commands")
