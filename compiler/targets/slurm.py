"""The Slurm target: slurm/job.sbatch, a batch script sized from the plan that starts Ray with srun and trains.

Every value on an `#SBATCH` line is one option to sbatch: the spec's patterns keep whitespace, quotes, '#' and
newlines out of names, and free text (an option's value, the working directory) is quoted the way sbatch reads it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from rlc.compiler.targets.base import Launch, TargetInput, heredoc_end, job_dir, node_context, render, setup_line

SCRIPT = "slurm/job.sbatch"
_PLAIN = re.compile(r"[A-Za-z0-9_.,:+=@%/&|*()\[\]^~-]+")


def sbatch_word(value: object) -> str:
    """`value` as one argument on an `#SBATCH` line: sbatch groups quoted text and takes a backslash as an escape."""
    text = str(value)
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ValueError(f"{text!r} has a control character, which no #SBATCH line can carry")
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _amount(value: int | str) -> float:
    """A cluster size field (N or N+, 'at least N') as a number."""
    return float(str(value).strip().rstrip("+"))


def sbatch_options(spec, plan: dict) -> list[str]:
    """The `#SBATCH` options after --job-name, --nodes and --ntasks-per-node, in a fixed order."""
    cluster, slurm = spec.cluster, spec.launch.slurm
    per_node, device = plan["cluster"]["gpus_per_node"], plan["cluster"]["device"]
    options = []
    if cluster.cpus_per_node is not None:  # Slurm allocates whole CPUs: "at least 2.5" is 3
        options.append(f"--cpus-per-task={math.ceil(_amount(cluster.cpus_per_node))}")
    elif device == "CPU":  # a CPU-only run's slots are CPUs
        options.append(f"--cpus-per-task={per_node}")
    if device == "GPU":
        gpus = f"{slurm.gpu_type}:{per_node}" if slurm.gpu_type else str(per_node)
        options.append(f"--gres=gpu:{gpus}" if slurm.gpu_request == "gres" else f"--gpus-per-node={gpus}")
    if cluster.memory_per_node is not None:
        gb = _amount(cluster.memory_per_node)
        options.append(f"--mem={int(gb)}G" if gb == int(gb) else f"--mem={math.ceil(gb * 1024)}M")
    for flag, value in (
        ("time", slurm.time_limit),
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
        ("constraint", slurm.constraint),
    ):
        if value is not None:
            options.append(f"--{flag}={sbatch_word(value)}")
    if spec.launch.workdir not in (None, "."):
        options.append(f"--chdir={sbatch_word(spec.launch.workdir)}")
    for option in slurm.sbatch_args:
        name, eq, value = option.partition("=")
        options.append(f"{name}={sbatch_word(value)}" if eq else name)
    return options


class Slurm:
    name = "slurm"
    summary = (
        "slurm/job.sbatch: a Slurm batch script that starts Ray on its nodes with srun and trains; sbatch submits it"
    )

    def files(self, job: TargetInput) -> dict[str, str]:
        spec = job.spec
        node = node_context(spec, job.plan)
        envs = {**spec.launch.envs, **spec.launch.trainer_envs, **spec.launch.inference_envs}
        setup = [setup_line(line) for line in spec.launch.setup]
        resolved, plan = job.files["resolved.yaml"].rstrip("\n"), job.files["plan.json"].rstrip("\n")
        ctx = {
            **node,
            "source": job.source,
            "digest": job.digest,
            "script_path": f"{job.out_dir}/{SCRIPT}",
            "name": spec.name,
            "options": sbatch_options(spec, job.plan),
            "job_dir": job_dir(spec),
            "envs": sorted((k, str(v)) for k, v in envs.items()),
            "secrets": sorted(spec.launch.secrets),
            "setup": setup,
            "resolved": resolved,
            "plan": plan,
            "eof": heredoc_end(job.digest, "\n".join([resolved, plan, *setup])),
        }
        return {SCRIPT: render("slurm.sbatch.j2", **ctx)}

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        return Launch(
            argv=["sbatch", str(out_dir / SCRIPT)],
            needs="sbatch",
            install_hint="run `rlc launch` on a machine with Slurm's client commands (a login node), or copy "
            f"{out_dir}/ there and run `sbatch {out_dir / SCRIPT}`",
        )
