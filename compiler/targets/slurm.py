"""The Slurm target: slurm/job.sbatch, a batch script sized from the plan that starts Ray with srun and trains.

Every value on an `#SBATCH` line is one option to sbatch: the spec's patterns keep whitespace, quotes, '#' and
newlines out of names, and free text (an option's value, the working directory) is quoted the way sbatch reads it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from rlc.compiler.targets.base import (
    Launch,
    TargetInput,
    heredoc_end,
    install_requirements,
    job_envs,
    node_context,
    render,
    setup_line,
    train_line,
)
from rlc.compiler.trainers import TRAIN_SCRIPT
from rlc.spec.root import RlcSpec

SCRIPT = "slurm/job.sbatch"
_PLAIN = re.compile(r"[A-Za-z0-9_.,:+=@%/&|*()\[\]^~-]+")


def sbatch_word(value: object) -> str | None:
    """`value` as one argument on an `#SBATCH` line (sbatch groups quoted text and takes a backslash as an escape);
    None for text no such line can carry (a newline or another control character)."""
    text = str(value)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return None
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def amount(value: int | str) -> float | None:
    """A cluster size (N, or N+ for 'at least N') as a positive number; None when it is not one."""
    try:
        number = float(str(value).strip().removesuffix("+"))
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def sbatch_lines(spec: RlcSpec, plan: dict) -> list[str]:
    """The `#SBATCH` lines after --job-name, --nodes and --ntasks-per-node, in a fixed order. A value Slurm cannot
    take (the compiler refuses it for launch.target slurm) is left out with a comment saying so."""
    cluster, slurm = spec.cluster, spec.launch.slurm
    per_node, device = plan["cluster"]["gpus_per_node"], plan["cluster"]["device"]
    lines: list[str] = []

    def add(option: str, key: str | None = None, value: object = None, text: str | None = "") -> None:
        if text is None:
            lines.append(
                f"# rlc: {key} = {json.dumps(str(value))} cannot be written here; {option.rstrip('=')} left out"
            )
        else:
            lines.append(f"#SBATCH {option}{text}")

    if cluster.cpus_per_node is not None:  # Slurm allocates whole CPUs: "at least 2.5" is 3
        cpus = amount(cluster.cpus_per_node)
        count = None if cpus is None else str(math.ceil(cpus))
        add("--cpus-per-task=", "cluster.cpus_per_node", cluster.cpus_per_node, count)
    elif device == "CPU":  # a CPU-only run's slots are CPUs
        add(f"--cpus-per-task={per_node}")
    if device == "GPU":
        gpus = f"{slurm.gpu_type}:{per_node}" if slurm.gpu_type else str(per_node)
        add(f"--gres=gpu:{gpus}" if slurm.gpu_request == "gres" else f"--gpus-per-node={gpus}")
    if cluster.memory_per_node is not None:
        gb = amount(cluster.memory_per_node)
        mem = None if gb is None else f"{int(gb)}G" if gb == int(gb) else f"{math.ceil(gb * 1024)}M"
        add("--mem=", "cluster.memory_per_node", cluster.memory_per_node, mem)
    for flag, key in (("time", "time_limit"), *((k, k) for k in ("partition", "account", "qos", "constraint"))):
        value = getattr(slurm, key)
        if value is not None:
            add(f"--{flag}=", f"launch.slurm.{key}", value, sbatch_word(value))
    if slurm.requeue:  # back to the queue when preempted; before the time limit, the batch shell saves and requeues
        add("--requeue")
        add(f"--signal=B:USR1@{spec.launch.grace_period_s}")
        add("--open-mode=append")  # a requeued run's output follows the earlier one's
    if spec.launch.workdir not in (None, "."):
        add("--chdir=", "launch.workdir", spec.launch.workdir, sbatch_word(spec.launch.workdir))
    for i, option in enumerate(slurm.sbatch_args):
        name, eq, value = option.partition("=")
        add(f"{name}=" if eq else name, f"launch.slurm.sbatch_args[{i}]", option, sbatch_word(value) if eq else "")
    return lines


class Slurm:
    name = "slurm"
    summary = (
        "slurm/job.sbatch: a batch script that starts Ray on its nodes with srun; `rlc launch` runs `sbatch` on it"
    )

    def files(self, job: TargetInput) -> dict[str, str]:
        spec = job.spec
        node = node_context(spec, job.plan)
        setup = [setup_line(line) for line in spec.launch.setup]
        resolved, plan = job.files["resolved.yaml"].rstrip("\n"), job.files["plan.json"].rstrip("\n")
        train = job.files.get(TRAIN_SCRIPT, "").rstrip("\n")
        ctx = {
            **node,
            "source": job.source,
            "digest": job.digest,
            "script_path": f"build/{spec.name}/{SCRIPT}",  # as sky.yaml names itself: the bytes stay the same
            "name": spec.name,
            "sbatch_lines": sbatch_lines(spec, job.plan),
            "envs": sorted((k, str(v)) for k, v in job_envs(spec).items()),
            "secrets": sorted(spec.launch.secrets),
            "setup": setup,
            "resolved": resolved,
            "plan": plan,
            "train_script": train,
            "train": train_line(spec, "$RLC_JOB_DIR", python="python3"),
            "install": install_requirements(spec, job.plan),
            "requeue": spec.launch.slurm.requeue,
            "grace": spec.launch.grace_period_s,
            "eof": heredoc_end(job.digest, "\n".join([resolved, plan, train, *setup])),
        }
        return {SCRIPT: render("slurm.sbatch.j2", **ctx)}

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        return Launch(
            argv=["sbatch", str(out_dir / SCRIPT)],
            needs="sbatch",
            install_hint="run `rlc launch` on a machine with Slurm's client commands (a login node), or copy "
            f"{out_dir}/ there and run `sbatch {out_dir / SCRIPT}`",
        )
