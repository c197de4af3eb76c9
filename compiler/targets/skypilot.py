"""SkyPilot: sky.yaml, a task that provisions the nodes, starts Ray on each and runs the job on the head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlc.compiler.targets.base import (
    Launch,
    TargetInput,
    heredoc_end,
    install_requirements,
    job_dir,
    job_envs,
    node_context,
    render,
    setup_line,
)
from rlc.compiler.trainers import TRAIN_SCRIPT


class SkyPilot:
    name = "skypilot"
    summary = "sky.yaml: a SkyPilot task that provisions the nodes and starts the job; `rlc launch` runs `sky launch`"

    def files(self, job: TargetInput) -> dict[str, str]:
        return {"sky.yaml": task(job)}

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        if managed(job.spec):  # SkyPilot restarts it after a preemption, on new nodes, from its checkpoints
            argv = ["sky", "jobs", "launch", str(out_dir / "sky.yaml"), "--name", job.spec.name]
        else:
            argv = ["sky", "launch", str(out_dir / "sky.yaml"), "--cluster", job.spec.name]
        return Launch(
            argv,
            needs="sky",
            install_hint="install it with `pip install 'rlc[launch]'` (in its own environment: SkyPilot pins "
            "click < 8.2) or run `sky launch` on the compiled sky.yaml",
        )


def managed(spec) -> bool:
    """A SkyPilot managed job: asked for in launch.recovery.managed, else whenever the nodes are spot instances."""
    asked = spec.launch.recovery.managed
    return spec.cluster.use_spot if asked is None else asked


def checkpoint_mounts(spec) -> dict[str, dict[str, str]]:
    """launch.checkpoint_bucket mounted at trainer.ckpt_path, in SkyPilot's file_mounts syntax (MOUNT_CACHED: writes
    go to the local disk first and are uploaded behind, which suits checkpoints)."""
    if not spec.launch.checkpoint_bucket:
        return {}
    path = str(spec.trainer.ckpt_path).rstrip("/") or "/"
    return {path: {"source": spec.launch.checkpoint_bucket, "mode": "MOUNT_CACHED"}}


def task(job: TargetInput) -> str:
    spec, plan = job.spec, job.plan
    c = spec.cluster
    resources: list[tuple[str, Any]] = []
    if c.infra:
        resources.append(("infra", c.infra))
    if c.accelerator != "none":
        resources.append(("accelerators", f"{c.accelerator}:{plan['cluster']['gpus_per_node']}"))
    if c.cpus_per_node is not None:
        resources.append(("cpus", str(c.cpus_per_node)))
    elif c.accelerator == "none":
        resources.append(("cpus", f"{plan['cluster']['gpus_per_node']}+"))
    for key, value in (
        ("memory", c.memory_per_node),
        ("instance_type", c.instance_type),
        ("disk_size", c.disk_size),
        ("disk_tier", c.disk_tier),
        ("network_tier", c.network_tier),
    ):
        if value is not None:
            resources.append((key, str(value) if key == "memory" else value))
    if c.use_spot:
        resources.append(("use_spot", True))
    if managed(spec):  # what SkyPilot's managed job does after a failure that is not a preemption, and where to
        recovery = spec.launch.recovery
        job_recovery: dict[str, Any] = {"max_restarts_on_errors": recovery.max_restarts_on_errors}
        if recovery.strategy:
            job_recovery["strategy"] = recovery.strategy
        resources.append(("job_recovery", job_recovery))
    if c.image:
        resources.append(("image_id", f"docker:{c.image}"))
    if spec.launch.ports:
        resources.append(("ports", sorted(spec.launch.ports)))
    node = render("node_start.sh.j2", **node_context(spec, plan))
    resolved, plan_text = job.files["resolved.yaml"], job.files["plan.json"]
    return render(
        "sky.yaml.j2",
        source=job.source,
        digest=job.digest,
        # The comment's launch command names the default output directory, whatever -o said.
        task_path=f"build/{spec.name}/sky.yaml",
        name=spec.name,
        nodes=plan["cluster"]["nodes"],
        resources=resources,
        workdir=spec.launch.workdir,
        file_mounts=checkpoint_mounts(spec),
        managed=managed(spec),
        envs=sorted((k, str(v)) for k, v in job_envs(spec).items()),
        secrets=sorted(spec.launch.secrets),
        install=install_requirements(spec, plan),
        job_dir=job_dir(spec),
        resolved=resolved.rstrip("\n"),
        plan=plan_text.rstrip("\n"),
        train_script=job.files.get(TRAIN_SCRIPT, "").rstrip("\n"),
        setup=[setup_line(line) for line in spec.launch.setup],
        node_script=node.rstrip("\n"),
        eof=heredoc_end(job.digest, resolved + plan_text + job.files.get(TRAIN_SCRIPT, "")),
    )
