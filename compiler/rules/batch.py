"""Batch-size rules: divisibility and the per-GPU arithmetic with data-parallel sizes."""

from __future__ import annotations

import math

from rlc.compiler.roles import critic_on, fsdp_roles, ref_on
from rlc.compiler.rules.base import Context, num, rule

B, MP, MC = "trainer.train_batch_size", "trainer.policy_mini_batch_size", "trainer.critic_mini_batch_size"
U, F, NS = (
    "trainer.micro_train_batch_size_per_gpu",
    "trainer.micro_forward_batch_size_per_gpu",
    "generator.n_samples_per_prompt",
)


# -- batch sizes ------------------------------------------------------------


def _mini_within_train(c: Context, code: str, key: str):
    """A mini batch is positive and no larger than the training batch."""
    b, m = num(c.t.train_batch_size), num(getattr(c.t, key.split(".")[-1]))
    if b is None or m is None:
        return
    name = key.split(".")[-1]
    if m <= 0:
        yield c.error(
            code, key, f"{name} is {m}; it must be positive", "set it to a divisor of train_batch_size, e.g. 256"
        )
    elif b < m:
        yield c.error(
            code,
            key,
            f"{name} ({m}) is larger than train_batch_size ({b})",
            f"lower {name} to at most {b}",
            [B],
            mini=m,
            train=b,
        )


@rule("RLC-E101", "train_batch_size >= policy_mini_batch_size > 0", B, MP)
def policy_mini_batch_within_train_batch(c: Context):
    yield from _mini_within_train(c, "RLC-E101", MP)


@rule("RLC-E102", "critic: train_batch_size >= critic_mini_batch_size > 0", B, MC, "trainer.critic.model.path")
def critic_mini_batch_within_train_batch(c: Context):
    if critic_on(c.s):
        yield from _mini_within_train(c, "RLC-E102", MC)


@rule("RLC-E103", "micro batch sizes are positive", U, F)
def micro_batches_positive(c: Context):
    for key, v in ((U, c.t.micro_train_batch_size_per_gpu), (F, c.t.micro_forward_batch_size_per_gpu)):
        if num(v) is not None and v <= 0:
            yield c.error(
                "RLC-E103", key, f"{key.split('.')[-1]} is {v}; it must be at least 1", f"set {key} to 1 or more"
            )


@rule(
    "RLC-E104",
    "Megatron: the role's GPU count is divisible by tp*pp*cp",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.policy.megatron_config.pipeline_model_parallel_size",
    "trainer.policy.megatron_config.context_parallel_size",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.algorithm.use_kl_loss",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.ref_num_nodes",
    "trainer.ref.megatron_config.context_parallel_size",
    "trainer.ref.megatron_config.pipeline_model_parallel_size",
    "trainer.ref.megatron_config.tensor_model_parallel_size",
    "trainer.strategy",
)
def megatron_world_divisible_by_model_parallel(c: Context):
    if not c.megatron:
        return
    for role in ("policy",) + (("ref",) if ref_on(c.s) else ()):
        w = c.world(role)
        mc = getattr(c.t, role).megatron_config
        size = mc.tensor_model_parallel_size * mc.pipeline_model_parallel_size * mc.context_parallel_size
        if w is not None and w % size:
            yield c.error(
                "RLC-E104",
                f"trainer.{role}.megatron_config.tensor_model_parallel_size",
                f"{role} runs on {w} GPUs, which tp*pp*cp = {mc.tensor_model_parallel_size}*{mc.pipeline_model_parallel_size}*{mc.context_parallel_size} = {size} does not divide",
                f"make the {role} GPU count a multiple of {size}, or change the parallel sizes",
                [f"trainer.placement.{role}_num_gpus_per_node", f"trainer.placement.{role}_num_nodes"],
                world=w,
                model_parallel=size,
            )


@rule("RLC-E105", "train_batch_size is a multiple of policy_mini_batch_size", B, MP)
def policy_mini_batch_divides_train_batch(c: Context):
    b, m = num(c.t.train_batch_size), num(c.t.policy_mini_batch_size)
    if b and m and b >= m > 0 and b % m:
        yield c.error(
            "RLC-E105",
            MP,
            f"policy_mini_batch_size ({m}) does not divide train_batch_size ({b})",
            f"use a divisor of {b}, e.g. {_divisor_near(int(b), int(m))}",
            [B],
            mini=m,
            train=b,
            proposed=_divisor_near(int(b), int(m)),
        )


def _per_gpu_sizes(c: Context, role: str, mini_key: str):
    """(mini batch per GPU, train batch per GPU, dp) of a role, or None when a value is unknown."""
    b, m, n = (
        num(c.t.train_batch_size),
        num(getattr(c.t, mini_key.split(".")[-1])),
        num(c.s.generator.n_samples_per_prompt),
    )
    dp = c.dp(role)
    if b is None or m is None or n is None or dp is None or m <= 0 or dp <= 0 or b < m:
        return None
    return (m * n) // dp, (b * n) // dp, dp


def _mini_per_gpu(c: Context, role: str, mini_key: str, code: str):
    sizes, u = _per_gpu_sizes(c, role, mini_key), num(c.t.micro_train_batch_size_per_gpu)
    if sizes is None or u is None or u <= 0:
        return
    mb_gpu, _, dp = sizes
    m, n = getattr(c.t, mini_key.split(".")[-1]), c.s.generator.n_samples_per_prompt
    if mb_gpu <= 0:
        yield c.error(
            code,
            mini_key,
            f"{role} mini batch per GPU is {m}*{n}//{dp} = 0: {m} prompts x {n} samples spread over {dp} data-parallel ranks leave none per GPU",
            f"raise {mini_key.split('.')[-1]} to at least {math.ceil(dp / n)} or use fewer GPUs",
            [NS, f"trainer.placement.{role}_num_gpus_per_node"],
            per_gpu=mb_gpu,
            dp=dp,
        )
    elif mb_gpu % u:
        yield c.error(
            code,
            U,
            f"{role} mini batch per GPU ({m}*{n}//{dp} = {mb_gpu}) is not a multiple of micro_train_batch_size_per_gpu ({u})",
            f"use a micro batch that divides {mb_gpu}, e.g. {_divisor_near(mb_gpu, int(u))}",
            [mini_key, NS],
            per_gpu=mb_gpu,
            micro=u,
            proposed=_divisor_near(mb_gpu, int(u)),
        )


def _train_per_gpu(c: Context, role: str, mini_key: str, code: str):
    sizes = _per_gpu_sizes(c, role, mini_key)
    if sizes is None or sizes[0] <= 0:
        return
    mb_gpu, tb_gpu, dp = sizes
    b, n = c.t.train_batch_size, c.s.generator.n_samples_per_prompt
    if tb_gpu % mb_gpu:
        yield c.error(
            code,
            B,
            f"{role} train batch per GPU ({b}*{n}//{dp} = {tb_gpu}) is not a multiple of the mini batch per GPU ({mb_gpu})",
            "make train_batch_size a multiple of the mini batch size and both divisible by the data-parallel size",
            [mini_key, NS],
            train_per_gpu=tb_gpu,
            mini_per_gpu=mb_gpu,
        )


@rule(
    "RLC-E106",
    "policy mini batch per GPU is positive and a multiple of the micro batch",
    MP,
    NS,
    U,
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.policy.megatron_config.context_parallel_size",
    "trainer.policy.megatron_config.pipeline_model_parallel_size",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.policy.sequence_parallel_size",
    "trainer.strategy",
    "trainer.train_batch_size",
)
def policy_mini_batch_per_gpu_fits_micro(c: Context):
    yield from _mini_per_gpu(c, "policy", MP, "RLC-E106")


@rule(
    "RLC-E107",
    "policy train batch per GPU is a multiple of the mini batch per GPU",
    B,
    MP,
    NS,
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.policy.megatron_config.context_parallel_size",
    "trainer.policy.megatron_config.pipeline_model_parallel_size",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.policy.sequence_parallel_size",
    "trainer.strategy",
)
def policy_train_batch_per_gpu_fits_mini(c: Context):
    yield from _train_per_gpu(c, "policy", MP, "RLC-E107")


@rule(
    "RLC-E108",
    "critic batch arithmetic (as for the policy)",
    MC,
    B,
    NS,
    U,
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.critic.model.path",
    "trainer.critic.sequence_parallel_size",
    "trainer.placement.critic_num_nodes",
    "trainer.strategy",
    "trainer.critic.strategy",
    "trainer.critic.megatron_config.tensor_model_parallel_size",
    "trainer.critic.megatron_config.pipeline_model_parallel_size",
    "trainer.critic.megatron_config.context_parallel_size",
)
def critic_batch_arithmetic(c: Context):
    if not critic_on(c.s):
        return
    b, m = num(c.t.train_batch_size), num(c.t.critic_mini_batch_size)
    if b and m and b >= m > 0 and b % m:
        yield c.error(
            "RLC-E108",
            MC,
            f"critic_mini_batch_size ({m}) does not divide train_batch_size ({b})",
            f"use a divisor of {b}",
            [B],
        )
        return
    yield from _mini_per_gpu(c, "critic", MC, "RLC-E108")
    yield from _train_per_gpu(c, "critic", MC, "RLC-E108")


@rule(
    "RLC-E109",
    "train_batch_size * n_samples_per_prompt >= lcm of policy and ref data-parallel sizes",
    B,
    NS,
    "trainer.algorithm.use_kl_in_reward",
    "trainer.algorithm.use_kl_loss",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.ref_num_nodes",
    "trainer.policy.megatron_config.context_parallel_size",
    "trainer.policy.megatron_config.pipeline_model_parallel_size",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.policy.sequence_parallel_size",
    "trainer.ref.megatron_config.context_parallel_size",
    "trainer.ref.megatron_config.pipeline_model_parallel_size",
    "trainer.ref.megatron_config.tensor_model_parallel_size",
    "trainer.ref.sequence_parallel_size",
    "trainer.strategy",
)
def train_batch_covers_data_parallel_ranks(c: Context):
    b, n = num(c.t.train_batch_size), num(c.s.generator.n_samples_per_prompt)
    found = [c.dp("policy")] + ([c.dp("ref")] if ref_on(c.s) else [])
    dps = [d for d in found if d is not None]
    if len(dps) < len(found) or b is None or n is None:
        return
    lcm = math.lcm(*dps)
    if b * n < lcm:
        yield c.error(
            "RLC-E109",
            B,
            f"a training batch holds {b}*{n} = {b * n} sequences, fewer than the {lcm} data-parallel ranks (lcm of policy/ref)",
            f"raise train_batch_size to at least {math.ceil(lcm / n)}",
            [NS],
            sequences=b * n,
            lcm=lcm,
        )


@rule(
    "RLC-W101",
    "mini batch * n_samples divides evenly over the policy data-parallel ranks",
    MP,
    NS,
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.policy.megatron_config.context_parallel_size",
    "trainer.policy.megatron_config.pipeline_model_parallel_size",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.policy.sequence_parallel_size",
    "trainer.strategy",
)
def mini_batch_spreads_evenly(c: Context):
    m, n, dp = num(c.t.policy_mini_batch_size), num(c.s.generator.n_samples_per_prompt), c.dp("policy")
    if m is not None and n is not None and dp is not None and m > 0 and dp > 0 and (m * n) // dp > 0 and (m * n) % dp:
        yield c.warning(
            "RLC-W101",
            MP,
            f"{m}*{n} = {m * n} sequences per mini batch do not split evenly over {dp} data-parallel ranks; {(m * n) % dp} are dropped from the per-GPU count",
            f"make policy_mini_batch_size * n_samples_per_prompt a multiple of {dp}",
            [NS],
        )


@rule(
    "RLC-E110",
    "FSDP: sequence_parallel_size divides the role's GPU count",
    "trainer.policy.sequence_parallel_size",
    "trainer.algorithm.use_kl_in_reward",
    "trainer.algorithm.use_kl_loss",
    "trainer.critic.model.path",
    "trainer.critic.sequence_parallel_size",
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.placement.critic_num_nodes",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.ref_num_nodes",
    "trainer.ref.sequence_parallel_size",
    "trainer.strategy",
    "trainer.critic.strategy",
)
def fsdp_world_divisible_by_sequence_parallel(c: Context):
    # The fsdp2 worker splits each row over groups of sp consecutive ranks: a world sp does not divide has no such
    # groups, and the worker refuses it at start-up.
    for role in fsdp_roles(c.s):  # Megatron has no Ulysses (RLC-E504)
        w, sp = c.world(role), getattr(c.t, role).sequence_parallel_size
        if w and isinstance(sp, int) and sp > 0 and w % sp:
            yield c.error(
                "RLC-E110",
                f"trainer.{role}.sequence_parallel_size",
                f"{role} runs on {w} GPUs, which sequence_parallel_size {sp} does not divide: the fsdp2 worker splits "
                f"each row over groups of {sp} GPUs",
                f"use a sequence_parallel_size that divides {w}, e.g. {_divisor_near(w, sp)}",
                [f"trainer.placement.{role}_num_gpus_per_node"],
                world=w,
                sp=sp,
                proposed=_divisor_near(w, sp),
            )


@rule(
    "RLC-W103",
    "a token budget per micro-batch holds the longest row the spec allows",
    "trainer.max_tokens_per_microbatch",
    "trainer.max_prompt_length",
    "generator.max_input_length",
    "generator.sampling_params.max_generate_length",
)
def token_budget_holds_the_longest_row(c: Context):
    budget, g = num(c.t.max_tokens_per_microbatch), c.s.generator
    prompt_key = "generator.max_input_length" if num(g.max_input_length) else "trainer.max_prompt_length"
    prompt = num(g.max_input_length) or num(c.t.max_prompt_length)
    response = num(g.sampling_params.max_generate_length)
    if budget is None or budget <= 0 or prompt is None or response is None or budget >= prompt + response:
        return
    longest = int(prompt + response)
    yield c.warning(
        "RLC-W103",
        "trainer.max_tokens_per_microbatch",
        f"max_tokens_per_microbatch {budget} is below the longest row the spec allows, {longest} tokens "
        f"({prompt_key.rsplit('.', 1)[1]} {prompt} + max_generate_length {response}): a row longer than the "
        "budget runs as a micro-batch of its own, over it (as in SkyRL)",
        f"raise max_tokens_per_microbatch to at least {longest} to bound every micro-batch",
        [prompt_key, "generator.sampling_params.max_generate_length"],
        budget=budget,
        longest=longest,
    )


def _divisor_near(n: int, target: int) -> int:
    """The divisor of n closest to target (for a hint); O(sqrt n), with a cheap answer for huge n."""
    n, target = int(n), int(target)
    if n <= 0:
        return 1
    root = math.isqrt(n)
    if root > 100_000:  # a hint is not worth a long search: gcd is a divisor too
        return math.gcd(n, max(target, 1)) or 1
    divisors = [d for i in range(1, root + 1) if n % i == 0 for d in (i, n // i)]
    return min(divisors, key=lambda d: (abs(d - target), -d))


RULES = (
    policy_mini_batch_within_train_batch,
    critic_mini_batch_within_train_batch,
    micro_batches_positive,
    megatron_world_divisible_by_model_parallel,
    policy_mini_batch_divides_train_batch,
    policy_mini_batch_per_gpu_fits_micro,
    policy_train_batch_per_gpu_fits_mini,
    critic_batch_arithmetic,
    train_batch_covers_data_parallel_ranks,
    mini_batch_spreads_evenly,
    fsdp_world_divisible_by_sequence_parallel,
    token_budget_holds_the_longest_row,
)
