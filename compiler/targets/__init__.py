"""Launch targets: each turns the compiled job (resolved spec + plan) into a template context.

Adding a target never touches resolve or plan: it is one context function here and one template.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

_ENV: list = []


def _env():
    if _ENV:
        return _ENV[0]
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
    _ENV.append(env)
    return env


def _bytecode_cache():
    """Compiled templates cached per user (compiling them costs more than the rest of `rlc compile`)."""
    import os

    import jinja2

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(root, "rlc", "jinja")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(directory)


def install_requirement(spec) -> str:
    if spec.launch.install:
        return spec.launch.install
    extras = ["runtime"] + (["vllm"] if spec.generator.inference_engine.backend == "vllm" else [])
    extras += ["megatron"] if spec.trainer.strategy == "megatron" else []
    return f"rlc[{','.join(extras)}]"


def job_dir(spec) -> str:
    """The job directory on a node as one shell word: $HOME expands, the name never does."""
    return '"$HOME/.rlc/jobs/"' + shlex.quote(spec.name)


def node_context(spec, plan: dict) -> dict:
    cluster = plan["cluster"]
    return {
        "job_dir": job_dir(spec),
        "ray_port": spec.launch.ray_port,
        "nodes": cluster["nodes"],
        "per_node": cluster["gpus_per_node"],
        "devices": cluster["nodes"] * cluster["gpus_per_node"],
        "device_kind": cluster["device"],
        "wait_s": spec.launch.node_wait_timeout_s,
    }


def skypilot(spec, plan: dict, files: dict[str, str], source: str, digest: str, task_path: str) -> str:
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
    if c.image:
        resources.append(("image_id", f"docker:{c.image}"))
    if spec.launch.ports:
        resources.append(("ports", sorted(spec.launch.ports)))
    envs = {**spec.launch.envs, **spec.launch.trainer_envs, **spec.launch.inference_envs}
    node = _env().get_template("node_start.sh.j2").render(**node_context(spec, plan))
    ctx = {
        "source": source,
        "digest": digest,
        "task_path": task_path,
        "name": spec.name,
        "nodes": plan["cluster"]["nodes"],
        "resources": resources,
        "workdir": spec.launch.workdir,
        "envs": sorted((k, str(v)) for k, v in envs.items()),
        "secrets": sorted(spec.launch.secrets),
        "install": install_requirement(spec),
        "job_dir": job_dir(spec),
        "resolved": files["resolved.yaml"].rstrip("\n"),
        "plan": files["plan.json"].rstrip("\n"),
        "setup": [_setup_line(line) for line in spec.launch.setup],
        "node_script": node.rstrip("\n"),
        "eof": heredoc_end(digest, files["resolved.yaml"] + files["plan.json"]),
    }
    return _env().get_template("sky.yaml.j2").render(**ctx)


def heredoc_end(digest: str, body: str) -> str:
    """A here-document terminator that no line of the embedded files can equal."""
    word = "RLC_END_" + digest.split(":")[-1][:16]
    lines = {line.strip() for line in body.splitlines()}
    while word in lines:
        word += "_"
    return word


def _setup_line(line: str) -> str:
    # The user's own setup commands run as written (they are shell by intent), one per line.
    return " ".join(str(line).splitlines())


def ray_job(spec, digest: str, source: str) -> dict[str, str]:
    """ray/runtime_env.yaml and ray/submit.sh: `ray job submit` of the same entrypoint."""
    env_vars = {**spec.launch.envs, **spec.launch.trainer_envs, **spec.launch.inference_envs}
    ctx = {
        "name": spec.name,
        "source": source,
        "digest": digest,
        "env_vars": sorted((k, str(v)) for k, v in env_vars.items()),
        "submission_id": submission_id(spec, digest),
    }
    env = _env()
    return {
        "ray/runtime_env.yaml": env.get_template("runtime_env.yaml.j2").render(**ctx),
        "ray/submit.sh": env.get_template("submit.sh.j2").render(**ctx),
    }


def submission_id(spec, digest: str) -> str:
    """Stable per compiled content: resubmitting the same job is refused by Ray instead of running twice."""
    return f"rlc-{spec.name}-{digest.split(':')[-1][:12]}"


DEFAULT_RAY_IMAGE = "rayproject/ray:2.49.0-py311-gpu"


def k8s_name(name: str, limit: int = 47) -> str:
    """A DNS-1035 label (lowercase letters, digits, '-', starting with a letter) of at most `limit` characters."""
    import re

    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not out or not out[0].isalpha():
        out = "rlc-" + out
    return out[:limit].rstrip("-")


def kuberay(spec, plan: dict, files: dict[str, str], source: str, digest: str) -> str:
    """kuberay/rayjob.yaml: a ConfigMap holding the compiled job and a RayJob whose head mounts it."""
    cluster = plan["cluster"]
    per_node = cluster["gpus_per_node"]
    resources: dict[str, dict] = {"limits": {}, "requests": {}}
    if cluster["device"] == "GPU":
        resources["limits"]["nvidia.com/gpu"] = resources["requests"]["nvidia.com/gpu"] = per_node
    cpus = (
        spec.cluster.cpus_per_node
        if spec.cluster.cpus_per_node is not None
        else (per_node if cluster["device"] == "CPU" else None)
    )
    if cpus is not None:
        resources["limits"]["cpu"] = resources["requests"]["cpu"] = str(cpus).rstrip("+")
    if spec.cluster.memory_per_node is not None:
        resources["limits"]["memory"] = resources["requests"]["memory"] = (
            f"{str(spec.cluster.memory_per_node).rstrip('+')}Gi"
        )
    name = k8s_name(spec.name)
    secret_name = f"{name}-secrets"
    envs = {**spec.launch.envs, **spec.launch.trainer_envs, **spec.launch.inference_envs}
    env = [{"name": k, "value": str(v)} for k, v in sorted(envs.items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": k}}} for k in sorted(spec.launch.secrets)
    ]
    runtime_env = json.dumps({"pip": [install_requirement(spec)]})
    ctx = {
        "name": spec.name,
        "source": source,
        "digest": digest,
        "k8s_name": name,
        "configmap": f"{name}-job"[:63],
        "namespace": spec.launch.kuberay.namespace,
        "labels": {"app.kubernetes.io/managed-by": "rlc", "rlc.dev/content-hash": digest.split(":")[-1][:12]},
        "resolved": files["resolved.yaml"],
        "plan": files["plan.json"],
        "entrypoint": "python -m rlc.runtime run /rlc/job/resolved.yaml",
        "runtime_env": runtime_env,
        "ttl": spec.launch.kuberay.ttl_seconds_after_finished,
        "deadline": spec.launch.kuberay.active_deadline_seconds,
        "image": spec.launch.kuberay.ray_image or spec.cluster.image or DEFAULT_RAY_IMAGE,
        "resources": resources,
        "env": env,
        "workers": cluster["nodes"] - 1,
        "secret_name": secret_name,
        "secrets": sorted(spec.launch.secrets),
    }
    return _env().get_template("rayjob.yaml.j2").render(**ctx)
