"""Placement rules: colocation equalities and the fit of every role and engine to `cluster`."""

from __future__ import annotations

import math

from rlc.compiler.roles import (
    ENGINES,
    PLACEMENT_COUNTS,
    colocated_counts,
    critic_on,
    demand_terms,
    engine_gpus,
    get,
    gpu_demand,
    ref_on,
)
from rlc.compiler.rules.base import OVERRIDE, Context, num, rule

# -- placement ------------------------------------------------------

IE = "generator.inference_engine"
PL = "trainer.placement"
ENGINE_SHAPE = (f"{IE}.tensor_parallel_size", f"{IE}.pipeline_parallel_size", f"{IE}.data_parallel_size")
POLICY_LAYOUT = (f"{PL}.policy_num_gpus_per_node", f"{PL}.policy_num_nodes")


def _because(c: Context, key: str) -> str:
    """`; KEY = VALUE (on the command line) makes them differ` when the user set the culprit key, else nothing."""
    how = c.how_set(key)
    return f"; {how} makes them differ" if how else ""


def _demand_text(c: Context) -> str:
    """What adds up to the job's GPU demand: each role and the engines, with the keys that size them."""
    terms, shared = demand_terms(c.s)
    parts = [f"{t.role} {t.gpus} = {t.formula()}" for t in terms]
    if shared:
        return "under colocate_all the roles share GPUs, so it needs the largest of " + "; ".join(parts)
    return " + ".join(parts)


def _overridden(c: Context, key: str) -> str:
    """`; KEY = VALUE (on the command line)` for a culprit set by an override (a file line shows in the location)."""
    return f"; {c.how_set(key)}" if c.origin(key) == OVERRIDE else ""


@rule(
    "RLC-E201",
    "colocate_all: policy GPUs == num_engines * tp * pp * dp",
    "trainer.placement.colocate_all",
    f"{IE}.num_engines",
    f"{IE}.tensor_parallel_size",
    "trainer.placement.policy_num_gpus_per_node",
    "generator.inference_engine.data_parallel_size",
    "generator.inference_engine.pipeline_parallel_size",
    "generator.inference_engine.run_engines_locally",
    "trainer.placement.policy_num_nodes",
)
def colocate_all_engines_match_policy(c: Context):
    if not c.p.colocate_all or not c.ie.run_engines_locally:
        return
    w = c.world("policy")
    inf = c.ie.num_engines * engine_gpus(c.ie)
    if w is not None and w != inf:
        per = engine_gpus(c.ie)
        keys = (f"{IE}.num_engines", *ENGINE_SHAPE, *POLICY_LAYOUT)
        key = c.culprit(keys, f"{IE}.num_engines")
        if key in ENGINE_SHAPE:
            fix = f"set {key} back so tp*pp*dp divides the policy's {w} GPUs"
        elif key in POLICY_LAYOUT:
            fix = f"give the policy {inf} GPUs like the engines, or leave num_engines unset to derive it"
        elif w % per == 0:
            fix = f"set {IE}.num_engines to {w // per} (or leave num_engines unset to derive it)"
        else:
            fix = f"make policy GPUs a multiple of tp*pp*dp = {per} (or leave num_engines unset to derive it)"
        yield c.error(
            "RLC-E201",
            key,
            f"colocate_all puts training and inference on the same GPUs, but the policy has {w} and the engines "
            f"{c.ie.num_engines}*{c.ie.tensor_parallel_size}*{c.ie.pipeline_parallel_size}*{c.ie.data_parallel_size}"
            f" = {inf}{_because(c, key)}",
            fix,
            [k for k in keys if k != key],
            policy_gpus=w,
            inference_gpus=inf,
        )


@rule(
    "RLC-E202",
    "colocate_policy_ref (not colocate_all): ref layout equals policy layout",
    "trainer.placement.colocate_policy_ref",
    "trainer.placement.ref_num_nodes",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.algorithm.use_kl_loss",
    "trainer.placement.colocate_all",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
)
def colocated_ref_matches_policy(c: Context):
    if c.p.colocate_all or not c.p.colocate_policy_ref or not ref_on(c.s):
        return
    for dim in ("num_nodes", "num_gpus_per_node"):
        pv, rv = getattr(c.p, f"policy_{dim}"), getattr(c.p, f"ref_{dim}")
        if pv != rv:
            ref_key, policy_key = f"{PL}.ref_{dim}", f"{PL}.policy_{dim}"
            key = c.culprit((ref_key, policy_key, f"{PL}.colocate_policy_ref"), ref_key)
            fix = (
                f"set policy_{dim} back to {rv} like the ref's (or colocate_policy_ref: false)"
                if key == policy_key
                else f"set ref_{dim} to {pv} (or colocate_policy_ref: false)"
            )
            yield c.error(
                "RLC-E202",
                key,
                f"colocate_policy_ref shares per-node bundles, but ref_{dim} ({rv}) differs from policy_{dim} ({pv})"
                + _because(c, key),
                fix,
                [k for k in (ref_key, policy_key) if k != key],
            )


@rule(
    "RLC-E203",
    "colocate_all: ref and critic GPUs equal policy GPUs",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.algorithm.use_kl_in_reward",
    "trainer.algorithm.use_kl_loss",
    "trainer.critic.model.path",
    "trainer.placement.colocate_all",
    "trainer.placement.critic_num_nodes",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.ref_num_nodes",
)
def colocate_all_roles_match_policy(c: Context):
    if not c.p.colocate_all:
        return
    w = c.world("policy")
    for role, on in (("ref", ref_on(c.s)), ("critic", critic_on(c.s))):
        rw = c.world(role)
        if on and rw is not None and w is not None and rw != w:
            role_keys = (f"{PL}.{role}_num_gpus_per_node", f"{PL}.{role}_num_nodes")
            key = c.culprit((*role_keys, *POLICY_LAYOUT), role_keys[0])
            fix = (
                f"set the policy's layout back to {rw} GPUs like the {role}'s, or leave both unset"
                if key in POLICY_LAYOUT
                else f"set {role}_num_nodes/{role}_num_gpus_per_node like the policy's, or leave them unset"
            )
            yield c.error(
                "RLC-E203",
                key,
                f"colocate_all needs the {role} on the policy's GPUs, but it has {rw} and the policy {w}"
                + _because(c, key),
                fix,
                [k for k in (*role_keys, *POLICY_LAYOUT) if k != key],
            )


@rule(
    "RLC-E204",
    "the placement fits the cluster (GPUs in total)",
    "cluster.gpus_per_node",
    "cluster.num_nodes",
    "cluster.accelerator",
    "generator.inference_engine.data_parallel_size",
    "generator.inference_engine.num_engines",
    "generator.inference_engine.pipeline_parallel_size",
    "generator.inference_engine.run_engines_locally",
    "generator.inference_engine.tensor_parallel_size",
    "trainer.algorithm.use_kl_in_reward",
    "trainer.algorithm.use_kl_loss",
    "trainer.critic.model.path",
    "trainer.placement.colocate_all",
    "trainer.placement.colocate_policy_ref",
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.placement.critic_num_nodes",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.ref_num_nodes",
)
def placement_fits_cluster(c: Context):
    g, n = num(c.s.cluster.gpus_per_node), num(c.s.cluster.num_nodes)
    if g is None or n is None:
        return
    demand = gpu_demand(c.s)
    unit = "CPU slots" if c.s.cluster.accelerator == "none" else "GPUs"
    if demand > g * n:
        terms, _ = demand_terms(c.s)
        how = _demand_text(c)
        biggest = max(terms, key=lambda t: t.gpus)
        keys = ("cluster.num_nodes", "cluster.gpus_per_node", *(k for t in terms for k in t.keys))
        key = c.culprit(keys, "cluster.num_nodes")
        yield c.error(
            "RLC-E204",
            key,
            f"the job needs {demand} {unit} but the cluster has {n} x {g} = {g * n}: {how}{_overridden(c, key)}",
            f"raise cluster.num_nodes to {math.ceil(demand / g)}, or shrink the {biggest.role} "
            f"({', '.join(k.rsplit('.', 1)[1] for k in biggest.keys)})",
            [k for k in keys if k != key],
            demand=demand,
            capacity=g * n,
            terms=[{"role": t.role, "gpus": t.gpus, "keys": list(t.keys)} for t in terms],
        )


@rule(
    "RLC-E205",
    "every per-node bundle fits one node",
    "cluster.gpus_per_node",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.algorithm.use_kl_in_reward",
    "trainer.algorithm.use_kl_loss",
    "trainer.critic.model.path",
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.placement.ref_num_gpus_per_node",
)
def bundle_fits_node(c: Context):
    g = num(c.s.cluster.gpus_per_node)
    if g is None:
        return
    for role, on in (("policy", True), ("ref", ref_on(c.s)), ("critic", critic_on(c.s))):
        v = getattr(c.p, f"{role}_num_gpus_per_node")
        if on and num(v) is not None and v > g:
            yield c.error(
                "RLC-E205",
                f"trainer.placement.{role}_num_gpus_per_node",
                f"{role}_num_gpus_per_node is {v} but a node has {g} GPUs",
                f"use at most {g} per node and more nodes",
                ["cluster.gpus_per_node"],
            )


@rule(
    "RLC-E206",
    "an engine larger than one node needs distributed_executor_backend: ray",
    f"{IE}.distributed_executor_backend",
    f"{IE}.tensor_parallel_size",
    "cluster.gpus_per_node",
    "generator.inference_engine.pipeline_parallel_size",
)
def multi_node_engine_needs_ray_backend(c: Context):
    g = num(c.s.cluster.gpus_per_node)
    size = c.ie.tensor_parallel_size * c.ie.pipeline_parallel_size
    if g is not None and c.ie.distributed_executor_backend == "mp" and size > g:
        yield c.error(
            "RLC-E206",
            f"{IE}.distributed_executor_backend",
            f"each engine rank needs tp*pp = {size} GPUs, more than a node's {g}; the mp executor runs on one node only",
            "set distributed_executor_backend: ray, or shrink the engine to one node",
            [f"{IE}.tensor_parallel_size", "cluster.gpus_per_node"],
        )


@rule(
    "RLC-W201",
    "an engine's tensor-parallel group spans nodes",
    f"{IE}.tensor_parallel_size",
    "cluster.gpus_per_node",
    "generator.inference_engine.distributed_executor_backend",
)
def engine_tensor_parallel_spans_nodes(c: Context):
    g = num(c.s.cluster.gpus_per_node)
    tp = num(c.ie.tensor_parallel_size)
    if g is not None and tp is not None and c.ie.distributed_executor_backend == "ray" and tp > g:
        yield c.warning(
            "RLC-W201",
            f"{IE}.tensor_parallel_size",
            f"tensor_parallel_size {tp} is larger than a node ({g} GPUs): each all-reduce crosses the slower inter-node network",
            "prefer pipeline_parallel_size across nodes and tensor parallelism inside one",
            ["cluster.gpus_per_node"],
        )


@rule(
    "RLC-W202",
    "the placement leaves GPUs of the cluster unused",
    "cluster.num_nodes",
    "cluster.gpus_per_node",
    "cluster.accelerator",
    "trainer.placement.allocation",
    "generator.inference_engine.data_parallel_size",
    "generator.inference_engine.num_engines",
    "generator.inference_engine.pipeline_parallel_size",
    "generator.inference_engine.run_engines_locally",
    "generator.inference_engine.tensor_parallel_size",
    "trainer.algorithm.use_kl_in_reward",
    "trainer.algorithm.use_kl_loss",
    "trainer.critic.model.path",
    "trainer.placement.colocate_all",
    "trainer.placement.colocate_policy_ref",
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.placement.critic_num_nodes",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.ref_num_nodes",
    "trainer.train_batch_size",
    "trainer.policy_mini_batch_size",
    "trainer.critic_mini_batch_size",
)
def placement_leaves_gpus_idle(c: Context):
    g, n = num(c.s.cluster.gpus_per_node), num(c.s.cluster.num_nodes)
    if g is None or n is None:
        return
    demand = gpu_demand(c.s)
    if demand < g * n:
        t = c.s.trainer
        batches = [t.train_batch_size, t.policy_mini_batch_size] + (
            [t.critic_mini_batch_size] if critic_on(c.s) else []
        )
        # Under colocate_all every GPU is a data-parallel rank: a proposal the batch sizes do not divide would only
        # trade W202 for E107.
        divides = all(isinstance(b, int) and b % (g * n) == 0 for b in batches)
        use = _use_the_cluster(c) if divides or not c.s.trainer.placement.colocate_all else None
        shrink = _smaller_cluster(c, demand)
        fixes = []
        if use:
            written = [k for k in PLACEMENT_COUNTS if c.origin(k)]
            fixes.append(
                f"to use all {g * n} GPUs, set {_settings(use)}"
                + (f" (or remove {', '.join(written)}: counts left unset follow cluster)" if written else "")
            )
        if shrink:
            fixes.append(f"to ask for the {demand} GPUs the job uses, set {_settings(shrink)}")
        yield c.warning(
            "RLC-W202",
            "cluster.num_nodes",
            f"the job uses {demand} of the cluster's {g * n} GPUs ({_demand_text(c)}); {g * n - demand} stay idle",
            "; or ".join(fixes) if fixes else "shrink the cluster, or raise the placement counts to use it",
            proposed_changes=use,
            smaller_cluster=shrink,
        )


def _settings(values: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in values.items())


def _use_the_cluster(c: Context) -> dict:
    """The placement counts that fill the cluster, as resolve derives them for a spec that sets none, where they
    differ from the spec's; empty where an allocation string sets the counts, the engines' size divides no node's
    worth of GPUs, or the roles and engines have GPUs of their own (separate groups split a node unevenly: 7 policy
    GPUs and 1 engine, which the batch sizes rarely divide)."""
    if c.p.allocation is not None or not c.p.colocate_all:
        return {}
    counts = colocated_counts(c.s, c.s.cluster.gpus_per_node, c.s.cluster.num_nodes)
    if c.ie.run_engines_locally and ENGINES not in counts:
        return {}
    return {k: v for k, v in counts.items() if get(c.s, k) != v}


def _smaller_cluster(c: Context, demand: int) -> dict:
    """The cluster of the GPUs the job uses: fewer nodes, or a node of fewer GPUs where it takes one."""
    cl = c.s.cluster
    g, n = cl.gpus_per_node, cl.num_nodes
    if demand > g:
        nodes = -(-demand // g)
        return {"cluster.num_nodes": nodes} if nodes < n else {}
    out: dict = {"cluster.num_nodes": 1} if n > 1 else {}
    if demand == g:
        pass
    elif c.origin("cluster.gpus_per_node") is None and c.origin("cluster.accelerator") and cl.accelerator != "none":
        out["cluster.accelerator"] = f"{cl.accelerator}:{demand}"  # the count was written there (H100:8)
    else:
        out["cluster.gpus_per_node"] = demand
    return out


MAX_DEVICES = 1_000_000


@rule(
    "RLC-E207",
    "the job asks for at most a million devices (the planner lays out each one)",
    "cluster.num_nodes",
    "generator.inference_engine.num_engines",
    "cluster.gpus_per_node",
    "generator.inference_engine.data_parallel_size",
    "generator.inference_engine.pipeline_parallel_size",
    "generator.inference_engine.run_engines_locally",
    "generator.inference_engine.tensor_parallel_size",
    "trainer.algorithm.use_kl_in_reward",
    "trainer.algorithm.use_kl_loss",
    "trainer.critic.model.path",
    "trainer.placement.colocate_all",
    "trainer.placement.colocate_policy_ref",
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.placement.critic_num_nodes",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.ref_num_nodes",
)
def job_size_bounded(c: Context):
    g, n = num(c.s.cluster.gpus_per_node), num(c.s.cluster.num_nodes)
    demand = gpu_demand(c.s)
    if demand > MAX_DEVICES or (g is not None and n is not None and g * n > MAX_DEVICES):
        key = (
            "cluster.num_nodes"
            if g is not None and n is not None and g * n > MAX_DEVICES
            else "generator.inference_engine.num_engines"
        )
        yield c.error(
            "RLC-E207",
            key,
            f"the job spans more than {MAX_DEVICES:,} devices ({max(demand, int((g or 0) * (n or 0))):,})",
            "check the counts for a typo: no cluster this large exists",
        )


RULES = (
    colocate_all_engines_match_policy,
    colocated_ref_matches_policy,
    colocate_all_roles_match_policy,
    placement_fits_cluster,
    bundle_fits_node,
    multi_node_engine_needs_ray_backend,
    engine_tensor_parallel_spans_nodes,
    placement_leaves_gpus_idle,
    job_size_bounded,
)
