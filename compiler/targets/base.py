"""What every launch target is and shares: the compiled job it renders from (`TargetInput`), how `rlc launch` starts it
(`Launch`), the `Target` protocol, and the Jinja environment and shell/YAML helpers its templates use.

A target is the "where" of a job (TorchX's scheduler): it never touches resolve or plan, only turns their result
into its own files.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlc.compiler.trainers import TRAIN_SCRIPT, command_of
from rlc.compiler.trainers.rlc import RLC
from rlc.core.dataclass import dataclass
from rlc.spec.root import RlcSpec

if TYPE_CHECKING:
    import jinja2


@dataclass(frozen=True)
class TargetInput:
    """What every target renders from: the compiled job, already decided and written as text."""

    spec: RlcSpec  # the resolved, typed spec
    plan: dict  # plan.json's content as written (with "content_hash" and "runtime")
    files: Mapping[str, str]  # resolved.yaml and plan.json, as written
    source: str  # the spec's file name: a label, never a path of the compiling machine
    digest: str  # the content hash (sha256:...)
    out_dir: str  # where the files go, as the user will see it (default build/<name>)


@dataclass(frozen=True)
class Launch:
    """How `rlc launch` starts a compiled job: the command, run from the current directory."""

    argv: list[str]
    needs: str | None = None  # the executable that must be on PATH (sky, sbatch, kubectl, ray); None: runs here
    install_hint: str = ""  # ... and how to get it, for the usage error when it is missing


class Target(Protocol):
    name: str  # the value of launch.target and of --target
    summary: str  # one line: what it writes and what starts it (--help, rlc explain launch.target)

    def files(self, job: TargetInput) -> dict[str, str]:
        """The target's own files, relative path -> text (may be empty)."""
        ...

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        """What `rlc launch` runs once the files are written to `out_dir`."""
        ...


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The templates of rlc.templates, rendered strictly (an unknown name is an error), with the quoting filters."""
    # deferred: jinja2, only to render: `rlc explain` and `--help` read the registry without rendering anything
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("rlc.templates", ""),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )
    env.filters["shq"] = lambda v: shlex.quote(str(v))
    env.filters["yq"] = lambda v: json.dumps(v, ensure_ascii=False)  # JSON scalars are YAML scalars: no injection
    return env


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates cached per user (compiling them costs more than the rest of `rlc compile`)."""
    # deferred: jinja2, only to render (as above)
    import jinja2

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(root, "rlc", "jinja")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(directory)


def install_requirements(spec: RlcSpec, plan: dict) -> list[str]:
    """What the nodes pip-install: rlc with the runtime extras the job needs, or, for another trainer, rlc itself
    (the head's wait for every node) and the trainer's release with its extras. launch.install replaces rlc's."""
    command = command_of(spec, plan)
    if command is not None:
        return [spec.launch.install or "rlc", *command.requirements]
    if spec.launch.install:
        return [spec.launch.install]
    extras = ["runtime"] + (["vllm"] if spec.generator.inference_engine.backend == "vllm" else [])
    extras += ["megatron"] if spec.trainer.strategy == "megatron" else []
    return [f"rlc[{','.join(extras)}]"]


def train_line(spec: RlcSpec, job_directory: str, python: str = "python") -> str:
    """The head node's training command, as a shell line, with the job directory given as a shell word: rlc's
    runtime on resolved.yaml, or train.sh of another trainer."""
    if spec.launch.trainer == RLC.name:
        return f'{python} -m rlc.runtime run "{job_directory}/resolved.yaml"'
    return f'bash "{job_directory}/{TRAIN_SCRIPT}"'


def imports_needed(spec: RlcSpec, plan: dict) -> list[str]:
    """The top-level packages the head must import to train: Ray and rlc's runtime, or the trainer's own."""
    command = command_of(spec, plan)
    if command is None:
        return ["ray", "rlc.runtime"]
    return ["ray", "rlc.runtime.cluster_gate", command.module.split(".")[0]]


def job_dir(spec: RlcSpec) -> str:
    """The job directory on a node as one shell word: $HOME expands, the name never does."""
    return '"$HOME/.rlc/jobs/"' + shlex.quote(spec.name)


def node_context(spec: RlcSpec, plan: dict) -> dict:
    cluster = plan["cluster"]
    return {
        "job_dir": job_dir(spec),
        "ray_port": spec.launch.ray_port,
        "nodes": cluster["nodes"],
        "per_node": cluster["gpus_per_node"],
        "devices": cluster["nodes"] * cluster["gpus_per_node"],
        "device_kind": cluster["device"],
        "wait_s": spec.launch.node_wait_timeout_s,
        "train": train_line(spec, "$RLC_JOB_DIR"),
        "imports": imports_needed(spec, plan),
    }


def job_envs(spec: RlcSpec) -> dict[str, Any]:
    """Every environment variable of the job: launch.envs, then the trainer's and the engines' own."""
    return {**spec.launch.envs, **spec.launch.trainer_envs, **spec.launch.inference_envs}


def heredoc_end(digest: str, body: str) -> str:
    """A here-document terminator that no line of the embedded files can equal."""
    word = "RLC_END_" + digest.split(":")[-1][:16]
    lines = {line.strip() for line in body.splitlines()}
    while word in lines:
        word += "_"
    return word


def setup_line(line: str) -> str:
    """One of the user's launch.setup commands, run as written (they are shell by intent), on one line."""
    return " ".join(str(line).splitlines())
