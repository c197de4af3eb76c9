"""Every command that reads a spec runs the same pipeline: the same findings, with the same codes and places, and
the same exit code, whichever command a user runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rlc.compiler.cli import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LEGACY = EXAMPLES / "legacy-skyrl.yaml"

# A placement that does not fit: two 6-GPU whole-node bundles leave no node room for a 4-GPU engine.
NOT_PLACED = """\
version: 1
cluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 2}
trainer:
  placement: {colocate_all: false, policy_num_nodes: 2, policy_num_gpus_per_node: 6}
  algorithm: {use_kl_loss: false}
  train_batch_size: 96
  policy_mini_batch_size: 24
generator:
  inference_engine: {tensor_parallel_size: 4, num_engines: 1}
"""

CASES = {
    "schema": ("version: 1\ntrainer:\n  train_batch_size: many\n  epocs: 3\n", []),
    "rule": ((EXAMPLES / "local-cpu.yaml").read_text(), ["trainer.policy_mini_batch_size=7"]),
    "placement": (NOT_PLACED, []),
    "legacy": (LEGACY.read_text(), ["trainer.train_batch_size=-4"]),
}


def _findings_from_json(body: dict) -> set[tuple]:
    return {(d["severity"], d["code"], d["line"], d["column"]) for d in body["diagnostics"]}


def _findings_from_text(text: str) -> set[tuple]:
    found, current = set(), None
    for line in text.splitlines():
        head = re.match(r"(error|warning)\[(RLC-\w+)\]", line)
        if head:
            current = head.groups()
            found.add((*current, None, None))
            continue
        where = re.match(r"\s+--> (.*?)(?::(\d+):(\d+))?$", line)
        if where and current:  # a place without line and column (the whole file, the command line) is 0:0, as in JSON
            found.discard((*current, None, None))
            found.add((*current, int(where.group(2) or 0), int(where.group(3) or 0)))
            current = None
    return found


def _run(args: list[str], cwd: Path):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_command_reports_the_same_findings(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, not even build/
    text, overrides = CASES[case]
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    base = _run(["validate", str(spec), *overrides, "--format", "json"], tmp_path)
    assert base.exit_code == 1, base.output
    expected = _findings_from_json(json.loads(base.output))
    assert any(sev == "error" for sev, *_ in expected), expected
    for command in (
        ["plan", str(spec), *overrides, "--format", "json"],
        ["compile", str(spec), *overrides, "--format", "json", "-o", str(tmp_path / "out")],
        ["diff", str(spec), str(EXAMPLES / "local-cpu.yaml"), *overrides, "--format", "json"],
    ):
        result = _run(command, tmp_path)
        assert result.exit_code == 1, (command[0], result.output)
        assert _findings_from_json(json.loads(result.output)) == expected, command[0]
    errors = {f for f in expected if f[0] == "error"}
    for command in (
        ["validate", str(spec), *overrides],
        ["launch", str(spec), *overrides],
        ["run", str(spec), *overrides, "-o", str(tmp_path / "out")],
    ):
        result = _run(command, tmp_path)
        assert result.exit_code == 1, (command[0], result.output)
        assert {f for f in _findings_from_text(result.stderr) if f[0] == "error"} == errors, command[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # nothing written for a spec with errors


def test_a_valid_spec_compiles_the_same_everywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = EXAMPLES / "gsm8k-grpo-2node.yaml"
    validate = _run(["validate", str(spec), "--format", "json"], tmp_path)
    plan = _run(["plan", str(spec), "--format", "json", "--svg", str(tmp_path / "p.svg")], tmp_path)
    compiled = _run(["compile", str(spec), "--format", "json", "-o", str(tmp_path / "out")], tmp_path)
    assert validate.exit_code == plan.exit_code == compiled.exit_code == 0
    assert json.loads(plan.output)["fits"] is True
    assert _findings_from_json(json.loads(validate.output)) == _findings_from_json(json.loads(compiled.output))
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["roles"] == json.loads(plan.output)["roles"]
