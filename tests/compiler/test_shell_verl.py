"""verl's `main_ppo` launch scripts (tests/fixtures/verl-launch-scripts, verl @1dda039) read statically: the program
and every argument come out as bash itself passed them (argv.json, recorded from bash; see the README there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlc.compiler.importers.shell import BRANCH, FROM_ENV, read_script

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "verl-launch-scripts"
BASH = json.loads((ROOT / "argv.json").read_text())
ENV = {"DEVICE": "gpu", "EXPERIMENT_NAME": "e", "HOME": "/home/user"}


def test_every_fixture_has_bashs_arguments():
    scripts = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.sh"))
    assert scripts == sorted(BASH) and len(scripts) == 14


@pytest.mark.parametrize("name", sorted(BASH))
def test_the_command_and_overrides_are_the_ones_bash_runs(name):
    launch, diags = read_script(ROOT / name, name, env=ENV).command(lambda x: "main_ppo" in x.program)
    assert launch is not None and launch.module
    assert {"program": launch.program, "args": [w.text for w in launch.args]} == BASH[name]
    assert diags == []


def test_without_the_device_the_npu_probe_is_named():
    name = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
    launch, diags = read_script(ROOT / name, name, env={"EXPERIMENT_NAME": "e"}).command()
    branch = [d for d in diags if d.code == BRANCH]
    assert launch is not None and len(branch) == 10  # batch sizes, offload, TP... differ between gpu and npu
    assert "train_batch_size is set differently by the branches of line 68" in branch[0].message
    assert all("depends on DEVICE" in d.message and d.hint.startswith("pass --env DEVICE=") for d in branch)
    launch, diags = read_script(ROOT / name, name, env={"DEVICE": "gpu", "EXPERIMENT_NAME": "e"}).command()
    assert launch is not None and [d.code for d in diags] == [FROM_ENV]  # $HOME in the data paths
