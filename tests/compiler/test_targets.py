"""Launch targets behind one interface: the registry is what compile, launch and explain offer, and `rlc launch`
starts the target the spec (or --target) names."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from conftest import EXAMPLES, run_rlc
from rlc.compiler.targets import TARGETS
from rlc.spec.launch import LAUNCH_TARGETS

SPEC = str(EXAMPLES / "gsm8k-grpo-8xh100.yaml")


def _fake(bin_dir: Path, name: str, log: Path) -> dict:
    """An executable `name` that records its arguments: the command rlc launch runs, seen from outside."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name} $*" >> "{log}"\n')
    tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_the_registry_names_the_targets_the_spec_accepts():
    assert tuple(t.name for t in TARGETS) == LAUNCH_TARGETS
    assert all(t.summary and "\n" not in t.summary for t in TARGETS)


def test_compile_offers_every_target_and_writes_only_the_one_asked_for(tmp_path):
    result = run_rlc("compile", "--help")
    assert f"[{'|'.join(LAUNCH_TARGETS)}|all]" in result.stdout
    out = tmp_path / "local"
    result = run_rlc("compile", SPEC, "--target", "local", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["plan.json", "resolved.yaml"]


def test_explain_launch_target_lists_every_target_with_its_summary():
    result = run_rlc("explain", "launch.target")
    assert result.returncode == 0
    for t in TARGETS:
        assert f"{t.name:<9} {t.summary}" in result.stdout


def test_launch_starts_the_spec_s_own_target(tmp_path):
    log = tmp_path / "calls.log"
    env = _fake(tmp_path / "bin", "kubectl", log)
    result = run_rlc("launch", SPEC, "launch.target=kuberay", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == ["kubectl apply -f build/gsm8k-grpo-1node/kuberay/rayjob.yaml"]
    written = sorted(str(p.relative_to(tmp_path / "build")) for p in (tmp_path / "build").rglob("*") if p.is_file())
    assert written == [f"gsm8k-grpo-1node/{f}" for f in ("kuberay/rayjob.yaml", "plan.json", "resolved.yaml")]


def test_launch_target_option_wins_over_the_spec(tmp_path):
    log = tmp_path / "calls.log"
    env = _fake(tmp_path / "bin", "kubectl", log)
    result = run_rlc("launch", SPEC, "--target", "kuberay", "-o", str(tmp_path / "job"), env=env)
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [f"kubectl apply -f {tmp_path / 'job' / 'kuberay' / 'rayjob.yaml'}"]


def test_launch_without_the_target_s_command_says_so_and_writes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_rlc("launch", SPEC, "--target", "kuberay", cwd=tmp_path, env={"PATH": str(tmp_path / "empty")})
    assert result.returncode == 2
    assert "`kubectl` command is not on PATH" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "build").exists()


def test_sky_arguments_are_refused_for_another_target(tmp_path):
    result = run_rlc("launch", SPEC, "--target", "ray", "--sky-arg=--yes", cwd=tmp_path)
    assert result.returncode == 2 and "--sky-arg is for the skypilot target" in result.stderr
    assert not (tmp_path / "build").exists()


def test_every_target_carries_the_reward_function_file_with_the_job(tmp_path):
    """env_class reward_function: the file's text travels inside resolved.yaml, which every target carries to the
    nodes (a heredoc, a ConfigMap, the submitted directory), so no node needs the user's copy."""
    source = (
        'def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0  # "$HOME" \\n\n'
    )
    (tmp_path / "my_reward.py").write_text(source)
    out = tmp_path / "out"
    overrides = ("environment.env_class=reward_function", "environment.skyrl_gym.reward_function.path=my_reward.py")
    result = run_rlc("compile", SPEC, *overrides, "--target", "all", "-o", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    resolved = (out / "resolved.yaml").read_text()
    assert _reward_source(resolved) == source
    kuberay = [d for d in yaml.safe_load_all((out / "kuberay" / "rayjob.yaml").read_text()) if d]
    [carried] = [d["data"]["resolved.yaml"] for d in kuberay if "resolved.yaml" in (d.get("data") or {})]
    assert _reward_source(carried) == source
    body = resolved.split("\n", 3)[3]  # resolved.yaml verbatim in a quoted heredoc (after its header)
    assert body in yaml.safe_load((out / "sky.yaml").read_text())["setup"]
    [sbatch] = (out / "slurm").glob("*.sbatch")
    assert body in sbatch.read_text()


def _reward_source(resolved: str) -> str:
    return yaml.safe_load(resolved)["environment"]["skyrl_gym"]["reward_function"]["source"]
