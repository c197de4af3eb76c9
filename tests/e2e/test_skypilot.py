"""The SkyPilot task: SkyPilot's own parser accepts it, and its scripts take the right branch with nothing injected."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_rlc
from ruamel.yaml import YAML


def _compile(spec, out) -> dict:
    result = run_rlc("compile", str(spec), "-o", str(out), env={"WANDB_API_KEY": "x"})
    assert result.returncode == 0, result.stderr
    return YAML(typ="safe").load((out / "sky.yaml").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_skypilot_parses_the_task(tmp_path, sky_python, example):
    out = tmp_path / "out"
    task = _compile(EXAMPLES / example, out)
    code = (
        "import json, sys, sky; t = sky.Task.from_yaml(sys.argv[1]); r = list(t.resources)[0];"
        "print(json.dumps({'num_nodes': t.num_nodes, 'acc': r.accelerators, 'envs': t.envs, "
        "'secrets': str(t.to_yaml_config().get('secrets')), 'name': t.name}))"
    )
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    parsed = subprocess.run(
        [str(sky_python), "-c", code, str(out / "sky.yaml")], capture_output=True, text=True, env=env, timeout=300
    )
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    got = json.loads(parsed.stdout.strip().splitlines()[-1])
    assert got["num_nodes"] == task["num_nodes"] and got["name"] == task["name"]
    if "accelerators" in task["resources"]:
        name, count = task["resources"]["accelerators"].split(":")
        assert got["acc"] == {name: int(count)}
    for name in task.get("secrets", {}):  # by name only: SkyPilot reads them as secrets to supply at launch
        assert name in got["secrets"]


def _fake_bin(tmp_path: Path) -> tuple[Path, Path]:
    """`ray`, `python`, `python3` and pip that only record how they were called."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir(parents=True)
    for name in ("ray", "python", "python3"):
        path = bin_dir / name
        extra = ""
        if name == "python3":  # `python3 -m venv ~/.rlc/venv` must leave a pip behind
            extra = 'mkdir -p "$HOME/.rlc/venv/bin"; cp "$0" "$HOME/.rlc/venv/bin/pip"\n'
        if name == "ray":  # no Ray is running: `ray status` fails so the head starts one
            extra = '[ "$1" = status ] && exit 1\n'
        path.write_text(f'#!/bin/bash\nprintf "%s\\n" "$(basename "$0") $*" >> {log}\n{extra}exit 0\n')
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir, log


def _run_script(
    section: str, task: dict, tmp_path: Path, rank: int, ips: str = "10.0.0.1\n10.0.0.2"
) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir, log = _fake_bin(tmp_path / f"{section}{rank}")
    home = tmp_path / f"home{rank}"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(home),
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": ips,
        "SKYPILOT_NUM_NODES": str(task["num_nodes"]),
        "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    }
    proc = subprocess.run(
        ["bash", "-c", task[section]], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    calls = log.read_text().splitlines() if log.exists() else []
    return proc, calls


def test_head_and_worker_branches(tmp_path):
    task = _compile(EXAMPLES / "gsm8k-grpo-2node.yaml", tmp_path / "out")
    head, calls = _run_script("run", task, tmp_path, 0)
    assert head.returncode == 0, head.stderr
    assert any(
        c.startswith("python -m rlc.runtime hold-sigterm ray start --head --node-ip-address 10.0.0.1 --port 6479")
        and "--num-gpus 8" in c
        for c in calls
    )
    assert (
        "python -m rlc.runtime wait-cluster --address 10.0.0.1:6479 --nodes 2 --devices 16 --kind GPU --timeout 600 "
        "--expect-ips 10.0.0.1,10.0.0.2"
    ) in calls
    assert any(
        c.startswith("python -m rlc.runtime run ") and c.endswith("/.rlc/jobs/gsm8k-grpo-2node/resolved.yaml")
        for c in calls
    )
    worker, calls = _run_script("run", task, tmp_path, 1)
    assert worker.returncode == 0, worker.stderr
    hold = "python -m rlc.runtime hold-sigterm "  # Ray's processes outlive a SIGTERM to every process (the save)
    assert calls == [hold + "ray start --address 10.0.0.1:6479 --disable-usage-stats --num-gpus 8"]


def test_setup_writes_the_compiled_job_on_every_node(tmp_path):
    out = tmp_path / "out"
    task = _compile(EXAMPLES / "gsm8k-grpo-8xh100.yaml", out)
    proc, calls = _run_script("setup", task, tmp_path, 1)
    assert proc.returncode == 0, proc.stderr
    job = tmp_path / "home1" / ".rlc" / "jobs" / "gsm8k-grpo-1node"
    assert (job / "resolved.yaml").read_text() == (out / "resolved.yaml").read_text()
    assert (job / "plan.json").read_text() == (out / "plan.json").read_text()
    assert "pip install --upgrade rlc[runtime,vllm]" in calls


def test_no_value_can_run_as_a_command(tmp_path, spec_file):
    marker = tmp_path / "PWNED"
    evil = f"$(touch {marker})`touch {marker}`; touch {marker}"
    path = spec_file(f"""
        version: 1
        name: evil-job
        cluster: {{accelerator: H100, gpus_per_node: 8, num_nodes: 2}}
        launch:
          envs: {{EVIL: {json.dumps(evil)}}}
          secrets: [WANDB_API_KEY]
        trainer:
          logger: console
          run_name: {json.dumps(evil + chr(10) + "RLC_END_0000" + chr(10) + f"touch {marker}")}
          project_name: {json.dumps("'; touch " + str(marker) + "; echo '")}
          ckpt_path: {json.dumps(f'"; touch {marker}; "')}
        """)
    task = _compile(path, tmp_path / "out")
    for section, rank in (("setup", 0), ("run", 0), ("run", 1)):
        proc, _ = _run_script(section, task, tmp_path, rank)
        assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), "a spec value ran as a shell command"
    assert task["envs"]["EVIL"] == evil


def test_rlc_launch_compiles_then_calls_sky_launch(tmp_path):
    bin_dir, log = _fake_bin(tmp_path / "launch")
    sky = bin_dir / "sky"
    sky.write_text(f'#!/bin/bash\nprintf "%s\\n" "sky $*" >> {log}\nexit 0\n')
    sky.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = run_rlc(
        "launch", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), "trainer.seed=5", "--sky-arg=--yes", cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == [
        "sky launch build/gsm8k-grpo-1node/sky.yaml --cluster gsm8k-grpo-1node --yes"
    ]
    assert (tmp_path / "build" / "gsm8k-grpo-1node" / "resolved.yaml").exists()


def test_rlc_launch_without_skypilot_says_how_to_get_it(tmp_path):
    result = run_rlc("launch", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and "rlc[launch]" in result.stderr
