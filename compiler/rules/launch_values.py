"""Values written in a launcher's own syntax that rlc cannot read as that launcher does (rlc.compiler.launch_values):
resolve rewrote every readable one, so what is left here would reach a launch file as written, where the launcher
refuses it or reads it otherwise."""

from __future__ import annotations

from rlc.compiler.launch_values import READERS, Unreadable, accelerator
from rlc.compiler.roles import get
from rlc.compiler.rules.base import Context, rule

SIZES = ("cluster.cpus_per_node", "cluster.memory_per_node")


@rule(
    "RLC-E920",
    "cluster.accelerator is a GPU type, or SkyPilot's TYPE:COUNT with the count of cluster.gpus_per_node",
    "cluster.accelerator",
    "cluster.gpus_per_node",
)
def accelerator_count(c: Context):
    text = c.s.cluster.accelerator
    if not isinstance(text, str) or ":" not in text:
        return
    try:
        name, count = accelerator(text)
    except Unreadable as exc:
        yield c.error("RLC-E920", "cluster.accelerator", exc.message, exc.hint)
        return
    yield c.error(
        "RLC-E920",
        "cluster.accelerator",
        f"cluster.accelerator = {text!r} asks for {count} GPUs per node but cluster.gpus_per_node is "
        f"{c.s.cluster.gpus_per_node}",
        f"write cluster.accelerator: {name} and keep the count in cluster.gpus_per_node",
        ["cluster.gpus_per_node"],
    )


@rule(
    "RLC-E921",
    "cluster sizes and location are written as SkyPilot, Slurm and Kubernetes read them",
    *SIZES,
    "cluster.infra",
)
def cluster_values(c: Context):
    for key in (*SIZES, "cluster.infra"):
        value = get(c.s, key)
        if value is None:
            continue
        try:
            READERS[key](value, key)
        except Unreadable as exc:
            yield c.error("RLC-E921", key, exc.message, exc.hint)


RULES = (accelerator_count, cluster_values)
