"""Algorithm and generation rules: losses, KL, off-policy correction, generator and inference engines."""

from __future__ import annotations

from rlc.compiler.roles import critic_on, ref_on
from rlc.compiler.rules.base import Context, num, rule
from rlc.core import algorithms
from rlc.core.runtime_facts import CHAT_TEMPLATE_NAMES

IE = "generator.inference_engine"
NS = "generator.n_samples_per_prompt"


# -- algorithm ------------------------------------------------------------------

ALG = "trainer.algorithm"
# The cards' properties these rules refuse or require, by name for their titles.
CRITIC_ESTIMATORS = tuple(card.id for card in algorithms.ADVANTAGE_ESTIMATORS if card.needs_critic)
GROUP_ESTIMATORS = tuple(card for card in algorithms.ADVANTAGE_ESTIMATORS if card.min_group_size > 1)
PER_TOKEN_ESTIMATORS = tuple(card.id for card in algorithms.ADVANTAGE_ESTIMATORS if not card.per_trajectory)
MAX_SEQ_LEN_REDUCTIONS = tuple(card.id for card in algorithms.LOSS_REDUCTIONS if card.needs_max_seq_len)
UNCORRECTED_LOSSES = tuple(card.id for card in algorithms.POLICY_LOSSES if not card.off_policy_correction)


@rule(
    "RLC-E301",
    f"advantage_estimator {algorithms.listed(CRITIC_ESTIMATORS)} needs a critic",
    f"{ALG}.advantage_estimator",
    "trainer.critic.model.path",
)
def gae_needs_critic(c: Context):
    if algorithms.advantage_estimator(c.alg.advantage_estimator).needs_critic and not critic_on(c.s):
        yield c.error(
            "RLC-E301",
            f"{ALG}.advantage_estimator",
            f"advantage_estimator {c.alg.advantage_estimator} needs a value model, but trainer.critic.model.path is "
            "not set",
            "set trainer.critic.model.path (PPO), or use grpo/rloo/reinforce++",
            ["trainer.critic.model.path"],
        )


@rule(
    "RLC-E302",
    "use_kl_in_reward and use_kl_loss are mutually exclusive",
    f"{ALG}.use_kl_in_reward",
    f"{ALG}.use_kl_loss",
)
def kl_in_reward_excludes_kl_loss(c: Context):
    if c.alg.use_kl_in_reward and c.alg.use_kl_loss:
        yield c.error(
            "RLC-E302",
            f"{ALG}.use_kl_in_reward",
            "use_kl_in_reward and use_kl_loss are both true; the KL term is applied once, in one place",
            "set use_kl_loss: false to penalise rewards, or use_kl_in_reward: false",
            [f"{ALG}.use_kl_loss"],
        )


@rule(
    "RLC-E303",
    f"{algorithms.listed(MAX_SEQ_LEN_REDUCTIONS)} needs max_seq_len",
    f"{ALG}.loss_reduction",
    f"{ALG}.max_seq_len",
)
def token_sum_norm_needs_max_seq_len(c: Context):
    if c.alg.loss_reduction in MAX_SEQ_LEN_REDUCTIONS and c.alg.max_seq_len is None:
        yield c.error(
            "RLC-E303",
            f"{ALG}.max_seq_len",
            f"loss_reduction {c.alg.loss_reduction} needs max_seq_len",
            "set trainer.algorithm.max_seq_len",
        )


@rule("RLC-E315", "the dro loss needs dro.beta", f"{ALG}.policy_loss_type", f"{ALG}.dro.beta")
def dro_needs_beta(c: Context):
    if c.alg.policy_loss_type == "dro" and c.alg.dro.beta is None:
        yield c.error(
            "RLC-E315",
            f"{ALG}.dro.beta",
            "policy_loss_type dro needs dro.beta, the weight of its log-ratio penalty (verl has no default either)",
            "set trainer.algorithm.dro.beta, e.g. verl's actor_rollout_ref.actor.policy_loss.dro_beta",
        )


@rule(
    "RLC-E304",
    f"off-policy correction does not combine with {algorithms.listed(UNCORRECTED_LOSSES)}",
    f"{ALG}.off_policy_correction.tis_ratio_type",
    f"{ALG}.policy_loss_type",
    "trainer.algorithm.off_policy_correction.sequence_mask_metric",
    "trainer.algorithm.off_policy_correction.rejection_sampling",
)
def off_policy_correction_excludes_cov_losses(c: Context):
    opc = c.alg.off_policy_correction
    corrected = algorithms.policy_loss(c.alg.policy_loss_type).off_policy_correction
    if (opc.tis_ratio_type or opc.sequence_mask_metric or opc.rejection_sampling) and not corrected:
        key = (
            f"{ALG}.off_policy_correction.tis_ratio_type"
            if opc.tis_ratio_type
            else f"{ALG}.off_policy_correction.sequence_mask_metric"
            if opc.sequence_mask_metric
            else f"{ALG}.off_policy_correction.rejection_sampling"
        )
        yield c.error(
            "RLC-E304",
            key,
            f"off-policy correction is not implemented for policy_loss_type {c.alg.policy_loss_type}",
            "turn off_policy_correction off, or use another policy loss",
            [f"{ALG}.policy_loss_type"],
        )


@rule("RLC-E305", "max_ckpts_to_keep is -1 or positive", "trainer.max_ckpts_to_keep")
def max_ckpts_to_keep_valid(c: Context):
    if c.t.max_ckpts_to_keep == 0 or (num(c.t.max_ckpts_to_keep) is not None and c.t.max_ckpts_to_keep < -1):
        yield c.error(
            "RLC-E305",
            "trainer.max_ckpts_to_keep",
            f"max_ckpts_to_keep is {c.t.max_ckpts_to_keep}",
            "use -1 to keep all checkpoints or N > 0 to keep the last N",
        )


@rule("RLC-E306", "resume_mode from_path needs resume_path", "trainer.resume_mode", "trainer.resume_path")
def resume_from_path_needs_path(c: Context):
    if c.t.resume_mode == "from_path" and not c.t.resume_path:
        yield c.error(
            "RLC-E306",
            "trainer.resume_path",
            "resume_mode is from_path but resume_path is not set",
            "set trainer.resume_path to a checkpoint directory",
            ["trainer.resume_mode"],
        )


@rule("RLC-E314", "the policy names a model", "trainer.policy.model.path")
def policy_needs_model(c: Context):
    if not c.t.policy.model.path:
        yield c.error(
            "RLC-E314",
            "trainer.policy.model.path",
            "trainer.policy.model.path is not set: there is no model to train",
            "set trainer.policy.model.path to a Hugging Face id, a local directory or an embedded model (rlc:tiny)",
        )


@rule(
    "RLC-E307",
    f"step-wise trajectories need a per-trajectory advantage (not {algorithms.listed(PER_TOKEN_ESTIMATORS)})",
    "generator.step_wise_trajectories",
    f"{ALG}.advantage_estimator",
)
def step_wise_needs_per_trajectory_advantage(c: Context):
    if (
        c.s.generator.step_wise_trajectories
        and not algorithms.advantage_estimator(c.alg.advantage_estimator).per_trajectory
    ):
        yield c.error(
            "RLC-E307",
            f"{ALG}.advantage_estimator",
            f"step_wise_trajectories broadcasts one advantage per trajectory; {c.alg.advantage_estimator} computes per-token advantages",
            "use grpo or rloo with step_wise_trajectories",
            ["generator.step_wise_trajectories"],
        )


@rule("RLC-E308", "off-policy correction values are in range", f"{ALG}.off_policy_correction")
def off_policy_correction_in_range(c: Context):
    opc, k = c.alg.off_policy_correction, f"{ALG}.off_policy_correction"
    if opc.sequence_mask_metric == "geometric" and not opc.geo_mask_low < 1 < opc.geo_mask_high:
        yield c.error(
            "RLC-E308",
            f"{k}.geo_mask_low",
            f"the geometric mask band [{opc.geo_mask_low}, {opc.geo_mask_high}] must contain 1",
            "use values like 0.99 and 1.01",
        )
    if opc.sequence_mask_metric == "product" and not opc.product_mask_low < 1 < opc.product_mask_high:
        yield c.error(
            "RLC-E308",
            f"{k}.product_mask_low",
            f"the product mask band [{opc.product_mask_low}, {opc.product_mask_high}] must contain 1",
            "use values like 0.5 and 2.0",
        )
    for lo, hi in (
        ("outlier_token_is_threshold_low", "outlier_token_is_threshold_high"),
        ("token_mask_is_threshold_low", "token_mask_is_threshold_high"),
    ):
        a, b = getattr(opc, lo), getattr(opc, hi)
        if num(a) is not None and num(b) is not None and a >= b:
            yield c.error(
                "RLC-E308",
                f"{k}.{lo}",
                f"{lo} ({a}) must be below {hi} ({b})",
                f"lower {lo} or raise {hi}",
                [f"{k}.{hi}"],
            )
    if opc.tis_ratio_type == "token" and opc.token_tis_ratio_clip_high <= 1:
        yield c.error(
            "RLC-E308",
            f"{k}.token_tis_ratio_clip_high",
            f"token_tis_ratio_clip_high is {opc.token_tis_ratio_clip_high}; a cap at or below 1 clips every ratio",
            "use a cap between 1.5 and 5",
        )


@rule(
    "RLC-E310",
    "the loss's logit temperature is positive",
    f"{ALG}.temperature",
    "generator.sampling_params.temperature",
)
def loss_temperature_positive(c: Context):
    t = c.alg.temperature
    if num(t) is not None and t <= 0:
        yield c.error(
            "RLC-E310",
            f"{ALG}.temperature",
            f"the policy loss divides logits by temperature {t}; rollouts sampled greedily "
            "(temperature 0) cannot be trained on",
            "sample with temperature > 0 (e.g. 1.0), or set trainer.algorithm.temperature",
            ["generator.sampling_params.temperature"],
        )


@rule(
    "RLC-E309",
    "dynamic sampling replace needs a group to sample from (n_samples_per_prompt > 1)",
    f"{ALG}.dynamic_sampling.type",
    NS,
)
def dynamic_sampling_replace_needs_group(c: Context):
    if c.alg.dynamic_sampling.type is not None and c.s.generator.n_samples_per_prompt < 2:
        yield c.error(
            "RLC-E309",
            f"{ALG}.dynamic_sampling.type",
            "dynamic sampling filters groups by reward variance, which needs n_samples_per_prompt >= 2",
            "raise generator.n_samples_per_prompt",
            [NS],
        )


@rule(
    "RLC-E316",
    "; ".join(f"{card.id} needs n_samples_per_prompt >= {card.min_group_size}" for card in GROUP_ESTIMATORS),
    f"{ALG}.advantage_estimator",
    NS,
)
def estimator_has_its_group(c: Context):
    need = algorithms.advantage_estimator(c.alg.advantage_estimator).min_group_size
    if c.s.generator.n_samples_per_prompt < need:
        yield c.error(
            "RLC-E316",
            f"{ALG}.advantage_estimator",
            f"advantage_estimator {c.alg.advantage_estimator} compares each prompt's samples with one another and "
            f"needs n_samples_per_prompt >= {need}, got {c.s.generator.n_samples_per_prompt}",
            f"raise generator.n_samples_per_prompt to {need} or more",
            [NS],
        )


@rule(
    "RLC-E319",
    "gdpo_reward_keys are read by advantage_estimator gdpo, from env_class reward_function's dict, one weight a key",
    f"{ALG}.gdpo_reward_keys",
    f"{ALG}.gdpo_reward_weights",
    f"{ALG}.advantage_estimator",
    "environment.env_class",
    "generator.step_wise_trajectories",
)
def gdpo_components_have_their_source(c: Context):
    keys, weights = c.alg.gdpo_reward_keys, c.alg.gdpo_reward_weights
    if not keys:
        if weights:
            yield c.error("RLC-E319", f"{ALG}.gdpo_reward_weights", "gdpo_reward_weights weigh gdpo_reward_keys, "
                          "which are not set", f"set {ALG}.gdpo_reward_keys, or remove the weights")  # fmt: skip
        return
    problems = []
    if c.alg.advantage_estimator != "gdpo":
        problems.append(
            (
                f"{ALG}.advantage_estimator",
                f"advantage_estimator is {c.alg.advantage_estimator}, which reads none",
                f"set {ALG}.advantage_estimator: gdpo, or remove gdpo_reward_keys",
            )  # fmt: skip
        )
    if c.s.environment.env_class != "reward_function":
        problems.append(
            (
                "environment.env_class",
                f"env_class is {c.s.environment.env_class}, whose reward is one number",
                "score with env_class reward_function, whose function returns a dict holding each key",
            )  # fmt: skip
        )
    if weights is not None and len(weights) != len(keys):
        problems.append(
            (
                f"{ALG}.gdpo_reward_weights",
                f"{len(weights)} weight(s) for {len(keys)} key(s)",
                "give one weight per key, in the keys' order",
            )  # fmt: skip
        )
    if c.s.generator.step_wise_trajectories:
        problems.append(("generator.step_wise_trajectories", "step-wise rows take their trajectory's advantage",
                         "turn step_wise_trajectories off"))  # fmt: skip
    for key, what, fix in problems:
        yield c.error(
            "RLC-E319",
            key,
            f"gdpo_reward_keys {list(keys)} normalise the reward function's entries apart, but {what}",
            fix,
            [f"{ALG}.gdpo_reward_keys"],
        )


FA = "trainer.fully_async"
# Estimators that read what a step makes beside its rollouts (a card's `inputs`): a greedy response per prompt, the
# policy's pass over the batch.
STEP_INPUT_ESTIMATORS = tuple(card.id for card in algorithms.ADVANTAGE_ESTIMATORS if card.inputs)


@rule(
    "RLC-E317",
    f"advantage_estimator {algorithms.listed(STEP_INPUT_ESTIMATORS)} is not trained fully async",
    f"{ALG}.advantage_estimator",
    f"{FA}.enabled",
)
def step_inputs_are_synchronous(c: Context):
    card = algorithms.advantage_estimator(c.alg.advantage_estimator)
    if not (card.inputs and c.t.fully_async.enabled):
        return
    if card.needs_greedy_baseline:
        why = "a greedy response to each prompt, which the generator samples in the step"
    else:
        why = "the policy's old log-probs and sum of squared probabilities from a pass over the step's batch"
    yield c.error(
        "RLC-E317",
        f"{ALG}.advantage_estimator",
        f"advantage_estimator {c.alg.advantage_estimator} reads {why}; fully async training generates ahead of the "
        "step and takes the engine's log-probs as the old ones",
        "set trainer.fully_async.enabled: false, or use another estimator (e.g. grpo)",
        [f"{FA}.enabled"],
    )


@rule(
    "RLC-E311",
    "fully async training needs engines apart from the trainer (colocate_all false)",
    f"{FA}.enabled",
    "trainer.placement.colocate_all",
)
def fully_async_needs_separate_engines(c: Context):
    if c.t.fully_async.enabled and c.t.placement.colocate_all:
        yield c.error(
            "RLC-E311",
            f"{FA}.enabled",
            "fully async training generates while the trainer trains, but colocate_all puts "
            "both on the same GPUs, which then take turns",
            "set trainer.placement.colocate_all: false",
            ["trainer.placement.colocate_all"],
        )


@rule(
    "RLC-E312",
    "fully async training takes one optimizer step per batch and no dynamic sampling",
    f"{FA}.enabled",
    "trainer.policy_mini_batch_size",
    f"{ALG}.dynamic_sampling.type",
    "trainer.train_batch_size",
)
def fully_async_one_step_per_batch(c: Context):
    if not c.t.fully_async.enabled:
        return
    if num(c.t.train_batch_size) is not None and c.t.train_batch_size != c.t.policy_mini_batch_size:
        yield c.error(
            "RLC-E312",
            "trainer.policy_mini_batch_size",
            f"fully async training needs policy_mini_batch_size == "
            f"train_batch_size ({c.t.policy_mini_batch_size} != {c.t.train_batch_size})",
            f"set trainer.policy_mini_batch_size: {c.t.train_batch_size}",
            ["trainer.train_batch_size", f"{FA}.enabled"],
        )
    if c.alg.dynamic_sampling.type is not None:
        yield c.error(
            "RLC-E312",
            f"{ALG}.dynamic_sampling.type",
            "dynamic sampling regenerates a step's batch, which fully async training has already generated ahead",
            "remove trainer.algorithm.dynamic_sampling.type",
            [f"{FA}.enabled"],
        )


@rule(
    "RLC-E313",
    "fully async generation workers are between policy_mini_batch_size and that times (max_staleness_steps + 1)",
    f"{FA}.num_parallel_generation_workers",
    "trainer.fully_async.enabled",
    "trainer.fully_async.max_staleness_steps",
    "trainer.policy_mini_batch_size",
)
def fully_async_generation_workers_in_range(c: Context):
    fa, mp = c.t.fully_async, c.t.policy_mini_batch_size
    if not fa.enabled or num(mp) is None:
        return
    high = mp * (fa.max_staleness_steps + 1)
    if not mp <= fa.num_parallel_generation_workers <= high:
        yield c.error(
            "RLC-E313",
            f"{FA}.num_parallel_generation_workers",
            f"num_parallel_generation_workers "
            f"{fa.num_parallel_generation_workers} is outside [{mp}, {high}] (policy_mini_batch_size x "
            "(max_staleness_steps + 1)): fewer cannot fill a mini-batch, more would exceed the staleness bound",
            f"set trainer.fully_async.num_parallel_generation_workers between {mp} and {high}",
            ["trainer.policy_mini_batch_size", f"{FA}.max_staleness_steps"],
        )


# -- generator and inference engines ------------------------------------------------


@rule(
    "RLC-E401",
    "max_input_length equals max_prompt_length for single turn, and is at least it for multi-turn",
    "generator.max_input_length",
    "trainer.max_prompt_length",
    "generator.max_turns",
)
def input_length_matches_prompt_length(c: Context):
    g, mpl = c.s.generator, c.t.max_prompt_length
    if num(g.max_input_length) is None or num(mpl) is None:
        return
    if g.max_turns == 1 and g.max_input_length != mpl:
        yield c.error(
            "RLC-E401",
            "generator.max_input_length",
            f"single-turn generation needs max_input_length == max_prompt_length, but they are {g.max_input_length} and {mpl}",
            "leave generator.max_input_length unset (it follows trainer.max_prompt_length)",
            ["trainer.max_prompt_length", "generator.max_turns"],
        )
    elif g.max_input_length < mpl:
        yield c.error(
            "RLC-E401",
            "generator.max_input_length",
            f"max_input_length ({g.max_input_length}) is shorter than max_prompt_length ({mpl})",
            f"raise max_input_length to at least {mpl}",
            ["trainer.max_prompt_length"],
        )


@rule("RLC-E402", "logprobs is 0 or 1", "generator.sampling_params.logprobs", "generator.eval_sampling_params.logprobs")
def logprobs_zero_or_one(c: Context):
    for key, sp in (
        ("generator.sampling_params", c.s.generator.sampling_params),
        ("generator.eval_sampling_params", c.s.generator.eval_sampling_params),
    ):
        if sp is not None and num(sp.logprobs) is not None and sp.logprobs > 1:
            yield c.error(
                "RLC-E402",
                f"{key}.logprobs",
                f"logprobs is {sp.logprobs}; only the chosen token's log-prob is used (0 or 1)",
                "set logprobs: 1",
            )


@rule("RLC-W401", "wandb logging needs WANDB_API_KEY", "trainer.logger", "launch.secrets")
def wandb_needs_api_key(c: Context):
    secrets = (
        c.s.launch.secrets if isinstance(c.s.launch.secrets, list) else []
    )  # an interpolation may resolve to a scalar
    if c.t.logger == "wandb" and "WANDB_API_KEY" not in secrets and not c.env.get("WANDB_API_KEY"):
        yield c.warning(
            "RLC-W401",
            "trainer.logger",
            "trainer.logger is wandb but WANDB_API_KEY is neither in launch.secrets nor set here",
            "add WANDB_API_KEY to launch.secrets (the value stays on your machine), or set trainer.logger: console",
            ["launch.secrets"],
        )


@rule(
    "RLC-W402",
    "stop strings in multi-turn conversations without an appended EOS",
    "generator.sampling_params.stop",
    "generator.append_eos_token_after_stop_str_in_multi_turn",
    "generator.eval_sampling_params.stop",
    "generator.use_conversation_multi_turn",
)
def multi_turn_stop_strings_need_eos(c: Context):
    g = c.s.generator
    stops = g.sampling_params.stop or (g.eval_sampling_params.stop if g.eval_sampling_params else None)
    if g.use_conversation_multi_turn and stops and not g.append_eos_token_after_stop_str_in_multi_turn:
        yield c.warning(
            "RLC-W402",
            "generator.append_eos_token_after_stop_str_in_multi_turn",
            "stop strings end turns without an EOS token, so the chat template sees unterminated assistant messages",
            "set append_eos_token_after_stop_str_in_multi_turn: true",
            ["generator.sampling_params.stop"],
        )


@rule(
    "RLC-E403",
    "expert parallelism spans dp * tp",
    f"{IE}.expert_parallel_size",
    "generator.inference_engine.data_parallel_size",
    "generator.inference_engine.tensor_parallel_size",
)
def expert_parallel_spans_dp_tp(c: Context):
    ie = c.ie
    if ie.expert_parallel_size > 1 and ie.data_parallel_size * ie.tensor_parallel_size != ie.expert_parallel_size:
        yield c.error(
            "RLC-E403",
            f"{IE}.expert_parallel_size",
            f"expert_parallel_size ({ie.expert_parallel_size}) must equal data_parallel_size * tensor_parallel_size ({ie.data_parallel_size}*{ie.tensor_parallel_size})",
            f"set expert_parallel_size to {ie.data_parallel_size * ie.tensor_parallel_size}",
            [f"{IE}.data_parallel_size", f"{IE}.tensor_parallel_size"],
        )


@rule(
    "RLC-E404",
    "colocate_all needs engines this job starts (no external URLs)",
    f"{IE}.external_proxy_url",
    f"{IE}.external_server_urls",
    "trainer.placement.colocate_all",
)
def colocate_all_needs_local_engines(c: Context):
    if c.p.colocate_all and (c.ie.external_proxy_url or c.ie.external_server_urls):
        key = f"{IE}.external_proxy_url" if c.ie.external_proxy_url else f"{IE}.external_server_urls"
        yield c.error(
            "RLC-E404",
            key,
            "colocate_all shares the training GPUs with engines the job starts; external servers cannot share them",
            "set trainer.placement.colocate_all: false to use external servers",
            ["trainer.placement.colocate_all"],
        )


@rule(
    "RLC-E405",
    "remote engines need their addresses",
    f"{IE}.run_engines_locally",
    f"{IE}.remote_urls",
    "generator.inference_engine.external_proxy_url",
    "generator.inference_engine.external_server_urls",
    "trainer.placement.colocate_all",
)
def remote_engines_need_urls(c: Context):
    ie = c.ie
    if not ie.run_engines_locally and not (ie.remote_urls or ie.external_proxy_url or ie.external_server_urls):
        yield c.error(
            "RLC-E405",
            f"{IE}.run_engines_locally",
            "run_engines_locally is false but no remote engine address is given",
            f"set {IE}.remote_urls (host:port list) or external_server_urls",
            [f"{IE}.remote_urls"],
        )
    if not ie.run_engines_locally and c.p.colocate_all:
        yield c.error(
            "RLC-E405",
            f"{IE}.run_engines_locally",
            "run_engines_locally is false, so the engines cannot share the training GPUs (colocate_all)",
            "set trainer.placement.colocate_all: false",
            ["trainer.placement.colocate_all"],
        )


@rule(
    "RLC-E406",
    "chat_template source file needs name_or_path",
    "generator.chat_template.source",
    "generator.chat_template.name_or_path",
)
def chat_template_file_needs_path(c: Context):
    ct = c.s.generator.chat_template
    if ct.source == "file" and not ct.name_or_path:
        yield c.error(
            "RLC-E406",
            "generator.chat_template.name_or_path",
            "chat_template.source is file but name_or_path is not set",
            "set the path of the Jinja template",
        )


@rule(
    "RLC-E407",
    "batched generation is single-turn only",
    "generator.batched",
    "generator.max_turns",
    "generator.chat_template_kwargs",
)
def batched_generation_single_turn(c: Context):
    g = c.s.generator
    if g.batched and g.max_turns > 1:
        yield c.error(
            "RLC-E407",
            "generator.batched",
            f"batched generation runs one turn, but max_turns is {g.max_turns}",
            "set generator.batched: false for multi-turn",
            ["generator.max_turns"],
        )
    if g.batched and g.chat_template_kwargs:
        yield c.error(
            "RLC-E407",
            "generator.chat_template_kwargs",
            "chat_template_kwargs are not applied in batched generation",
            "set generator.batched: false",
            ["generator.batched"],
        )


@rule(
    "RLC-E408",
    "step-wise trajectories need conversation mode, unbatched generation and the tokenizer's chat template",
    "generator.step_wise_trajectories",
    "generator.use_conversation_multi_turn",
    "generator.batched",
    "generator.chat_template.name_or_path",
)
def step_wise_needs_conversations(c: Context):
    g = c.s.generator
    if not g.step_wise_trajectories:
        return
    for key, wrong, why, fix in (
        (
            "generator.use_conversation_multi_turn",
            not g.use_conversation_multi_turn,
            "each turn's row starts from the conversation so far, templated as chat messages",
            "set use_conversation_multi_turn: true",
        ),
        ("generator.batched", g.batched, "batched generation has no turns", "set batched: false"),
        (
            "generator.chat_template.name_or_path",
            bool(g.chat_template.name_or_path),
            "a custom template re-tokenizes the whole conversation, so turns have no rows of their own",
            "remove chat_template.name_or_path",
        ),
    ):
        if wrong:
            yield c.error(
                "RLC-E408",
                key,
                f"step_wise_trajectories cannot run with this setting: {why} (SkyRL refuses it too)",
                fix,
                ["generator.step_wise_trajectories"],
            )


@rule(
    "RLC-E409",
    "a custom chat template in conversation mode keeps no engine log-probs, which fully async training and "
    "off-policy correction need",
    "generator.chat_template.name_or_path",
    "generator.use_conversation_multi_turn",
    "trainer.fully_async.enabled",
    f"{ALG}.off_policy_correction.tis_ratio_type",
    f"{ALG}.off_policy_correction.sequence_mask_metric",
)
def custom_template_keeps_no_logprobs(c: Context):
    g, opc = c.s.generator, c.alg.off_policy_correction
    if not g.chat_template.name_or_path or not g.use_conversation_multi_turn:
        return
    needs = [
        key
        for key, on in (
            ("trainer.fully_async.enabled", c.t.fully_async.enabled),
            (f"{ALG}.off_policy_correction.tis_ratio_type", opc.tis_ratio_type is not None),
            (f"{ALG}.off_policy_correction.sequence_mask_metric", opc.sequence_mask_metric is not None),
        )
        if on
    ]
    if needs:
        yield c.error(
            "RLC-E409",
            "generator.chat_template.name_or_path",
            "a custom chat template re-templates the conversation every turn, so the engine's log-probs of the "
            f"trained tokens are not kept, but {', '.join(needs)} needs them",
            f"remove chat_template.name_or_path, or turn off {', '.join(needs)}",
            needs,
        )


@rule(
    "RLC-E410",
    "a chat template named by source: name is one rlc has",
    "generator.chat_template.source",
    "generator.chat_template.name_or_path",
)
def chat_template_name_known(c: Context):
    ct = c.s.generator.chat_template
    # An empty name is no template, as the runtime (and SkyRL) read it.
    if ct.source == "name" and ct.name_or_path and ct.name_or_path not in CHAT_TEMPLATE_NAMES:
        yield c.error(
            "RLC-E410",
            "generator.chat_template.name_or_path",
            f"rlc has no chat template named {ct.name_or_path!r} (it has {', '.join(CHAT_TEMPLATE_NAMES)})",
            "use one of those, or source: file with the path of a Jinja template",
        )


@rule(
    "RLC-E411",
    "language_model_only is set alike for the policy, its engines and the reference model (SkyRL's validate_cfg)",
    "trainer.policy.language_model_only",
    f"{IE}.language_model_only",
    "trainer.ref.language_model_only",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
)
def language_model_only_alike(c: Context):
    # SkyRL asserts it: the engines serve, and the reference model scores, the model the policy trains
    if not c.s.trainer.policy.language_model_only:
        return
    if not c.s.generator.inference_engine.language_model_only:
        yield c.error(
            "RLC-E411",
            f"{IE}.language_model_only",
            "trainer.policy.language_model_only is true but the engines' is false: they would serve the whole "
            "multimodal model while the policy trains its text model",
            f"set {IE}.language_model_only: true",
            ["trainer.policy.language_model_only"],
        )
    if ref_on(c.s) and not c.s.trainer.ref.language_model_only:
        yield c.error(
            "RLC-E411",
            "trainer.ref.language_model_only",
            "trainer.policy.language_model_only is true but the reference model's is false (a KL term reads it)",
            "set trainer.ref.language_model_only: true",
            ["trainer.policy.language_model_only"],
        )


RULES = (
    gae_needs_critic,
    kl_in_reward_excludes_kl_loss,
    token_sum_norm_needs_max_seq_len,
    dro_needs_beta,
    off_policy_correction_excludes_cov_losses,
    max_ckpts_to_keep_valid,
    resume_from_path_needs_path,
    policy_needs_model,
    step_wise_needs_per_trajectory_advantage,
    off_policy_correction_in_range,
    loss_temperature_positive,
    dynamic_sampling_replace_needs_group,
    estimator_has_its_group,
    step_inputs_are_synchronous,
    gdpo_components_have_their_source,
    fully_async_needs_separate_engines,
    fully_async_one_step_per_batch,
    fully_async_generation_workers_in_range,
    input_length_matches_prompt_length,
    logprobs_zero_or_one,
    wandb_needs_api_key,
    multi_turn_stop_strings_need_eos,
    expert_parallel_spans_dp_tp,
    colocate_all_needs_local_engines,
    remote_engines_need_urls,
    chat_template_file_needs_path,
    batched_generation_single_turn,
    step_wise_needs_conversations,
    custom_template_keeps_no_logprobs,
    chat_template_name_known,
    language_model_only_alike,
)
