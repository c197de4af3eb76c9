"""KubeRay: kuberay/rayjob.yaml, a ConfigMap holding the compiled job and a RayJob whose head mounts it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rlc.compiler.targets.base import Launch, TargetInput, install_requirements, job_envs, render, train_line
from rlc.compiler.targets.ray import stop_wait
from rlc.compiler.trainers import TRAIN_SCRIPT

DEFAULT_RAY_IMAGE = "rayproject/ray:2.49.0-py311-gpu"


class KubeRay:
    name = "kuberay"
    summary = "kuberay/rayjob.yaml: a RayJob and a ConfigMap holding the job; `rlc launch` runs `kubectl apply` on it"

    def files(self, job: TargetInput) -> dict[str, str]:
        return {"kuberay/rayjob.yaml": rayjob(job)}

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        return Launch(
            ["kubectl", "apply", "-f", str(out_dir / "kuberay" / "rayjob.yaml")],
            needs="kubectl",
            install_hint="install kubectl and point it at the cluster running the KubeRay operator, "
            "or apply kuberay/rayjob.yaml from where kubectl is",
        )


def k8s_name(name: str, limit: int = 47) -> str:
    """A DNS-1035 label (lowercase letters, digits, '-', starting with a letter) of at most `limit` characters."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not out or not out[0].isalpha():
        out = "rlc-" + out
    return out[:limit].rstrip("-")


def rayjob(job: TargetInput) -> str:
    spec, cluster = job.spec, job.plan["cluster"]
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
    env: list[dict[str, Any]] = [{"name": k, "value": str(v)} for k, v in sorted(job_envs(spec).items())]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": k}}} for k in sorted(spec.launch.secrets)
    ]
    kuberay = spec.launch.kuberay
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if kuberay.checkpoint_volume_claim:  # every pod writes its ranks' shards where a retried job finds them
        volumes.append(
            {"name": "rlc-checkpoints", "persistentVolumeClaim": {"claimName": kuberay.checkpoint_volume_claim}}
        )
        mounts.append({"name": "rlc-checkpoints", "mountPath": str(spec.trainer.ckpt_path).rstrip("/") or "/"})
    return render(
        "rayjob.yaml.j2",
        name=spec.name,
        source=job.source,
        digest=job.digest,
        k8s_name=name,
        configmap=f"{name}-job"[:63],
        namespace=kuberay.namespace,
        labels={"app.kubernetes.io/managed-by": "rlc", "rlc.dev/content-hash": job.digest.split(":")[-1][:12]},
        resolved=job.files["resolved.yaml"],
        plan=job.files["plan.json"],
        train_script=job.files.get(TRAIN_SCRIPT),
        entrypoint=train_line(spec, "/rlc/job"),
        runtime_env=json.dumps(
            {"pip": install_requirements(spec, job.plan), "env_vars": stop_wait(spec, {})},
        ),
        ttl=kuberay.ttl_seconds_after_finished,
        deadline=kuberay.active_deadline_seconds,
        image=kuberay.ray_image or spec.cluster.image or DEFAULT_RAY_IMAGE,
        resources=resources,
        env=env,
        workers=cluster["nodes"] - 1,
        secret_name=secret_name,
        secrets=sorted(spec.launch.secrets),
        grace=spec.launch.grace_period_s,
        backoff=spec.launch.recovery.max_restarts_on_errors,
        head_volumes=[{"name": "rlc-job", "configMap": {"name": f"{name}-job"[:63]}}, *volumes],
        head_mounts=[{"name": "rlc-job", "mountPath": "/rlc/job", "readOnly": True}, *mounts],
        volumes=volumes,
        mounts=mounts,
    )
