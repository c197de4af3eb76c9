"""slurm/job.sbatch: sized from the plan, every value one quoted option, bad values refused in the spec.

tests/e2e/test_slurm.py runs the script on a real Slurm; these tests read what the compiler writes.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from conftest import EXAMPLES, run_rlc


def _script(tmp_path, example, *extra, env=None) -> tuple[str, object]:
    out = tmp_path / "out"
    result = run_rlc("compile", str(EXAMPLES / example), "-o", str(out), "--target", "slurm", *extra, env=env)
    assert result.returncode == 0, result.stderr
    assert not (out / "sky.yaml").exists()  # --target writes only what was asked
    text = (out / "slurm" / "job.sbatch").read_text()
    syntax = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    return text, out


def _sbatch_lines(text: str) -> list[str]:
    """The options sbatch reads: `#SBATCH` lines before the first command."""
    lines = []
    for line in text.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            lines.append(line.removeprefix("#SBATCH "))
    return lines


def test_the_script_is_sized_from_the_plan_with_every_slurm_setting(tmp_path):
    text, out = _script(
        tmp_path,
        "gsm8k-grpo-2node.yaml",
        "cluster.cpus_per_node=30.5+",
        "cluster.memory_per_node=256",
        "launch.slurm.partition=gpu,gpu-long",
        "launch.slurm.account=rl-lab",
        "launch.slurm.qos=high",
        "launch.slurm.time_limit=1-12:00:00",
        "launch.slurm.constraint='[rack1|rack2]&ib'",
        "launch.slurm.gpu_type=h100",
        "launch.slurm.gpu_request=gpus-per-node",
        "launch.slurm.sbatch_args=[--exclusive, --mail-type=END]",
        env={"WANDB_API_KEY": "secret-value-x"},
    )
    plan = json.loads((out / "plan.json").read_text())
    assert plan["cluster"]["nodes"] == 2 and plan["cluster"]["gpus_per_node"] == 8
    assert _sbatch_lines(text) == [
        "--job-name=gsm8k-grpo-2node",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=31",
        "--gpus-per-node=h100:8",
        "--mem=256G",
        "--time=1-12:00:00",
        "--partition=gpu,gpu-long",
        "--account=rl-lab",
        "--qos=high",
        "--constraint=[rack1|rack2]&ib",
        "--requeue",
        "--signal=B:USR1@120",
        "--open-mode=append",
        "--exclusive",
        "--mail-type=END",
    ]
    assert "RLC_NODES=2\n" in text and "RLC_DEVICES=16\n" in text and "RLC_DEVICE_KIND=GPU\n" in text
    assert "for rlc_secret in HF_TOKEN WANDB_API_KEY; do" in text and "secret-value-x" not in text
    # The compiled job travels inside the script, byte for byte.
    for name in ("resolved.yaml", "plan.json"):
        body = re.search(rf"cat > \"\$RLC_STAGE/{re.escape(name)}\" <<'(\w+)'\n(.*?)\n\1\n", text, re.S)
        assert body and body.group(2) + "\n" == (out / name).read_text()


def test_defaults_ask_for_gres_gpus_and_cpu_slots(tmp_path):
    text, _ = _script(tmp_path, "gsm8k-grpo-8xh100.yaml", "launch.slurm.time_limit=90")
    requeue = ["--requeue", "--signal=B:USR1@120", "--open-mode=append"]
    assert _sbatch_lines(text)[1:] == ["--nodes=1", "--ntasks-per-node=1", "--gres=gpu:8", "--time=90", *requeue]
    text, _ = _script(
        tmp_path,
        "local-cpu.yaml",
        "cluster.gpus_per_node=2",
        "trainer.micro_train_batch_size_per_gpu=64",
        "trainer.micro_forward_batch_size_per_gpu=64",
        "cluster.memory_per_node='7.5+'",
    )
    assert _sbatch_lines(text)[1:] == ["--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=2", "--mem=7680M", *requeue]
    assert "--num-cpus" in text and "--gres" not in text


def test_free_text_is_quoted_the_way_sbatch_reads_it(tmp_path):
    text, _ = _script(
        tmp_path,
        "local-cpu.yaml",
        "launch.workdir=my project",
        """launch.slurm.sbatch_args=['--comment=it''s "q" # $HOME \\ x']""",
        "launch.envs={GREETING: \"$(touch /tmp/pwned) 'hi'\"}",
    )
    assert _sbatch_lines(text)[-2:] == ['--chdir="my project"', '--comment="it\'s \\"q\\" # $HOME \\\\ x"']
    assert "export GREETING='$(touch /tmp/pwned) '\"'\"'hi'\"'\"''\n" in text


def test_a_size_in_skypilots_units_reaches_sbatch_as_slurm_reads_it(tmp_path):
    """SkyPilot's `64GB` (2**30 bytes a GB) is Slurm's --mem=64G; a size no launcher reads is refused for every target
    (RLC-E921), not left out of one file."""
    text, _ = _script(tmp_path, "gsm8k-grpo-8xh100.yaml", "cluster.memory_per_node=512MB", "cluster.cpus_per_node=16+")
    assert _sbatch_lines(text)[3:6] == ["--cpus-per-task=16", "--gres=gpu:8", "--mem=512M"]
    result = run_rlc(
        "compile", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), "-o", str(tmp_path / "o"), "cluster.cpus_per_node=lots"
    )
    assert result.returncode == 1 and "RLC-E921" in result.stderr


@pytest.mark.parametrize(
    "override, key",
    [
        ("launch.slurm.partition=gpu;reboot", "launch.slurm.partition"),
        ("launch.slurm.partition=gpu debug", "launch.slurm.partition"),
        ('launch.slurm.account="a\\nb"', "launch.slurm.account"),
        ("launch.slurm.qos='a\"b'", "launch.slurm.qos"),
        ("launch.slurm.constraint=a b", "launch.slurm.constraint"),
        ("launch.slurm.time_limit=90 min", "launch.slurm.time_limit"),
        ("launch.slurm.time_limit=1:2:3:4", "launch.slurm.time_limit"),
        ("launch.slurm.time_limit=1-:30", "launch.slurm.time_limit"),
        ("launch.slurm.gpu_type=a100 x", "launch.slurm.gpu_type"),
        ("launch.slurm.sbatch_args=['-N 2']", "launch.slurm.sbatch_args[0]"),
        ('launch.slurm.sbatch_args=["--comment=a\\nrm -rf ~"]', "launch.slurm.sbatch_args[0]"),
        ("launch.slurm.sbatch_args=['--nodes 2']", "launch.slurm.sbatch_args[0]"),
    ],
)
def test_a_value_that_could_break_out_of_its_sbatch_line_is_refused(tmp_path, override, key):
    result = run_rlc("compile", str(EXAMPLES / "local-cpu.yaml"), "-o", str(tmp_path / "out"), override)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "RLC-E013" in result.stderr and key in result.stderr, result.stderr
    assert "names are letters, digits and '_'" not in result.stderr  # the hint is the field's own
    assert not (tmp_path / "out").exists()


def test_launch_without_sbatch_is_a_usage_error(tmp_path):
    result = run_rlc(
        "launch", str(EXAMPLES / "local-cpu.yaml"), "-o", str(tmp_path / "out"), "launch.target=slurm", env={"PATH": ""}
    )
    assert result.returncode == 2, result.stderr
    assert "`sbatch` command is not on PATH" in result.stderr and "login node" in result.stderr


@pytest.mark.parametrize(
    "extra, refused",
    [
        (["launch.slurm.partition=gpu", "launch.slurm.sbatch_args=[--part=debug]"], "--partition"),
        (["launch.slurm.sbatch_args=[--gpus=4]"], "--gpus"),
        (["launch.slurm.sbatch_args=['--node=3']"], "--nodes"),
        (
            ["launch.slurm.sbatch_args=[--mem=0, --nodelist=n1]"],
            None,
        ),  # rlc writes no --mem here; --nodelist is no --nodes
        (["launch.target=skypilot", "launch.slurm.sbatch_args=[--nodes=3]"], None),  # only the slurm target checks
    ],
)
def test_sbatch_args_that_set_what_rlc_writes_are_refused(tmp_path, extra, refused):
    args = ["compile", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), "-o", str(tmp_path / "out"), "launch.target=slurm"]
    result = run_rlc(*args, *extra)
    if refused is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 1 and "RLC-E911" in result.stderr and f"writes as {refused} " in result.stderr
