"""Every launch target runs the spec's trainer: rlc's runtime as before, or train.sh, the command of SkyRL's (or
verl's) trainer that rlc writes from the resolved spec, which each target carries to the head and runs there, after
installing that trainer's release. The commands themselves are checked by the trainers' own config code in
tests/compiler/test_skyrl_trainer.py and tests/compiler/test_verl_trainer.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_rlc
from rlc.compiler.trainers import TRAINERS
from rlc.spec.launch import TRAINER_NAMES
from ruamel.yaml import YAML

SCRIPT = ROOT / "tests" / "fixtures" / "skyrl-scripts" / "examples" / "train" / "gsm8k" / "run_gsm8k.sh"


def test_the_registry_names_the_trainers_the_spec_accepts():
    assert tuple(t.name for t in TRAINERS) == TRAINER_NAMES[: len(TRAINERS)]
    assert {t.name for t in TRAINERS} == set(TRAINER_NAMES)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """SkyRL's own gsm8k script, kept on SkyRL's trainer (`rlc migrate --trainer skyrl`), compiled for every target."""
    tmp = tmp_path_factory.mktemp("trainer")
    spec = tmp / "job.yaml"
    migrated = run_rlc("migrate", str(SCRIPT), "--trainer", "skyrl", "-o", str(spec))
    assert migrated.returncode == 0, migrated.stderr
    assert "trainer: skyrl" in spec.read_text()
    out = tmp / "out"
    done = run_rlc("compile", str(spec), "--target", "all", "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


def test_train_sh_runs_skyrls_entrypoint_with_the_resolved_values(compiled):
    script = (compiled / "train.sh").read_text()
    assert "exec python3 -m skyrl.train.entrypoints.main_base \\\n" in script
    assert "trainer.placement.policy_num_gpus_per_node=4" in script  # rlc's derived placement, written out
    assert subprocess.run(["bash", "-n", str(compiled / "train.sh")]).returncode == 0


def test_every_target_carries_train_sh_and_runs_it_on_the_head(compiled):
    train = (compiled / "train.sh").read_text()
    sky = YAML(typ="safe").load((compiled / "sky.yaml").read_text())
    assert "pip install --upgrade rlc 'skyrl[fsdp]==0.4.0'" in sky["setup"]
    assert sky["setup"].count(train.rstrip("\n")) == 1
    assert 'bash "$RLC_JOB_DIR/train.sh"' in sky["run"] and "rlc.runtime run" not in sky["run"]

    sbatch = (compiled / "slurm" / "job.sbatch").read_text()
    assert train.rstrip("\n") in sbatch and 'bash "$RLC_JOB_DIR/train.sh" &' in sbatch
    assert "import ray, rlc.runtime.cluster_gate, skyrl" in sbatch
    assert subprocess.run(["bash", "-n", str(compiled / "slurm" / "job.sbatch")]).returncode == 0

    docs = {d["kind"]: d for d in YAML(typ="safe").load_all((compiled / "kuberay" / "rayjob.yaml").read_text())}
    assert docs["ConfigMap"]["data"]["train.sh"] == train
    assert docs["RayJob"]["spec"]["entrypoint"] == 'bash "/rlc/job/train.sh"'
    runtime_env = json.loads(docs["RayJob"]["spec"]["runtimeEnvYAML"])
    assert runtime_env["pip"] == ["rlc", "skyrl[fsdp]==0.4.0"]

    submit = (compiled / "ray" / "submit.sh").read_text()
    assert "-- bash train.sh" in submit and "rlc.runtime" not in submit


def test_plan_and_explain_name_the_trainer(compiled, tmp_path):
    spec = compiled.parent / "job.yaml"
    plan = run_rlc("plan", str(spec), "--svg", str(tmp_path / "p.svg"))
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines()[0].startswith("trainer: skyrl 0.4.0 (")
    explained = run_rlc("explain", "launch.trainer")
    for t in TRAINERS:
        assert f"    {t.name:<6} {t.release or '-':<6} {t.summary}" in explained.stdout


def test_launch_local_runs_train_sh(compiled):
    from rlc.compiler.emit import build
    from rlc.compiler.pipeline import compile_job
    from rlc.compiler.targets import target

    result = compile_job(compiled.parent / "job.yaml")
    assert result.ok
    job = build(result, (target("local"),), str(compiled)).job
    assert target("local").launch(compiled, job).argv == ["bash", str(compiled / "train.sh")]
