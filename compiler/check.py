"""Semantic rules: what SkyRL asserts on a running cluster, decided here from the resolved config alone.

Each rule has a stable code (docs/rules.md lists them) and names the keys it involves, so `rlc explain`
can say which rules a key takes part in.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from rlc.compiler.diagnostics import ERROR, WARNING, Diagnostic
from rlc.compiler.resolve import critic_on, engine_gpus, gpu_demand, ref_on


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    keys: tuple[str, ...]
    fn: Callable[["Context"], Iterable[Diagnostic]]


RULES: list[Rule] = []


def rule(code: str, title: str, *keys: str):
    def deco(fn):
        RULES.append(Rule(code, title, keys, fn))
        return fn

    return deco


def num(v: Any) -> Optional[float]:
    """A numeric value, or None for strings left for the node to resolve (e.g. ${oc.env:...})."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Context:
    def __init__(self, spec: Any, locate: Callable[[str], Any], env: Optional[dict] = None):
        self.s = spec
        self.locate = locate
        self.env = os.environ if env is None else env

    def diag(self, severity: str, code: str, key: str, message: str, hint: str, related: Iterable[str] = (), **values) -> Diagnostic:
        return Diagnostic(code, severity, message, key=key, location=self.locate(key, list(related)), hint=hint,
                          values=values, related=list(related))

    def error(self, code, key, message, hint, related=(), **values) -> Diagnostic:
        return self.diag(ERROR, code, key, message, hint, related, **values)

    def warning(self, code, key, message, hint, related=(), **values) -> Diagnostic:
        return self.diag(WARNING, code, key, message, hint, related, **values)

    # shorthands
    @property
    def t(self):
        return self.s.trainer

    @property
    def p(self):
        return self.s.trainer.placement

    @property
    def ie(self):
        return self.s.generator.inference_engine

    @property
    def alg(self):
        return self.s.trainer.algorithm

    @property
    def megatron(self) -> bool:
        return self.t.strategy == "megatron"

    def world(self, role: str) -> Optional[int]:
        n, g = num(getattr(self.p, f"{role}_num_nodes")), num(getattr(self.p, f"{role}_num_gpus_per_node"))
        return int(n * g) if n is not None and g is not None else None

    def dp(self, role: str) -> Optional[int]:
        """Data-parallel size of a role: world / (tp*pp*cp) under Megatron, world // sp under FSDP."""
        w = self.world(role)
        if w is None:
            return None
        if self.megatron and role in ("policy", "ref"):
            mc = getattr(self.t, role).megatron_config
            size = mc.tensor_model_parallel_size * mc.pipeline_model_parallel_size * mc.context_parallel_size
            return w // size if w % size == 0 else None
        sp = getattr(self.t, role).sequence_parallel_size
        return w // sp if isinstance(sp, int) and sp > 0 else None


B, MP, MC = "trainer.train_batch_size", "trainer.policy_mini_batch_size", "trainer.critic_mini_batch_size"
U, F, NS = "trainer.micro_train_batch_size_per_gpu", "trainer.micro_forward_batch_size_per_gpu", "generator.n_samples_per_prompt"


# -- batch sizes (skyrl-rules.md §3.8) ------------------------------------------------------------

@rule("RLC-E101", "train_batch_size >= policy_mini_batch_size > 0", B, MP)
def _b1(c: Context):
    b, m = num(c.t.train_batch_size), num(c.t.policy_mini_batch_size)
    if b is None or m is None:
        return
    if m <= 0:
        yield c.error("RLC-E101", MP, f"policy_mini_batch_size is {m}; it must be positive", "set it to a divisor of train_batch_size, e.g. 256")
    elif b < m:
        yield c.error("RLC-E101", MP, f"policy_mini_batch_size ({m}) is larger than train_batch_size ({b})",
                      f"lower policy_mini_batch_size to at most {b}", [B], mini=m, train=b)


@rule("RLC-E102", "critic: train_batch_size >= critic_mini_batch_size > 0", B, MC, "trainer.critic.model.path")
def _b2(c: Context):
    if not critic_on(c.s):
        return
    b, m = num(c.t.train_batch_size), num(c.t.critic_mini_batch_size)
    if b is None or m is None:
        return
    if m <= 0:
        yield c.error("RLC-E102", MC, f"critic_mini_batch_size is {m}; it must be positive", "set it to a divisor of train_batch_size")
    elif b < m:
        yield c.error("RLC-E102", MC, f"critic_mini_batch_size ({m}) is larger than train_batch_size ({b})",
                      f"lower critic_mini_batch_size to at most {b}", [B])


@rule("RLC-E103", "micro batch sizes are positive", U, F)
def _b3(c: Context):
    for key, v in ((U, c.t.micro_train_batch_size_per_gpu), (F, c.t.micro_forward_batch_size_per_gpu)):
        if num(v) is not None and v <= 0:
            yield c.error("RLC-E103", key, f"{key.split('.')[-1]} is {v}; it must be at least 1", f"set {key} to 1 or more")


@rule("RLC-E104", "Megatron: the role's GPU count is divisible by tp*pp*cp", "trainer.policy.megatron_config.tensor_model_parallel_size",
      "trainer.policy.megatron_config.pipeline_model_parallel_size", "trainer.policy.megatron_config.context_parallel_size",
      "trainer.placement.policy_num_gpus_per_node", "trainer.placement.policy_num_nodes")
def _b4(c: Context):
    if not c.megatron:
        return
    for role in ("policy",) + (("ref",) if ref_on(c.s) else ()):
        w = c.world(role)
        mc = getattr(c.t, role).megatron_config
        size = mc.tensor_model_parallel_size * mc.pipeline_model_parallel_size * mc.context_parallel_size
        if w is not None and w % size:
            yield c.error("RLC-E104", f"trainer.{role}.megatron_config.tensor_model_parallel_size",
                          f"{role} runs on {w} GPUs, which tp*pp*cp = {mc.tensor_model_parallel_size}*{mc.pipeline_model_parallel_size}*{mc.context_parallel_size} = {size} does not divide",
                          f"make the {role} GPU count a multiple of {size}, or change the parallel sizes",
                          [f"trainer.placement.{role}_num_gpus_per_node", f"trainer.placement.{role}_num_nodes"], world=w, model_parallel=size)


@rule("RLC-E105", "train_batch_size is a multiple of policy_mini_batch_size", B, MP)
def _b5(c: Context):
    b, m = num(c.t.train_batch_size), num(c.t.policy_mini_batch_size)
    if b and m and b >= m > 0 and b % m:
        yield c.error("RLC-E105", MP, f"policy_mini_batch_size ({m}) does not divide train_batch_size ({b})",
                      f"use a divisor of {b}, e.g. {_divisor_near(int(b), int(m))}", [B], mini=m, train=b)


def _per_gpu_sizes(c: Context, role: str, mini_key: str):
    """(mini batch per GPU, train batch per GPU, dp) of a role, or None when a value is unknown."""
    b, m, n = num(c.t.train_batch_size), num(getattr(c.t, mini_key.split(".")[-1])), num(c.s.generator.n_samples_per_prompt)
    dp = c.dp(role)
    if None in (b, m, n, dp) or m <= 0 or dp <= 0 or b < m:
        return None
    return (m * n) // dp, (b * n) // dp, dp


def _mini_per_gpu(c: Context, role: str, mini_key: str, code: str):
    sizes, u = _per_gpu_sizes(c, role, mini_key), num(c.t.micro_train_batch_size_per_gpu)
    if sizes is None or u is None or u <= 0:
        return
    mb_gpu, _, dp = sizes
    m, n = getattr(c.t, mini_key.split(".")[-1]), c.s.generator.n_samples_per_prompt
    if mb_gpu <= 0:
        yield c.error(code, mini_key,
                      f"{role} mini batch per GPU is {m}*{n}//{dp} = 0: {m} prompts x {n} samples spread over {dp} data-parallel ranks leave none per GPU",
                      f"raise {mini_key.split('.')[-1]} to at least {math.ceil(dp / n)} or use fewer GPUs",
                      [NS, f"trainer.placement.{role}_num_gpus_per_node"], per_gpu=mb_gpu, dp=dp)
    elif mb_gpu % u:
        yield c.error(code, U,
                      f"{role} mini batch per GPU ({m}*{n}//{dp} = {mb_gpu}) is not a multiple of micro_train_batch_size_per_gpu ({u})",
                      f"use a micro batch that divides {mb_gpu}, e.g. {_divisor_near(mb_gpu, int(u))}", [mini_key, NS],
                      per_gpu=mb_gpu, micro=u)


def _train_per_gpu(c: Context, role: str, mini_key: str, code: str):
    sizes = _per_gpu_sizes(c, role, mini_key)
    if sizes is None or sizes[0] <= 0:
        return
    mb_gpu, tb_gpu, dp = sizes
    b, n = c.t.train_batch_size, c.s.generator.n_samples_per_prompt
    if tb_gpu % mb_gpu:
        yield c.error(code, B,
                      f"{role} train batch per GPU ({b}*{n}//{dp} = {tb_gpu}) is not a multiple of the mini batch per GPU ({mb_gpu})",
                      "make train_batch_size a multiple of the mini batch size and both divisible by the data-parallel size",
                      [mini_key, NS], train_per_gpu=tb_gpu, mini_per_gpu=mb_gpu)


@rule("RLC-E106", "policy mini batch per GPU is positive and a multiple of the micro batch", MP, NS, U, "trainer.placement.policy_num_gpus_per_node")
def _b6(c: Context):
    yield from _mini_per_gpu(c, "policy", MP, "RLC-E106")


@rule("RLC-E107", "policy train batch per GPU is a multiple of the mini batch per GPU", B, MP, NS)
def _b7(c: Context):
    yield from _train_per_gpu(c, "policy", MP, "RLC-E107")


@rule("RLC-E108", "critic batch arithmetic (as for the policy)", MC, B, NS, U, "trainer.placement.critic_num_gpus_per_node")
def _b8(c: Context):
    if not critic_on(c.s):
        return
    b, m = num(c.t.train_batch_size), num(c.t.critic_mini_batch_size)
    if b and m and b >= m > 0 and b % m:
        yield c.error("RLC-E108", MC, f"critic_mini_batch_size ({m}) does not divide train_batch_size ({b})",
                      f"use a divisor of {b}", [B])
        return
    yield from _mini_per_gpu(c, "critic", MC, "RLC-E108")
    yield from _train_per_gpu(c, "critic", MC, "RLC-E108")


@rule("RLC-E109", "train_batch_size * n_samples_per_prompt >= lcm of policy and ref data-parallel sizes", B, NS)
def _b9(c: Context):
    b, n = num(c.t.train_batch_size), num(c.s.generator.n_samples_per_prompt)
    dps = [c.dp("policy")] + ([c.dp("ref")] if ref_on(c.s) else [])
    if None in dps or b is None or n is None:
        return
    lcm = math.lcm(*dps)
    if b * n < lcm:
        yield c.error("RLC-E109", B, f"a training batch holds {b}*{n} = {b * n} sequences, fewer than the {lcm} data-parallel ranks (lcm of policy/ref)",
                      f"raise train_batch_size to at least {math.ceil(lcm / n)}", [NS], sequences=b * n, lcm=lcm)


@rule("RLC-W101", "mini batch * n_samples divides evenly over the policy data-parallel ranks", MP, NS)
def _w101(c: Context):
    m, n, dp = num(c.t.policy_mini_batch_size), num(c.s.generator.n_samples_per_prompt), c.dp("policy")
    if None not in (m, n, dp) and m > 0 and dp > 0 and (m * n) // dp > 0 and (m * n) % dp:
        yield c.warning("RLC-W101", MP, f"{m}*{n} = {m * n} sequences per mini batch do not split evenly over {dp} data-parallel ranks; {(m * n) % dp} are dropped from the per-GPU count",
                        f"make policy_mini_batch_size * n_samples_per_prompt a multiple of {dp}", [NS])


@rule("RLC-W102", "FSDP: the role's GPU count is divisible by its sequence_parallel_size", "trainer.policy.sequence_parallel_size")
def _w102(c: Context):
    if c.megatron:
        return
    for role in ("policy", "critic", "ref"):
        if (role == "critic" and not critic_on(c.s)) or (role == "ref" and not ref_on(c.s)):
            continue
        w, sp = c.world(role), getattr(c.t, role).sequence_parallel_size
        if w and isinstance(sp, int) and sp > 0 and w % sp:
            yield c.warning("RLC-W102", f"trainer.{role}.sequence_parallel_size",
                            f"{role} runs on {w} GPUs, which sequence_parallel_size {sp} does not divide; {w % sp} GPU(s) sit idle",
                            f"use a sequence_parallel_size that divides {w}")


# -- placement (skyrl-rules.md §3.7 C17/C18, §4) ------------------------------------------------------

IE = "generator.inference_engine"


@rule("RLC-E201", "colocate_all: policy GPUs == num_engines * tp * pp * dp", "trainer.placement.colocate_all",
      f"{IE}.num_engines", f"{IE}.tensor_parallel_size", "trainer.placement.policy_num_gpus_per_node")
def _c17(c: Context):
    if not c.p.colocate_all or not c.ie.run_engines_locally:
        return
    w = c.world("policy")
    inf = c.ie.num_engines * engine_gpus(c.ie)
    if w is not None and w != inf:
        per = engine_gpus(c.ie)
        fix = f"set {IE}.num_engines to {w // per}" if w % per == 0 else f"make policy GPUs a multiple of tp*pp*dp = {per}"
        yield c.error("RLC-E201", f"{IE}.num_engines",
                      f"colocate_all puts training and inference on the same GPUs, but the policy has {w} and the engines {c.ie.num_engines}*{c.ie.tensor_parallel_size}*{c.ie.pipeline_parallel_size}*{c.ie.data_parallel_size} = {inf}",
                      fix + " (or leave num_engines unset to derive it)", ["trainer.placement.policy_num_gpus_per_node", "trainer.placement.policy_num_nodes"],
                      policy_gpus=w, inference_gpus=inf)


@rule("RLC-E202", "colocate_policy_ref (not colocate_all): ref layout equals policy layout", "trainer.placement.colocate_policy_ref",
      "trainer.placement.ref_num_nodes", "trainer.placement.ref_num_gpus_per_node")
def _c18(c: Context):
    if c.p.colocate_all or not c.p.colocate_policy_ref or not ref_on(c.s):
        return
    for dim in ("num_nodes", "num_gpus_per_node"):
        pv, rv = getattr(c.p, f"policy_{dim}"), getattr(c.p, f"ref_{dim}")
        if pv != rv:
            yield c.error("RLC-E202", f"trainer.placement.ref_{dim}", f"colocate_policy_ref shares per-node bundles, but ref_{dim} ({rv}) differs from policy_{dim} ({pv})",
                          f"set ref_{dim} to {pv} (or colocate_policy_ref: false)", [f"trainer.placement.policy_{dim}"])


@rule("RLC-E203", "colocate_all: ref and critic GPUs equal policy GPUs", "trainer.placement.ref_num_gpus_per_node", "trainer.placement.critic_num_gpus_per_node")
def _colocate_roles(c: Context):
    if not c.p.colocate_all:
        return
    w = c.world("policy")
    for role, on in (("ref", ref_on(c.s)), ("critic", critic_on(c.s))):
        rw = c.world(role)
        if on and rw is not None and w is not None and rw != w:
            yield c.error("RLC-E203", f"trainer.placement.{role}_num_gpus_per_node",
                          f"colocate_all needs the {role} on the policy's GPUs, but it has {rw} and the policy {w}",
                          f"set {role}_num_nodes/{role}_num_gpus_per_node like the policy's, or leave them unset", ["trainer.placement.policy_num_gpus_per_node"])


@rule("RLC-E204", "the placement fits the cluster (GPUs in total)", "cluster.gpus_per_node", "cluster.num_nodes")
def _fits_total(c: Context):
    g, n = num(c.s.cluster.gpus_per_node), num(c.s.cluster.num_nodes)
    if g is None or n is None:
        return
    demand = gpu_demand(c.s)
    unit = "CPU slots" if c.s.cluster.accelerator == "none" else "GPUs"
    if demand > g * n:
        yield c.error("RLC-E204", "cluster.num_nodes", f"the job needs {demand} {unit} but the cluster has {n} x {g} = {g * n}",
                      f"raise cluster.num_nodes to {math.ceil(demand / g)} or shrink the placement", ["cluster.gpus_per_node"], demand=demand, capacity=g * n)


@rule("RLC-E205", "every per-node bundle fits one node", "cluster.gpus_per_node", "trainer.placement.policy_num_gpus_per_node")
def _fits_node(c: Context):
    g = num(c.s.cluster.gpus_per_node)
    if g is None:
        return
    for role, on in (("policy", True), ("ref", ref_on(c.s)), ("critic", critic_on(c.s))):
        v = getattr(c.p, f"{role}_num_gpus_per_node")
        if on and num(v) is not None and v > g:
            yield c.error("RLC-E205", f"trainer.placement.{role}_num_gpus_per_node", f"{role}_num_gpus_per_node is {v} but a node has {g} GPUs",
                          f"use at most {g} per node and more nodes", ["cluster.gpus_per_node"])


@rule("RLC-E206", "an engine larger than one node needs distributed_executor_backend: ray", f"{IE}.distributed_executor_backend", f"{IE}.tensor_parallel_size")
def _mp_fits(c: Context):
    g = num(c.s.cluster.gpus_per_node)
    size = c.ie.tensor_parallel_size * c.ie.pipeline_parallel_size
    if g is not None and c.ie.distributed_executor_backend == "mp" and size > g:
        yield c.error("RLC-E206", f"{IE}.distributed_executor_backend", f"each engine rank needs tp*pp = {size} GPUs, more than a node's {g}; the mp executor runs on one node only",
                      "set distributed_executor_backend: ray, or shrink the engine to one node", [f"{IE}.tensor_parallel_size", "cluster.gpus_per_node"])


@rule("RLC-W201", "an engine's tensor-parallel group spans nodes", f"{IE}.tensor_parallel_size", "cluster.gpus_per_node")
def _tp_spans(c: Context):
    g = num(c.s.cluster.gpus_per_node)
    tp = c.ie.tensor_parallel_size
    if g is not None and c.ie.distributed_executor_backend == "ray" and tp > g:
        yield c.warning("RLC-W201", f"{IE}.tensor_parallel_size", f"tensor_parallel_size {tp} is larger than a node ({g} GPUs): each all-reduce crosses the slower inter-node network",
                        "prefer pipeline_parallel_size across nodes and tensor parallelism inside one", ["cluster.gpus_per_node"])


@rule("RLC-W202", "the placement leaves GPUs of the cluster unused", "cluster.num_nodes")
def _idle(c: Context):
    g, n = num(c.s.cluster.gpus_per_node), num(c.s.cluster.num_nodes)
    if g is None or n is None:
        return
    demand = gpu_demand(c.s)
    if demand < g * n:
        yield c.warning("RLC-W202", "cluster.num_nodes", f"the job uses {demand} of the cluster's {g * n} GPUs; {g * n - demand} stay idle",
                        "leave the placement counts unset to derive them from cluster, or shrink the cluster")


# -- algorithm (skyrl-rules.md §3.7) ------------------------------------------------------------------

ALG = "trainer.algorithm"


@rule("RLC-E301", "advantage_estimator gae needs a critic", f"{ALG}.advantage_estimator", "trainer.critic.model.path")
def _c2(c: Context):
    if c.alg.advantage_estimator == "gae" and not critic_on(c.s):
        yield c.error("RLC-E301", f"{ALG}.advantage_estimator", "advantage_estimator gae needs a value model, but trainer.critic.model.path is not set",
                      "set trainer.critic.model.path (PPO), or use grpo/rloo/reinforce++", ["trainer.critic.model.path"])


@rule("RLC-E302", "use_kl_in_reward and use_kl_loss are mutually exclusive", f"{ALG}.use_kl_in_reward", f"{ALG}.use_kl_loss")
def _c3(c: Context):
    if c.alg.use_kl_in_reward and c.alg.use_kl_loss:
        yield c.error("RLC-E302", f"{ALG}.use_kl_in_reward", "use_kl_in_reward and use_kl_loss are both true; the KL term is applied once, in one place",
                      "set use_kl_loss: false to penalise rewards, or use_kl_in_reward: false", [f"{ALG}.use_kl_loss"])


@rule("RLC-E303", "seq_mean_token_sum_norm needs max_seq_len", f"{ALG}.loss_reduction", f"{ALG}.max_seq_len")
def _c13(c: Context):
    if c.alg.loss_reduction == "seq_mean_token_sum_norm" and c.alg.max_seq_len is None:
        yield c.error("RLC-E303", f"{ALG}.max_seq_len", "loss_reduction seq_mean_token_sum_norm needs max_seq_len", "set trainer.algorithm.max_seq_len")


@rule("RLC-E304", "off-policy correction does not combine with clip_cov or kl_cov", f"{ALG}.off_policy_correction.tis_ratio_type", f"{ALG}.policy_loss_type")
def _c15(c: Context):
    opc = c.alg.off_policy_correction
    if (opc.tis_ratio_type or opc.sequence_mask_metric) and c.alg.policy_loss_type in ("clip_cov", "kl_cov"):
        key = f"{ALG}.off_policy_correction.tis_ratio_type" if opc.tis_ratio_type else f"{ALG}.off_policy_correction.sequence_mask_metric"
        yield c.error("RLC-E304", key, f"off-policy correction is not implemented for policy_loss_type {c.alg.policy_loss_type}",
                      "turn off_policy_correction off, or use another policy loss", [f"{ALG}.policy_loss_type"])


@rule("RLC-E305", "max_ckpts_to_keep is -1 or positive", "trainer.max_ckpts_to_keep")
def _c6(c: Context):
    if c.t.max_ckpts_to_keep == 0 or (num(c.t.max_ckpts_to_keep) is not None and c.t.max_ckpts_to_keep < -1):
        yield c.error("RLC-E305", "trainer.max_ckpts_to_keep", f"max_ckpts_to_keep is {c.t.max_ckpts_to_keep}", "use -1 to keep all checkpoints or N > 0 to keep the last N")


@rule("RLC-E306", "resume_mode from_path needs resume_path", "trainer.resume_mode", "trainer.resume_path")
def _resume(c: Context):
    if c.t.resume_mode == "from_path" and not c.t.resume_path:
        yield c.error("RLC-E306", "trainer.resume_path", "resume_mode is from_path but resume_path is not set", "set trainer.resume_path to a checkpoint directory", ["trainer.resume_mode"])


@rule("RLC-E307", "step-wise trajectories need a per-trajectory advantage (not gae or reinforce++)", "generator.step_wise_trajectories", f"{ALG}.advantage_estimator")
def _c10(c: Context):
    if c.s.generator.step_wise_trajectories and c.alg.advantage_estimator in ("gae", "reinforce++"):
        yield c.error("RLC-E307", f"{ALG}.advantage_estimator", f"step_wise_trajectories broadcasts one advantage per trajectory; {c.alg.advantage_estimator} computes per-token advantages",
                      "use grpo or rloo with step_wise_trajectories", ["generator.step_wise_trajectories"])


@rule("RLC-E308", "off-policy correction values are in range", f"{ALG}.off_policy_correction")
def _opc_values(c: Context):
    opc, k = c.alg.off_policy_correction, f"{ALG}.off_policy_correction"
    if opc.sequence_mask_metric == "geometric" and not opc.geo_mask_low < 1 < opc.geo_mask_high:
        yield c.error("RLC-E308", f"{k}.geo_mask_low", f"the geometric mask band [{opc.geo_mask_low}, {opc.geo_mask_high}] must contain 1", "use values like 0.99 and 1.01")
    if opc.sequence_mask_metric == "product" and not opc.product_mask_low < 1 < opc.product_mask_high:
        yield c.error("RLC-E308", f"{k}.product_mask_low", f"the product mask band [{opc.product_mask_low}, {opc.product_mask_high}] must contain 1", "use values like 0.5 and 2.0")
    for lo, hi in (("outlier_token_is_threshold_low", "outlier_token_is_threshold_high"), ("token_mask_is_threshold_low", "token_mask_is_threshold_high")):
        a, b = getattr(opc, lo), getattr(opc, hi)
        if num(a) is not None and num(b) is not None and a >= b:
            yield c.error("RLC-E308", f"{k}.{lo}", f"{lo} ({a}) must be below {hi} ({b})", f"lower {lo} or raise {hi}", [f"{k}.{hi}"])
    if opc.tis_ratio_type == "token" and opc.token_tis_ratio_clip_high <= 1:
        yield c.error("RLC-E308", f"{k}.token_tis_ratio_clip_high", f"token_tis_ratio_clip_high is {opc.token_tis_ratio_clip_high}; a cap at or below 1 clips every ratio", "use a cap between 1.5 and 5")


@rule("RLC-E309", "dynamic sampling replace needs a group to sample from (n_samples_per_prompt > 1)", f"{ALG}.dynamic_sampling.type", NS)
def _dyn(c: Context):
    if c.alg.dynamic_sampling.type is not None and c.s.generator.n_samples_per_prompt < 2:
        yield c.error("RLC-E309", f"{ALG}.dynamic_sampling.type", "dynamic sampling filters groups by reward variance, which needs n_samples_per_prompt >= 2",
                      "raise generator.n_samples_per_prompt", [NS])


# -- generator and inference engines (§3.2, §3.4, §3.5) ------------------------------------------------

@rule("RLC-E401", "max_input_length equals max_prompt_length for single turn, and is at least it for multi-turn",
      "generator.max_input_length", "trainer.max_prompt_length", "generator.max_turns")
def _g1(c: Context):
    g, mpl = c.s.generator, c.t.max_prompt_length
    if num(g.max_input_length) is None or num(mpl) is None:
        return
    if g.max_turns == 1 and g.max_input_length != mpl:
        yield c.error("RLC-E401", "generator.max_input_length", f"single-turn generation needs max_input_length == max_prompt_length, but they are {g.max_input_length} and {mpl}",
                      "leave generator.max_input_length unset (it follows trainer.max_prompt_length)", ["trainer.max_prompt_length", "generator.max_turns"])
    elif g.max_input_length < mpl:
        yield c.error("RLC-E401", "generator.max_input_length", f"max_input_length ({g.max_input_length}) is shorter than max_prompt_length ({mpl})",
                      f"raise max_input_length to at least {mpl}", ["trainer.max_prompt_length"])


@rule("RLC-E402", "logprobs is 0 or 1", "generator.sampling_params.logprobs")
def _g3(c: Context):
    for key, sp in (("generator.sampling_params", c.s.generator.sampling_params), ("generator.eval_sampling_params", c.s.generator.eval_sampling_params)):
        if sp is not None and num(sp.logprobs) is not None and sp.logprobs > 1:
            yield c.error("RLC-E402", f"{key}.logprobs", f"logprobs is {sp.logprobs}; only the chosen token's log-prob is used (0 or 1)", "set logprobs: 1")


@rule("RLC-W401", "wandb logging needs WANDB_API_KEY", "trainer.logger", "launch.secrets")
def _g2(c: Context):
    if c.t.logger == "wandb" and "WANDB_API_KEY" not in c.s.launch.secrets and not c.env.get("WANDB_API_KEY"):
        yield c.warning("RLC-W401", "trainer.logger", "trainer.logger is wandb but WANDB_API_KEY is neither in launch.secrets nor set here",
                        "add WANDB_API_KEY to launch.secrets (the value stays on your machine), or set trainer.logger: console", ["launch.secrets"])


@rule("RLC-W402", "stop strings in multi-turn conversations without an appended EOS", "generator.sampling_params.stop")
def _g5(c: Context):
    g = c.s.generator
    stops = g.sampling_params.stop or (g.eval_sampling_params.stop if g.eval_sampling_params else None)
    if g.use_conversation_multi_turn and stops and not g.append_eos_token_after_stop_str_in_multi_turn:
        yield c.warning("RLC-W402", "generator.append_eos_token_after_stop_str_in_multi_turn",
                        "stop strings end turns without an EOS token, so the chat template sees unterminated assistant messages",
                        "set append_eos_token_after_stop_str_in_multi_turn: true", ["generator.sampling_params.stop"])


@rule("RLC-E403", "expert parallelism spans dp * tp", f"{IE}.expert_parallel_size")
def _i2(c: Context):
    ie = c.ie
    if ie.expert_parallel_size > 1 and ie.data_parallel_size * ie.tensor_parallel_size != ie.expert_parallel_size:
        yield c.error("RLC-E403", f"{IE}.expert_parallel_size", f"expert_parallel_size ({ie.expert_parallel_size}) must equal data_parallel_size * tensor_parallel_size ({ie.data_parallel_size}*{ie.tensor_parallel_size})",
                      f"set expert_parallel_size to {ie.data_parallel_size * ie.tensor_parallel_size}", [f"{IE}.data_parallel_size", f"{IE}.tensor_parallel_size"])


@rule("RLC-E404", "colocate_all needs engines this job starts (no external URLs)", f"{IE}.external_proxy_url", f"{IE}.external_server_urls")
def _n1(c: Context):
    if c.p.colocate_all and (c.ie.external_proxy_url or c.ie.external_server_urls):
        key = f"{IE}.external_proxy_url" if c.ie.external_proxy_url else f"{IE}.external_server_urls"
        yield c.error("RLC-E404", key, "colocate_all shares the training GPUs with engines the job starts; external servers cannot share them",
                      "set trainer.placement.colocate_all: false to use external servers", ["trainer.placement.colocate_all"])


@rule("RLC-E405", "remote engines need their addresses", f"{IE}.run_engines_locally", f"{IE}.remote_urls")
def _n2(c: Context):
    ie = c.ie
    if not ie.run_engines_locally and not (ie.remote_urls or ie.external_proxy_url or ie.external_server_urls):
        yield c.error("RLC-E405", f"{IE}.run_engines_locally", "run_engines_locally is false but no remote engine address is given",
                      f"set {IE}.remote_urls (host:port list) or external_server_urls", [f"{IE}.remote_urls"])
    if not ie.run_engines_locally and c.p.colocate_all:
        yield c.error("RLC-E405", f"{IE}.run_engines_locally", "run_engines_locally is false, so the engines cannot share the training GPUs (colocate_all)",
                      "set trainer.placement.colocate_all: false", ["trainer.placement.colocate_all"])


@rule("RLC-E406", "chat_template source file needs name_or_path", "generator.chat_template.source", "generator.chat_template.name_or_path")
def _chat(c: Context):
    ct = c.s.generator.chat_template
    if ct.source == "file" and not ct.name_or_path:
        yield c.error("RLC-E406", "generator.chat_template.name_or_path", "chat_template.source is file but name_or_path is not set", "set the path of the Jinja template")


@rule("RLC-E407", "batched generation is single-turn only", "generator.batched", "generator.max_turns")
def _batched(c: Context):
    g = c.s.generator
    if g.batched and g.max_turns > 1:
        yield c.error("RLC-E407", "generator.batched", f"batched generation runs one turn, but max_turns is {g.max_turns}", "set generator.batched: false for multi-turn", ["generator.max_turns"])
    if g.batched and g.chat_template_kwargs:
        yield c.error("RLC-E407", "generator.chat_template_kwargs", "chat_template_kwargs are not applied in batched generation", "set generator.batched: false", ["generator.batched"])


# -- Megatron (§3.3) ------------------------------------------------------------------------------------

@rule("RLC-E501", "Megatron syncs weights over nccl", f"{IE}.weight_sync_backend", "trainer.strategy")
def _m1(c: Context):
    if c.megatron and c.ie.weight_sync_backend != "nccl":
        yield c.error("RLC-E501", f"{IE}.weight_sync_backend", f"the megatron strategy syncs weights over nccl, not {c.ie.weight_sync_backend}", "set weight_sync_backend: nccl", ["trainer.strategy"])


@rule("RLC-E502", "Megatron needs the vllm inference backend", f"{IE}.backend", "trainer.strategy")
def _m2(c: Context):
    if c.megatron and c.ie.backend != "vllm":
        yield c.error("RLC-E502", f"{IE}.backend", f"the megatron strategy runs with vllm engines, not {c.ie.backend}", "set backend: vllm, or strategy: fsdp2", ["trainer.strategy"])


@rule("RLC-E503", "Megatron trains no critic (GRPO-style only)", "trainer.critic.model.path", "trainer.strategy")
def _m3(c: Context):
    if c.megatron and critic_on(c.s):
        yield c.error("RLC-E503", "trainer.critic.model.path", "the megatron strategy has no critic; PPO with a value model needs fsdp2", "use strategy: fsdp2, or drop the critic", ["trainer.strategy"])


@rule("RLC-E504", "Megatron uses no Ulysses sequence parallelism", "trainer.policy.sequence_parallel_size", "trainer.strategy")
def _m7(c: Context):
    if not c.megatron:
        return
    for role in ("policy", "ref"):
        sp = getattr(c.t, role).sequence_parallel_size
        if sp != 1:
            yield c.error("RLC-E504", f"trainer.{role}.sequence_parallel_size", f"sequence_parallel_size is {sp}; Megatron splits sequences with context_parallel_size instead",
                          f"set sequence_parallel_size: 1 and megatron_config.context_parallel_size: {sp}", ["trainer.strategy"])


@rule("RLC-W501", "Megatron: world divisible by pp * ep * etp", "trainer.policy.megatron_config.expert_model_parallel_size")
def _ep(c: Context):
    if not c.megatron:
        return
    mc, w = c.t.policy.megatron_config, c.world("policy")
    etp = mc.expert_tensor_parallel_size or mc.tensor_model_parallel_size
    size = mc.pipeline_model_parallel_size * mc.expert_model_parallel_size * etp
    if w and w % size:
        yield c.warning("RLC-W501", "trainer.policy.megatron_config.expert_model_parallel_size",
                        f"policy GPUs ({w}) are not divisible by pp*ep*etp = {size}; Megatron-Core will refuse this expert layout", f"make {w} a multiple of {size}")


# -- LoRA (§3.7 C16) -------------------------------------------------------------------------------------

@rule("RLC-E601", "LoRA adapters sync to vllm engines only", "trainer.policy.model.lora.rank", f"{IE}.backend")
def _c16(c: Context):
    if c.t.policy.model.lora.rank > 0 and c.ie.backend != "vllm":
        yield c.error("RLC-E601", "trainer.policy.model.lora.rank", f"LoRA adapters are loaded into vllm engines; backend is {c.ie.backend}", "set backend: vllm, or lora.rank: 0", [f"{IE}.backend"])


@rule("RLC-E602", "LoRA alpha is positive when LoRA is on", "trainer.policy.model.lora.alpha")
def _lora_alpha(c: Context):
    for role in ("policy", "critic"):
        lora = getattr(c.t, role).model.lora
        if lora.rank > 0 and lora.alpha <= 0:
            yield c.error("RLC-E602", f"trainer.{role}.model.lora.alpha", f"lora.alpha is {lora.alpha}; the adapter would be scaled to nothing", "use alpha > 0 (commonly 2 x rank)")


def _divisor_near(n: int, target: int) -> int:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    return min(divs, key=lambda d: (abs(d - target), -d)) if divs else 1


def check(spec: Any, locate: Callable[[str], Any], env: Optional[dict] = None) -> list[Diagnostic]:
    ctx = Context(spec, locate, env)
    out: list[Diagnostic] = []
    for r in RULES:
        try:
            out.extend(r.fn(ctx))
        except (TypeError, ZeroDivisionError, AttributeError):
            continue  # a value of the wrong type was already reported by the schema
    return out


def rules_for(key: str) -> list[Rule]:
    return [r for r in RULES if any(key == k or k.startswith(key + ".") or key.startswith(k + ".") for k in r.keys)]
