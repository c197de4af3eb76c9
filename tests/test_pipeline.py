"""Every command that reads a spec goes through one pipeline, so each reports the same diagnostics, at the same
file/line/column, with the same exit code."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from rlc.compiler.cli import cli
from rlc.compiler.pipeline import compile_job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LOCAL = (EXAMPLES / "local-cpu.yaml").read_text(encoding="utf-8")
LEGACY = (EXAMPLES / "legacy-skyrl.yaml").read_text(encoding="utf-8")

FRAGMENTED = """\
version: 1
cluster: {gpus_per_node: 8, num_nodes: 2}
trainer:
  placement: {colocate_all: false, policy_num_nodes: 1, policy_num_gpus_per_node: 6,
              critic_num_nodes: 1, critic_num_gpus_per_node: 6}
  critic: {model: {path: Qwen/Qwen2.5-0.5B}}
  algorithm: {advantage_estimator: gae, use_kl_loss: false}
  train_batch_size: 96
  policy_mini_batch_size: 24
  critic_mini_batch_size: 24
generator:
  inference_engine: {tensor_parallel_size: 4, num_engines: 1}
"""

# name -> (spec text, overrides, the error code it must raise)
BROKEN = {
    "schema": (LOCAL.replace("  eval_interval: -1", "  eval_intervall: -1"), (), "RLC-E010"),
    "rule": (LOCAL.replace("policy_mini_batch_size: 16", "policy_mini_batch_size: 32"), (), "RLC-E101"),
    "placement": (FRAGMENTED, (), "RLC-E210"),
    "legacy": (LEGACY.replace("policy_mini_batch_size: 64", "policy_mini_batch_size: 512"), (), "RLC-E101"),
    "override": (LOCAL, ("trainer.policy.model.path=3",), "RLC-E011"),
}

TEXT_DIAGNOSTIC = re.compile(r"^(error|warning)\[(RLC-[A-Z0-9]+)\][^\n]*\n\s+--> ([^\n]+)$", re.M)


def _where(d: dict) -> tuple:
    return d["code"], d["file"], d["line"], d["column"]


def _from_text(stderr: str) -> list[tuple]:
    out = []
    for _, code, where in TEXT_DIAGNOSTIC.findall(stderr):
        parts = where.rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((code, parts[0], int(parts[1]), int(parts[2])))
        else:
            out.append((code, where, 0, 0))
    return out


@pytest.fixture
def fake_sky(tmp_path, monkeypatch):
    """`rlc launch` looks for SkyPilot's `sky` first; one that fails loudly proves a broken spec never reaches it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sky = bin_dir / "sky"
    sky.write_text("#!/bin/sh\necho sky was called >&2\nexit 42\n")
    sky.chmod(sky.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_every_command_reports_the_same_diagnostics(case, tmp_path, fake_sky, monkeypatch):
    text, overrides, code = BROKEN[case]
    spec = tmp_path / "spec.yaml"
    spec.write_text(text, encoding="utf-8")
    good = tmp_path / "good.yaml"
    good.write_text(LOCAL, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    s, ovs = str(spec), list(overrides)

    expected = sorted(_where(d.to_json()) for d in compile_job(s, [_ov(o) for o in ovs]).diagnostics)
    assert code in [c for c, *_ in expected]

    by_command = {}
    for name, args in {
        "validate": ["validate", s, *ovs, "--format", "json"],
        "plan": ["plan", s, *ovs, "--format", "json"],
        "compile": ["compile", s, *ovs, "-o", str(tmp_path / "out"), "--format", "json"],
        "diff": ["diff", s, str(good), *ovs, "--format", "json"],
    }.items():
        result = runner.invoke(cli, args)
        assert result.exit_code == 1, (name, result.output, result.exception)
        body = json.loads(result.stdout)
        assert body["ok"] is False
        by_command[name] = sorted(_where(d) for d in body["diagnostics"])
    for name in ("launch", "run"):
        result = runner.invoke(cli, [name, s, *ovs, "-o", str(tmp_path / name)])
        assert result.exit_code == 1, (name, result.output, result.exception)
        assert "sky was called" not in result.stderr and not (tmp_path / name).exists()
        by_command[name] = sorted(_from_text(result.stderr))
    for name, found in by_command.items():
        assert found == expected, name
    assert not (tmp_path / "out").exists()


def _ov(text: str):
    from rlc.core.overrides import parse_override

    return parse_override(text)


def test_validate_reports_a_placement_that_does_not_fit(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(FRAGMENTED, encoding="utf-8")
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 1
    assert "error[RLC-E210]" in result.stderr and f"{spec}:2:" in result.stderr and "valid" not in result.stdout


def test_placement_errors_keep_their_location_in_diff(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(FRAGMENTED, encoding="utf-8")
    result = CliRunner().invoke(cli, ["diff", str(spec), str(spec), "--format", "json"])
    assert result.exit_code == 1
    [d] = [d for d in json.loads(result.stdout)["diagnostics"] if d["code"] == "RLC-E210"]
    assert (d["file"], d["line"]) == (str(spec), 2)


def test_an_override_below_a_scalar_is_a_usage_error_everywhere(tmp_path, fake_sky):
    spec = tmp_path / "spec.yaml"
    spec.write_text(LOCAL, encoding="utf-8")
    bad = "trainer.strategy.x=1"
    runner = CliRunner()
    for args in (["validate", str(spec), bad], ["plan", str(spec), bad], ["compile", str(spec), bad],
                 ["diff", str(spec), str(spec), bad], ["launch", str(spec), bad], ["run", str(spec), bad]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)


def test_diff_reports_the_warnings_of_both_sides(tmp_path):
    legacy = tmp_path / "legacy.yaml"
    legacy.write_text(LEGACY, encoding="utf-8")
    result = CliRunner().invoke(cli, ["diff", str(legacy), str(legacy), "--format", "json"])
    assert result.exit_code == 0
    assert [d["code"] for d in json.loads(result.stdout)["diagnostics"]].count("RLC-W010") == 2
    text = CliRunner().invoke(cli, ["diff", str(legacy), str(legacy)], env={"NO_COLOR": "1"})
    assert text.exit_code == 0 and text.stderr.count("warning[RLC-W010]") == 2
