"""Preemption and restarts: where a restarted job finds its checkpoints, and whether anything restarts it at all.

A job resumes by itself only when two things hold: something starts it again (a SkyPilot managed job, a KubeRay
RayJob's retries, Slurm's requeue) and its checkpoints outlive the nodes that wrote them (a bucket, a volume claim,
a file system every node shares). These rules say when either is missing, with the key that fixes it.
"""

from __future__ import annotations

from rlc.compiler.roles import critic_on
from rlc.compiler.rules.base import Context, rule

CKPT = "trainer.ckpt_path"
# Paths that are each node's own on any cluster: a multi-node job's shards there are split across nodes.
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/scratch/local", "/local", "/mnt/local")


def _nodes(c: Context) -> int:
    """The nodes whose disks hold a checkpoint's shards: the policy's (and the critic's, when the job has one)."""
    p = c.s.trainer.placement
    nodes = p.policy_num_nodes or 1
    if critic_on(c.s):
        nodes = max(nodes, p.critic_num_nodes or 1)
        if not p.colocate_all and (c.s.cluster.num_nodes or 1) > 1:
            nodes = max(nodes, 2)  # the critic's shards may sit on another node than the policy's
    return nodes


def _managed(c: Context) -> bool:
    asked = c.s.launch.recovery.managed
    return c.s.cluster.use_spot if asked is None else asked


@rule(
    "RLC-W970",
    "spot nodes restart the job only as a managed job",
    "cluster.use_spot",
    "launch.recovery.managed",
    "launch.target",
)
def spot_without_recovery(c: Context):
    if c.s.launch.target == "skypilot" and c.s.cluster.use_spot and c.s.launch.recovery.managed is False:
        yield c.warning(
            "RLC-W970",
            "launch.recovery.managed",
            "the nodes are spot instances but the job is not a managed job: the first preemption ends it, and its "
            "checkpoints go with the nodes",
            "remove launch.recovery.managed (spot nodes make it a managed job, which SkyPilot restarts), or set "
            "cluster.use_spot: false",
            related=["cluster.use_spot"],
        )


def _node_local(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in NODE_LOCAL)


@rule(
    "RLC-W971",
    "checkpoints where a restarted or multi-node job finds them",
    CKPT,
    "launch.target",
    "launch.checkpoint_bucket",
    "launch.kuberay.checkpoint_volume_claim",
    "launch.recovery",
    "cluster.num_nodes",
    "cluster.use_spot",
    "trainer.placement",
    "trainer.critic.model.path",
)
def checkpoints_outlive_the_nodes(c: Context):
    s, nodes = c.s, _nodes(c)
    path, target = str(s.trainer.ckpt_path), s.launch.target
    split = f"each of the {nodes} nodes writes its ranks' shards to its own disk, and no node holds a whole checkpoint"
    if target == "skypilot" and not s.launch.checkpoint_bucket and (nodes > 1 or _managed(c)):
        why = split if nodes > 1 else "a restarted managed job starts on new nodes, without the old nodes' disks"
        yield c.warning(
            "RLC-W971",
            CKPT,
            f"checkpoints go to {path} on the nodes' own disks: {why}",
            "set launch.checkpoint_bucket (e.g. s3://my-bucket/checkpoints): it is mounted at trainer.ckpt_path on "
            "every node and outlives them",
            related=["launch.checkpoint_bucket"],
        )
    elif (
        target == "kuberay"
        and not s.launch.kuberay.checkpoint_volume_claim
        and (nodes > 1 or s.launch.recovery.max_restarts_on_errors > 0)
    ):
        why = split if nodes > 1 else "a retried RayJob starts new pods, without the old pods' disks"
        yield c.warning(
            "RLC-W971",
            CKPT,
            f"checkpoints go to {path} on the pods' own disks: {why}",
            "set launch.kuberay.checkpoint_volume_claim to a PersistentVolumeClaim (ReadWriteMany for more than "
            "one node): it is mounted at trainer.ckpt_path in every pod",
            related=["launch.kuberay.checkpoint_volume_claim"],
        )
    elif target == "slurm" and nodes > 1 and _node_local(path):
        yield c.warning(
            "RLC-W971",
            CKPT,
            f"checkpoints go to {path}, a path each node has of its own: {split}",
            "set trainer.ckpt_path to a file system every node of the allocation mounts (your cluster's shared "
            "home or project storage)",
        )


@rule(
    "RLC-E970",
    "a checkpoint mount needs a plain path",
    CKPT,
    "launch.checkpoint_bucket",
    "launch.kuberay.checkpoint_volume_claim",
    "launch.target",
)
def mount_path(c: Context):
    s = c.s
    path = str(s.trainer.ckpt_path)
    bucket = s.launch.target == "skypilot" and s.launch.checkpoint_bucket
    claim = s.launch.target == "kuberay" and s.launch.kuberay.checkpoint_volume_claim
    if not (bucket or claim):
        return
    by = "launch.checkpoint_bucket" if bucket else "launch.kuberay.checkpoint_volume_claim"
    if "${" in path or "$" in path:
        yield c.error(
            "RLC-E970",
            CKPT,
            f"{by} is mounted at trainer.ckpt_path, but {path!r} is only known on the node",
            "write trainer.ckpt_path as a plain path (e.g. /checkpoints)",
            related=[by],
        )
    elif claim and not path.startswith("/"):
        yield c.error(
            "RLC-E970",
            CKPT,
            f"a volume is mounted at an absolute path in the pod, and trainer.ckpt_path is {path!r}",
            "write trainer.ckpt_path as an absolute path (e.g. /checkpoints)",
            related=[by],
        )
    elif bucket and not (path.startswith("/") or path.startswith("~/")):
        yield c.error(
            "RLC-E970",
            CKPT,
            f"SkyPilot mounts a bucket at an absolute path or one under ~/, and trainer.ckpt_path is {path!r}",
            "write trainer.ckpt_path as an absolute path or one under ~/ (e.g. ~/ckpts)",
            related=[by],
        )


RULES = (spot_without_recovery, checkpoints_outlive_the_nodes, mount_path)
