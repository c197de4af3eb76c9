"""`rlc compile`: resolved.yaml and plan.json, loaded back by the runtime's own loader; determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import EXAMPLES, run_rlc


def _compile(spec, out, *overrides, cwd=None, env=None):
    result = run_rlc("compile", str(spec), *overrides, "-o", str(out), cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    return out


def _check(resolved):
    return subprocess.run([sys.executable, "-m", "rlc.runtime", "check", str(resolved)], capture_output=True, text=True)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_compile_and_the_runtime_loads_them(tmp_path, example):
    out = _compile(EXAMPLES / example, tmp_path / "out", env={"WANDB_API_KEY": "x"})
    resolved = (out / "resolved.yaml").read_text()
    assert resolved.startswith("# rlc resolved config") and "# content-hash: sha256:" in resolved
    plan = json.loads((out / "plan.json").read_text())
    assert plan["format"] == "rlc-plan" and plan["content_hash"] in resolved
    check = _check(out / "resolved.yaml")
    assert check.returncode == 0, check.stderr


def test_every_value_is_explicit_with_its_provenance(tmp_path):
    out = _compile(EXAMPLES / "gsm8k-grpo-2node.yaml", tmp_path / "out", "trainer.seed=3")
    text = (out / "resolved.yaml").read_text()
    assert "num_engines: 8  # derived from cluster.gpus_per_node, cluster.num_nodes" in text
    assert "seed: 3  # override trainer.seed=3" in text
    assert "train_batch_size: 1024  # spec gsm8k-grpo-2node.yaml:" in text
    assert "eval_interval: 5  # default" in text
    assert "str(tmp_path)" not in text and "/examples/" not in text


def test_a_hand_edited_resolved_config_is_refused(tmp_path):
    out = _compile(EXAMPLES / "gsm8k-grpo-8xh100.yaml", tmp_path / "out")
    path = out / "resolved.yaml"
    path.write_text(path.read_text().replace("train_batch_size: 1024", "train_batch_size: 512"))
    check = _check(path)
    assert check.returncode == 1 and "edited after compiling" in check.stderr


def test_compile_is_deterministic_across_directories_and_hash_seeds(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    (tmp_path / "elsewhere").mkdir()
    _compile(EXAMPLES / "gsm8k-grpo-2node.yaml", a, env={"PYTHONHASHSEED": "1"})
    rel = os.path.relpath(EXAMPLES / "gsm8k-grpo-2node.yaml", tmp_path / "elsewhere")
    _compile(rel, b, cwd=tmp_path / "elsewhere", env={"PYTHONHASHSEED": "4242"})
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert {
        "resolved.yaml",
        "plan.json",
        "sky.yaml",
        "ray/submit.sh",
        "ray/runtime_env.yaml",
        "kuberay/rayjob.yaml",
        "slurm/job.sbatch",
    } <= set(names)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_a_legacy_file_and_its_migration_resolve_to_the_same_job(tmp_path):
    migrated = tmp_path / "migrated.yaml"
    assert run_rlc("migrate", str(EXAMPLES / "legacy-skyrl.yaml"), "-o", str(migrated)).returncode == 0
    a = _compile(EXAMPLES / "legacy-skyrl.yaml", tmp_path / "a")
    b = _compile(migrated, tmp_path / "b")
    assert json.loads((a / "plan.json").read_text()) == json.loads((b / "plan.json").read_text())


def test_compile_refuses_an_invalid_spec_and_writes_nothing(tmp_path, spec_file):
    path = spec_file("version: 1\ntrainer: {train_batch_size: 1000}\n")
    result = run_rlc("compile", str(path), "-o", str(tmp_path / "out"))
    assert result.returncode == 1 and "RLC-E105" in result.stderr
    assert not (tmp_path / "out").exists()
