"""rlc's own sections: `cluster` (what to run on) and `launch` (how to start it)."""

from dataclasses import dataclass

from rlc.spec.fields import section, setting

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
LAUNCH_TARGETS = ("skypilot", "ray", "kuberay", "local")


@dataclass
class ClusterConfig:
    accelerator: str = setting("H100", "GPU type per node (e.g. H100, A100-80GB, L40S); none for a CPU-only run.")
    gpus_per_node: int | None = setting(
        None, "GPUs per node (CPU slots when accelerator is none); derived from the placement when unset.", minimum=1
    )
    num_nodes: int | None = setting(None, "Nodes, head included; derived from the placement when unset.", minimum=1)
    infra: str | None = setting(
        None, "Where to provision: cloud[/region[/zone]] or k8s[/context]; null lets SkyPilot choose."
    )
    use_spot: bool = setting(False, "Use spot/preemptible instances.")
    cpus_per_node: int | str | None = setting(None, "vCPUs per node; N or N+ (at least N).")
    memory_per_node: int | str | None = setting(None, "Memory per node in GB; N or N+ (at least N).")
    disk_size: int | None = setting(None, "Boot disk size per node in GB.", minimum=1)
    disk_tier: str | None = setting(None, "Disk performance tier.", enum=("low", "medium", "high", "ultra", "best"))
    network_tier: str | None = setting(
        None, "Network tier; best asks for InfiniBand/GPUDirect where offered.", enum=("standard", "best")
    )
    instance_type: str | None = setting(None, "Exact instance type; null picks one from the accelerator.")
    image: str | None = setting(None, "Container image the job runs in (docker image name).")


@dataclass
class KubeRayConfig:
    namespace: str = setting("default", "Kubernetes namespace of the RayJob.")
    ray_image: str | None = setting(
        None, "Image of the head and worker pods; null uses cluster.image or Ray's GPU image."
    )
    ttl_seconds_after_finished: int = setting(3600, "Seconds the finished RayJob and its cluster are kept.", minimum=0)
    active_deadline_seconds: int | None = setting(None, "Kill the job after this many seconds; null never.", minimum=1)


@dataclass
class LaunchConfig:
    target: str = setting("skypilot", "Launcher the compiled files are meant for.", enum=LAUNCH_TARGETS)
    workdir: str | None = setting(
        ".", "Local directory synced to every node (where data and code live); null syncs nothing."
    )
    setup: list[str] = setting(doc="Extra shell commands run on every node after rlc is installed.", factory=list)
    envs: dict[str, str] = setting(
        doc="Environment variables for every process of the job.", factory=dict, pattern=ENV_NAME
    )
    trainer_envs: dict[str, str] = setting(
        doc="Environment variables for training processes only.", factory=dict, pattern=ENV_NAME
    )
    inference_envs: dict[str, str] = setting(
        doc="Environment variables for inference-engine processes only.", factory=dict, pattern=ENV_NAME
    )
    secrets: list[str] = setting(
        doc="Names of secret environment variables (values are never written).", factory=list, pattern=ENV_NAME
    )
    install: str | None = setting(
        None, "pip requirement that installs rlc on the nodes; derived from the spec when unset."
    )
    ports: list[int] = setting(
        doc="Ports to open on the nodes to the outside (e.g. a dashboard); Ray's ports stay closed.", factory=list
    )
    ray_port: int = setting(
        6479, "Port of the job's own Ray head (SkyPilot's Ray holds 6380).", minimum=1024, maximum=65535
    )
    node_wait_timeout_s: int = setting(600, "Seconds the head waits for all nodes and GPUs before failing.", minimum=1)
    kuberay: KubeRayConfig = section(KubeRayConfig, "KubeRay RayJob settings.")
