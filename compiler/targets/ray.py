"""Ray job: ray/runtime_env.yaml and ray/submit.sh, `ray job submit` of the job to a running Ray cluster."""

from __future__ import annotations

from pathlib import Path

from rlc.compiler.targets.base import Launch, TargetInput, job_envs, render
from rlc.compiler.trainers import TRAIN_SCRIPT
from rlc.spec.root import RlcSpec


class RayJob:
    name = "ray"
    summary = "ray/runtime_env.yaml, ray/submit.sh: `ray job submit` to a running cluster; `rlc launch` runs submit.sh"

    def files(self, job: TargetInput) -> dict[str, str]:
        context = {
            "name": job.spec.name,
            "source": job.source,
            "digest": job.digest,
            "env_vars": sorted((k, str(v)) for k, v in stop_wait(job.spec, job_envs(job.spec)).items()),
            "submission_id": submission_id(job.spec, job.digest),
            "train_script": TRAIN_SCRIPT in job.files,
        }
        return {
            "ray/runtime_env.yaml": render("runtime_env.yaml.j2", **context),
            "ray/submit.sh": render("submit.sh.j2", **context),
        }

    def launch(self, out_dir: Path, job: TargetInput) -> Launch:
        return Launch(
            [str(out_dir / "ray" / "submit.sh")],
            needs="ray",
            install_hint="install Ray's command line with `pip install 'ray[default]'`, or run ray/submit.sh where it is",
        )


def stop_wait(spec: RlcSpec, envs: dict) -> dict:
    """The job's environment with the seconds `ray job stop` waits between its SIGTERM and SIGKILL (Ray's default, 3 s,
    is no time for a save): launch.grace_period_s, unless the spec sets Ray's variable itself."""
    return {"RAY_JOB_STOP_WAIT_TIME_S": str(spec.launch.grace_period_s), **envs}


def submission_id(spec: RlcSpec, digest: str) -> str:
    """Stable per compiled content: resubmitting the same job is refused by Ray instead of running twice."""
    return f"rlc-{spec.name}-{digest.split(':')[-1][:12]}"
