"""Preemption and restarts in the launch files: a spot job is a SkyPilot managed job with its checkpoints on a
bucket, a RayJob retries with its checkpoints on a volume claim and gives its pods the grace period, and a Slurm job
requeues itself with a save before its time limit. (The real parsers read these files in tests/e2e/test_launch_property
.py and tests/e2e/test_skypilot.py; the runtime's side of a signal is tests/runtime/test_faults.py.)"""

from __future__ import annotations

from pathlib import Path

from conftest import EXAMPLES
from rlc.compiler.emit import build
from rlc.compiler.pipeline import compile_job
from rlc.compiler.targets import target
from rlc.core.overrides import parse_override
from ruamel.yaml import YAML

GPU = (EXAMPLES / "gsm8k-grpo-8xh100.yaml").read_text()


def _compiled(tmp_path: Path, extra: list[str], name: str):
    path = tmp_path / "spec.yaml"
    path.write_text(GPU)
    result = compile_job(path, [parse_override(o) for o in extra], env={"WANDB_API_KEY": "x"})
    assert result.ok, [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    return build(result, (target(name),), str(tmp_path / "out"))


def test_spot_nodes_make_a_managed_job_with_its_checkpoints_on_the_bucket(tmp_path):
    spot = ["cluster.use_spot=true", "launch.checkpoint_bucket=s3://bucket/run", "trainer.ckpt_path=/ckpts/run"]
    compiled = _compiled(tmp_path, [*spot, "launch.recovery.max_restarts_on_errors=3"], "skypilot")
    task = YAML(typ="safe").load(compiled.files["sky.yaml"])
    assert task["resources"]["use_spot"] is True
    assert task["resources"]["job_recovery"] == {"max_restarts_on_errors": 3}
    assert task["file_mounts"] == {"/ckpts/run": {"source": "s3://bucket/run", "mode": "MOUNT_CACHED"}}
    how = target("skypilot").launch(tmp_path / "out", compiled.job)
    assert how.argv[:3] == ["sky", "jobs", "launch"] and how.argv[-2:] == ["--name", compiled.name]
    # asked for without spot nodes too, with SkyPilot's strategy; and off: `sky launch` as before
    on = _compiled(tmp_path, ["launch.recovery.managed=true", "launch.recovery.strategy=EAGER_NEXT_REGION"], "skypilot")
    recovery = YAML(typ="safe").load(on.files["sky.yaml"])["resources"]["job_recovery"]
    assert recovery == {"max_restarts_on_errors": 0, "strategy": "EAGER_NEXT_REGION"}
    off = _compiled(tmp_path, [], "skypilot")
    assert "job_recovery" not in YAML(typ="safe").load(off.files["sky.yaml"])["resources"]
    assert target("skypilot").launch(tmp_path / "out", off.job).argv[:2] == ["sky", "launch"]


def test_a_rayjob_retries_with_its_checkpoints_on_a_claim_and_gives_pods_the_grace_period(tmp_path):
    extra = [
        "cluster.num_nodes=2",
        "launch.kuberay.checkpoint_volume_claim=ckpts",
        "trainer.ckpt_path=/ckpts",
        "launch.recovery.max_restarts_on_errors=2",
        "launch.grace_period_s=300",
    ]
    compiled = _compiled(tmp_path, extra, "kuberay")
    job = next(d for d in YAML(typ="safe").load_all(compiled.files["kuberay/rayjob.yaml"]) if d["kind"] == "RayJob")
    assert job["spec"]["backoffLimit"] == 2
    cluster = job["spec"]["rayClusterSpec"]
    for pod in (cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]):
        assert pod["terminationGracePeriodSeconds"] == 300
        assert {"name": "rlc-checkpoints", "persistentVolumeClaim": {"claimName": "ckpts"}} in pod["volumes"]
        assert {"name": "rlc-checkpoints", "mountPath": "/ckpts"} in pod["containers"][0]["volumeMounts"]


def test_a_slurm_job_requeues_itself_and_saves_before_its_time_limit(tmp_path):
    script = _compiled(tmp_path, ["launch.grace_period_s=240"], "slurm").files["slurm/job.sbatch"]
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@240" in script
    assert "scontrol requeue" in script and "trap 'rlc_save_then requeue" in script
    off = _compiled(tmp_path, ["launch.slurm.requeue=false"], "slurm").files["slurm/job.sbatch"]
    assert "--requeue" not in off and "--signal" not in off and "rlc_save_then requeue" not in off
    assert "trap 'rlc_save_then 143 SIGTERM' TERM" in off  # scancel: a save, then the job ends


def _codes(tmp_path: Path, extra: list[str]) -> set[str]:
    path = tmp_path / "spec.yaml"
    path.write_text(GPU)
    result = compile_job(path, [parse_override(o) for o in extra], env={"WANDB_API_KEY": "x"})
    return {d.code for d in result.diagnostics}


def test_checkpoints_on_disks_a_restart_or_another_node_cannot_see_are_warned(tmp_path):
    assert "RLC-W971" in _codes(tmp_path, ["cluster.use_spot=true"])  # a managed job's new nodes
    assert "RLC-W971" in _codes(tmp_path, ["cluster.num_nodes=2"])  # shards split across nodes
    assert "RLC-W971" not in _codes(tmp_path, ["cluster.num_nodes=2", "launch.checkpoint_bucket=gs://b"])
    assert "RLC-W971" in _codes(tmp_path, ["launch.target=kuberay", "launch.recovery.max_restarts_on_errors=1"])
    slurm = ["launch.target=slurm", "cluster.num_nodes=2"]
    assert "RLC-W971" in _codes(tmp_path, [*slurm, "trainer.ckpt_path=/tmp/ckpts"])
    assert "RLC-W971" not in _codes(tmp_path, [*slurm, "trainer.ckpt_path=/shared/ckpts"])
    assert "RLC-W970" in _codes(tmp_path, ["cluster.use_spot=true", "launch.recovery.managed=false"])
