"""rlc's own sections: `cluster` (what to run on) and `launch` (how to start it)."""

from typing import Any

from rlc.core.dataclass import dataclass
from rlc.spec.fields import section, setting

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
LAUNCH_TARGETS = ("skypilot", "ray", "kuberay", "local", "slurm")
# Which trainer the compiled job runs: rlc's own runtime, or SkyRL's or verl's trainer fed from the same spec.
TRAINER_NAMES = ("rlc", "skyrl", "verl")
# A value on a `#SBATCH` line must stay one option there: sbatch splits the line on whitespace and reads quotes, '#'
# and backslashes as syntax, and a newline would end the line and start a shell command. These patterns admit none.
SLURM_NAME = r"^[A-Za-z0-9_.+-]+$"
SLURM_NAMES = r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$"
SLURM_CONSTRAINT = r"^[A-Za-z0-9_.:+=&|,*()\[\]-]+$"
SLURM_TIME = (
    r"^([0-9]+(:[0-9]+){0,2}|[0-9]+-([0-9]+(:[0-9]+){0,2})?|-1|UNLIMITED|unlimited|INFINITE|infinite"
    r"|([0-9]+(\.[0-9]*)?|\.[0-9]+)[smhdSMHD])$"  # the last: a duration with a unit, made minutes by resolve
)
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
SLURM_OPTION = r"^--[A-Za-z][A-Za-z0-9-]*(=[^\x00-\x1f\x7f]*)?$"


@dataclass
class ClusterConfig:
    accelerator: str = setting(
        "H100",
        "GPU type per node (e.g. H100, A100-80GB, L40S); none for a CPU-only run. SkyPilot's TYPE:COUNT (H100:8) "
        "reads as the type and cluster.gpus_per_node, which must then agree; a fraction of a GPU is refused.",
    )
    gpus_per_node: int | None = setting(
        None, "GPUs per node (CPU slots when accelerator is none); derived from the placement when unset.", minimum=1
    )
    num_nodes: int | None = setting(
        None,
        "Nodes, head included; when unset, 1 if the spec sets no placement count under colocate_all (the placement "
        "then fills the node), else derived from the placement.",
        minimum=1,
    )
    infra: str | None = setting(
        None,
        "Where to provision, as SkyPilot's infra: cloud[/region[/zone]] (aws/us-east-1), k8s[/context], * for any "
        "cloud (*/us-east-1); null lets SkyPilot choose.",
    )
    use_spot: bool = setting(False, "Use spot/preemptible instances.")
    cpus_per_node: int | str | None = setting(None, "vCPUs per node; N or N+ (at least N), as SkyPilot reads cpus.")
    memory_per_node: int | str | None = setting(
        None,
        "Memory per node in GB; N or N+ (at least N), or with SkyPilot's units KB, MB, GB, TB, PB (or Ki..Pi; GB is "
        "2**30 bytes); a bare G, M or K is refused (Slurm and Kubernetes read it differently).",
    )
    disk_size: int | None = setting(None, "Boot disk size per node in GB.", minimum=1)
    disk_tier: str | None = setting(None, "Disk performance tier.", enum=("low", "medium", "high", "ultra", "best"))
    network_tier: str | None = setting(
        None, "Network tier; best asks for InfiniBand/GPUDirect where offered.", enum=("standard", "best")
    )
    instance_type: str | None = setting(None, "Exact instance type; null picks one from the accelerator.")
    image: str | None = setting(None, "Container image the job runs in (docker image name).")


@dataclass
class KubeRayConfig:
    namespace: str = setting(
        "default",
        "Kubernetes namespace of the RayJob (a DNS label: lowercase letters, digits and '-').",
        pattern=DNS_LABEL,
        pattern_hint="write a Kubernetes namespace: up to 63 lowercase letters, digits and '-', starting and ending "
        "with a letter or digit",
    )
    ray_image: str | None = setting(
        None, "Image of the head and worker pods; null uses cluster.image or Ray's GPU image."
    )
    ttl_seconds_after_finished: int = setting(3600, "Seconds the finished RayJob and its cluster are kept.", minimum=0)
    active_deadline_seconds: int | None = setting(None, "Kill the job after this many seconds; null never.", minimum=1)
    checkpoint_volume_claim: str | None = setting(
        None,
        "A PersistentVolumeClaim mounted at trainer.ckpt_path in every pod (ReadWriteMany for more than one node), "
        "where a retried job finds its checkpoints; null: the pods' own disks, gone with them.",
        pattern=DNS_LABEL,
        pattern_hint="write the claim's name: lowercase letters, digits and '-'",
    )


@dataclass
class SlurmConfig:
    partition: str | None = setting(
        None,
        "Partition(s) to run in (sbatch --partition), comma-separated; null: the cluster's default partition.",
        pattern=SLURM_NAMES,
        pattern_hint="write a partition name, or several joined by ',' (letters, digits, '_', '.', '+', '-')",
    )
    account: str | None = setting(
        None,
        "Account the job is charged to (sbatch --account); null: your default account.",
        pattern=SLURM_NAME,
        pattern_hint="write one account name (letters, digits, '_', '.', '+', '-')",
    )
    qos: str | None = setting(
        None,
        "Quality of service (sbatch --qos); null: the default of the account or partition.",
        pattern=SLURM_NAME,
        pattern_hint="write one QOS name (letters, digits, '_', '.', '+', '-')",
    )
    time_limit: int | str | None = setting(
        None,
        "Wall-clock limit (sbatch --time): minutes, or MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, UNLIMITED, or a "
        "duration with a unit (90m, 4h, 2d; made minutes); null: the partition's default.",
        minimum=0,
        pattern=SLURM_TIME,
        pattern_hint="write a time Slurm accepts: minutes (90), MM:SS, HH:MM:SS (04:00:00), D-HH, D-HH:MM, D-HH:MM:SS "
        "(1-12:00:00) or UNLIMITED, or a duration with a unit (4h, 90m, 2d)",
    )
    constraint: str | None = setting(
        None,
        "Node features the nodes must have (sbatch --constraint), e.g. a100|h100 or [rack1|rack2]; null: any node.",
        pattern=SLURM_CONSTRAINT,
        pattern_hint="write feature names joined by Slurm's operators & | , * [ ] ( ), without spaces or quotes",
    )
    gpu_type: str | None = setting(
        None,
        "GPU type as the cluster's gres.conf names it (e.g. a100), asked for as gpu:TYPE:N; null: any GPU type.",
        pattern=SLURM_NAME,
        pattern_hint="write the GPU type as gres.conf names it (letters, digits, '_', '.', '+', '-')",
    )
    gpu_request: str = setting(
        "gres",
        "How GPUs are asked for: gres (--gres=gpu:N, every Slurm) or gpus-per-node (--gpus-per-node=N, "
        "select/cons_tres).",
        enum=("gres", "gpus-per-node"),
    )
    requeue: bool = setting(
        True,
        "sbatch --requeue, and, grace_period_s before the time limit, a checkpoint then `scontrol requeue`: a "
        "preempted job or one out of time goes back to the queue and resumes from its checkpoint.",
    )
    sbatch_args: list[str] = setting(
        doc="More #SBATCH options, one --name or --name=value per item (e.g. --mail-type=END); rlc quotes values.",
        factory=list,
        pattern=SLURM_OPTION,
        pattern_hint="write one long option per item, --name or --name=value (e.g. --exclusive, --mail-type=END), on "
        "one line",
    )


# A bucket SkyPilot mounts: its stores' URL schemes (s3, gs, r2, cos, oci, nebius) or an Azure blob container's URL.
BUCKET_URL = r"^((s3|gs|r2|cos|oci|nebius)://[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._/-]*)?|https://[a-z0-9]+\.blob\.core\.windows\.net/[a-z0-9][a-z0-9-]*(/[A-Za-z0-9._/-]*)?)$"


@dataclass
class RecoveryConfig:
    managed: bool | None = setting(
        None,
        "SkyPilot: run as a managed job (`sky jobs launch`), which SkyPilot restarts on new nodes after a preemption "
        "and which resumes from its last checkpoint; null: on when cluster.use_spot.",
    )
    max_restarts_on_errors: int = setting(
        0,
        "Restarts after the job fails by itself rather than by a preemption: SkyPilot's "
        "job_recovery.max_restarts_on_errors (managed jobs), KubeRay's RayJob backoffLimit.",
        minimum=0,
    )
    strategy: str | None = setting(
        None,
        "SkyPilot's recovery strategy of a managed job: FAILOVER (the same region first) or EAGER_NEXT_REGION; null: "
        "SkyPilot's default.",
        enum=("FAILOVER", "EAGER_NEXT_REGION"),
    )


@dataclass
class LaunchConfig:
    target: str = setting("skypilot", "Launcher the compiled files are meant for.", enum=LAUNCH_TARGETS)
    trainer: str = setting(
        "rlc",
        "Which trainer runs the job: rlc (rlc's runtime), skyrl (SkyRL's main_base entrypoint) or verl (verl's "
        "main_ppo), each given every value of the resolved spec.",
        enum=TRAINER_NAMES,
    )
    trainer_version: str | None = setting(
        None,
        "Release of the chosen trainer the nodes install; null: the release rlc checks its commands against "
        "(SkyRL 0.4.0, verl 0.9.1; rlc: this rlc).",
        pattern=r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?$",
        pattern_hint="write a release number, e.g. 0.4.0",
    )
    trainer_settings: dict[str, dict[str, Any]] = setting(
        doc="Settings the spec has no place for, per trainer (skyrl, verl), as that trainer's own dotted keys "
        "(data.filter_overlong_prompts: true); passed to that trainer only, checked against its config.",
        factory=dict,
        passthrough=True,
    )
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
    grace_period_s: int = setting(
        120,
        "Seconds the job has, from SIGTERM (scancel, a spot notice, a cancel), to save a checkpoint of its last "
        "finished step and exit; the targets ask for them (Slurm's --signal, Kubernetes' grace period).",
        minimum=5,
    )
    recovery: RecoveryConfig = section(RecoveryConfig, "What restarts the job after a preemption or a failure.")
    checkpoint_bucket: str | None = setting(
        None,
        "SkyPilot: a bucket (s3://, gs://, r2://, ... or an Azure blob container's https URL) mounted at "
        "trainer.ckpt_path on every node (file_mounts, MOUNT_CACHED), where a restarted job finds its checkpoints; "
        "null: each node's own disk.",
        pattern=BUCKET_URL,
        pattern_hint="write a bucket URL SkyPilot mounts, e.g. s3://my-bucket/checkpoints or gs://my-bucket",
    )
    kuberay: KubeRayConfig = section(KubeRayConfig, "KubeRay RayJob settings.")
    slurm: SlurmConfig = section(SlurmConfig, "Slurm batch job settings (target slurm).")
