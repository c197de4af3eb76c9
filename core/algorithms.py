"""The built-in algorithms, one card each: every policy loss, advantage estimator, KL estimator and loss reduction,
with the runtime function that computes it and the properties the compiler and the importers reason with. The spec's
accepted values (`rlc.spec.algorithm`), the compiler's rules, the importers' name maps and the runtime's registries
(`rlc.runtime.algorithms.registry`) all derive from these cards. A new algorithm is a function in
`runtime/algorithms/` and one card here.

The cards are plain data in core, as the environments are (`core.environments`), because both sides read them: the
compiler checks a spec without importing torch, and the runtime needs of each function only its import path,
"module:function". A value an extension adds (`ext.add_values`) has no card: rlc assumes of it what a card's
defaults say, and its function comes from an entry point (docs/extensions.md).
"""

from __future__ import annotations

from rlc.core.dataclass import dataclass

_LOSSES = "rlc.runtime.algorithms.losses"
_ADVANTAGES = "rlc.runtime.algorithms.advantages"
_KL = "rlc.runtime.algorithms.kl"


@dataclass(frozen=True)
class PolicyLoss:
    """A `trainer.algorithm.policy_loss_type`; the defaults are what rlc assumes of an extension's loss."""

    id: str
    # The per-token loss, "module:function", called (log_probs, old_log_probs, advantages, mask, **options) ->
    # (token_loss, metrics); None only on the card an extension's loss gets.
    function: str | None
    doc: str
    # Its keyword options, as attribute paths into trainer.algorithm; the keyword is the last part.
    options: tuple[str, ...] = ()
    # It applies trainer.algorithm.off_policy_correction (SkyRL ignores the correction for the others; RLC-E304).
    off_policy_correction: bool = True
    # Every token's loss is its advantage times a factor computed from its own row: a row whose advantages are all 0
    # adds exactly nothing to the loss or its gradient, so the trainer leaves it out (clip_cov and kl_cov centre
    # their covariances over the whole batch, so every row shapes the others' terms; cross_entropy reads no
    # advantage).
    advantage_weighted: bool = False
    # Its ratio is against the engine's log-probs: the engines must return them, and the worker passes them on as
    # `rollout_log_probs`.
    rollout_anchored: bool = False
    # What its importance ratio is taken over: each token, or the whole sequence (SkyRL's and AReaL's
    # importance_sampling_level).
    ratio_level: str = "token"
    # It applies off_policy_correction itself, per micro-batch against the current log-probs (verl's bypass mode):
    # the trainer does not apply it to the scored batch.
    corrects_in_loss: bool = False
    verl: tuple[str, ...] = ()  # verl's actor.policy_loss.loss_mode names for it


@dataclass(frozen=True)
class AdvantageEstimator:
    """A `trainer.algorithm.advantage_estimator`; the defaults are what rlc assumes of an extension's estimator."""

    id: str
    # "module:function", called (rewards, mask, *, index, values, algorithm) -> (advantages, returns)
    function: str
    doc: str
    needs_critic: bool = False  # it reads the critic's values (RLC-E301)
    # One advantage per trajectory, which step-wise trajectories broadcast to each step (RLC-E307); else per token.
    per_trajectory: bool = True
    # It measures a row against its own group (the mean of its prompt's samples): a group whose rewards are all
    # equal gets advantage 0 on every row.
    group_baseline: bool = False
    min_group_size: int = 1  # the samples of a prompt it needs (generator.n_samples_per_prompt, RLC-E316)
    # The batch's fields (rlc.runtime.batch.TrainBatch) it reads beyond the rewards, passed as keywords of the same
    # names; the runtime produces a field only for an estimator that lists it (the properties below).
    inputs: tuple[str, ...] = ()
    verl: tuple[str, ...] = ()  # verl's algorithm.adv_estimator names for it

    @property
    def needs_greedy_baseline(self) -> bool:
        """The generator also samples one greedy response per prompt, whose reward is each row's
        `reward_baselines` (RLC-E317)."""
        return "reward_baselines" in self.inputs

    @property
    def needs_sum_pi_squared(self) -> bool:
        """The policy's old-log-prob pass also gives each token's sum of squared probabilities, `sum_pi_squared`
        (RLC-E317)."""
        return "sum_pi_squared" in self.inputs


@dataclass(frozen=True)
class KLEstimator:
    """A `trainer.algorithm.kl_estimator_type`."""

    id: str
    function: str  # "module:function", called (log_probs, ref_log_probs) -> per-token KL
    doc: str
    verl: tuple[str, ...] = ()  # verl's kl_loss_type / kl_penalty names for it


@dataclass(frozen=True)
class LossReduction:
    """A `trainer.algorithm.loss_reduction`: how token losses reduce to a scalar."""

    id: str
    # "module:function", called (mask, *, total_tokens, total_sequences, max_seq_len) -> per-token weights whose
    # sum with the token losses over a mini-batch is the reduced loss; for a reduction `over_mini_batch`, called
    # (mask, group, *, micro_batch_size, max_seq_len) with the whole mini-batch's rows, in its order.
    function: str
    doc: str
    needs_max_seq_len: bool = False  # it divides by trainer.algorithm.max_seq_len (RLC-E303)
    verl: tuple[str, ...] = ()  # verl's actor.loss_agg_mode names for it
    # its weights depend on the mini-batch's rows beyond a count (their prompts, their order): the driver computes
    # them over the whole mini-batch, and the ranks take them as given
    over_mini_batch: bool = False


_PPO_CLIP = ("eps_clip_low", "eps_clip_high")
# trainer.algorithm.off_policy_correction's fields (rlc.runtime.algorithms.off_policy's keyword options).
OFF_POLICY_OPTIONS = (
    "tis_ratio_type",
    "token_tis_ratio_clip_high",
    "sequence_tis_ratio_clip_high",
    "sequence_mask_metric",
    "geo_mask_high",
    "geo_mask_low",
    "product_mask_high",
    "product_mask_low",
    "outlier_token_is_threshold_low",
    "outlier_token_is_threshold_high",
    "token_mask_is_threshold_low",
    "token_mask_is_threshold_high",
    "tis_ratio_clip_low",
    "tis_batch_normalize",
    "rejection_sampling",
    "rejection_threshold_high",
    "rejection_threshold_low",
    "m2po_threshold",
)

# In the order the spec and `rlc explain` list them.
POLICY_LOSSES: tuple[PolicyLoss, ...] = (
    PolicyLoss(
        "regular",
        f"{_LOSSES}:regular_token_loss",
        "PPO's clipped surrogate",
        options=(*_PPO_CLIP, "clip_ratio_c"),
        advantage_weighted=True,
    ),
    PolicyLoss(
        "dual_clip",
        f"{_LOSSES}:dual_clip_token_loss",
        "PPO's clipped surrogate, capped at -clip_ratio_c * A for negative advantages",
        options=(*_PPO_CLIP, "clip_ratio_c"),
        advantage_weighted=True,
        verl=("vanilla",),
    ),
    PolicyLoss(
        "gspo",
        f"{_LOSSES}:gspo_token_loss",
        "GSPO: the PPO clip on a sequence-level ratio",
        options=_PPO_CLIP,
        advantage_weighted=True,
        ratio_level="sequence",
        verl=("gspo",),
    ),
    PolicyLoss(
        "clip_cov",
        f"{_LOSSES}:clip_cov_token_loss",
        "Clip-Cov: the PPO loss with a few high-covariance tokens dropped",
        options=(*_PPO_CLIP, "clip_cov.clip_ratio", "clip_cov.clip_cov_lb", "clip_cov.clip_cov_ub"),
        off_policy_correction=False,
        verl=("clip_cov",),
    ),
    PolicyLoss(
        "kl_cov",
        f"{_LOSSES}:kl_cov_token_loss",
        "KL-Cov: -r*A with a KL penalty on the top-covariance tokens",
        options=("kl_cov.kl_cov_frac", "kl_cov.ppo_kl_coef"),
        off_policy_correction=False,
        verl=("kl_cov",),
    ),
    PolicyLoss(
        "cispo",
        f"{_LOSSES}:cispo_token_loss",
        "CISPO: a clipped ratio weighting a REINFORCE gradient",
        options=("cispo.cispo_eps_clip_low", "cispo.cispo_eps_clip_high"),
        advantage_weighted=True,
        verl=("cispo",),
    ),
    PolicyLoss(
        "sapo",
        f"{_LOSSES}:sapo_token_loss",
        "SAPO: a soft sigmoid gate instead of a hard clip",
        options=("sapo.tau_pos", "sapo.tau_neg"),
        advantage_weighted=True,
        verl=("sapo",),
    ),
    PolicyLoss(
        "rollout_is",
        f"{_LOSSES}:rollout_is_token_loss",
        "importance sampling against the engine's log-probs, zero outside the clip band",
        options=_PPO_CLIP,
        advantage_weighted=True,
        rollout_anchored=True,
    ),
    PolicyLoss(
        "bypass",
        "rlc.runtime.algorithms.bypass:bypass_token_loss",
        "verl's bypass mode: the engine's log-probs are the old ones, off_policy_correction is applied in the loss "
        "against the current policy, and bypass.loss_type is PPO's clip (ppo_clip) or -w * A * log p (reinforce)",
        options=(
            "bypass.loss_type",
            *_PPO_CLIP,
            "clip_ratio_c",
            *(f"off_policy_correction.{name}" for name in OFF_POLICY_OPTIONS),
        ),
        advantage_weighted=True,
        rollout_anchored=True,
        corrects_in_loss=True,
        verl=("bypass_mode",),
    ),
    PolicyLoss(
        "importance_sampling",
        f"{_LOSSES}:importance_sampling_token_loss",
        "the importance-sampled policy gradient -r * A, unclipped",
        off_policy_correction=False,
        advantage_weighted=True,
    ),
    PolicyLoss(
        "cross_entropy",
        f"{_LOSSES}:cross_entropy_token_loss",
        "the sampled tokens' negative log-likelihood (SFT)",
        off_policy_correction=False,
    ),
    PolicyLoss(
        "dppo",
        f"{_LOSSES}:dppo_token_loss",
        "SkyRL's DPPO: -r*A against the engine's log-probs, without the tokens whose probability moved past "
        "dppo.delta_low/high (TV or binary KL); verl's dppo_tv and dppo_kl differ (a REINFORCE form, a truncated "
        "ratio, the old log-probs)",
        options=("dppo.dppo_type", "dppo.delta_low", "dppo.delta_high"),
        advantage_weighted=True,
        rollout_anchored=True,
    ),
    PolicyLoss(
        "dppo_tv",
        f"{_LOSSES}:dppo_tv_token_loss",
        "verl's DPPO Binary-TV: -A * sg(min(r, clip_ratio_c)) * log p, without the tokens whose probability moved "
        "past eps_clip_low/high in the advantage's direction",
        options=(*_PPO_CLIP, "clip_ratio_c"),
        advantage_weighted=True,
        verl=("dppo_tv",),
    ),
    PolicyLoss(
        "dppo_kl",
        f"{_LOSSES}:dppo_kl_token_loss",
        "verl's DPPO Binary-KL: as dppo_tv, the threshold on the binary KL of the token's old and new probability",
        options=(*_PPO_CLIP, "clip_ratio_c"),
        advantage_weighted=True,
        verl=("dppo_kl",),
    ),
    PolicyLoss(
        "gpg",
        f"{_LOSSES}:gpg_token_loss",
        "verl's GPG: the plain policy gradient -A * log p",
        advantage_weighted=True,
        verl=("gpg",),
    ),
    PolicyLoss(
        "dro",
        f"{_LOSSES}:dro_token_loss",
        "verl's DRO: -(A * log p - beta/2 * (log r)^2), a quadratic penalty on the log-ratio (dro.beta)",
        options=("dro.beta",),
        verl=("dro",),
    ),
    PolicyLoss(
        "geo_mean",
        f"{_LOSSES}:geo_mean_token_loss",
        "verl's GMPO: a sequence's -A times the geometric mean of its clipped token ratios",
        options=_PPO_CLIP,
        advantage_weighted=True,
        ratio_level="sequence",
        verl=("geo_mean",),
    ),
)

ADVANTAGE_ESTIMATORS: tuple[AdvantageEstimator, ...] = (
    AdvantageEstimator(
        "grpo",
        f"{_ADVANTAGES}:grpo",
        "a sequence's score against its group's mean, over the group's std (grpo_norm_by_std)",
        group_baseline=True,
        verl=("grpo", "grpo_vectorized"),
    ),
    AdvantageEstimator(
        "gae",
        f"{_ADVANTAGES}:gae",
        "GAE(gamma, lambd) from per-token rewards and the critic's values",
        needs_critic=True,
        per_trajectory=False,
        verl=("gae",),
    ),
    AdvantageEstimator(
        "rloo",
        f"{_ADVANTAGES}:rloo",
        "a sequence's score against the mean of its prompt's other samples",
        group_baseline=True,
        verl=("rloo_vectorized",),
    ),
    AdvantageEstimator(
        "rloo_verl",
        f"{_ADVANTAGES}:rloo_verl",
        "verl's rloo: as rloo, but a prompt's only sample keeps its score (SkyRL's rloo and verl's rloo_vectorized "
        "give it 0)",
        group_baseline=True,
        verl=("rloo",),
    ),
    AdvantageEstimator(
        "reinforce++",
        f"{_ADVANTAGES}:reinforce_pp",
        "the discounted return-to-go per token, whitened over the batch; a masked token ends the return",
        per_trajectory=False,
    ),
    AdvantageEstimator(
        "reinforce++_verl",
        f"{_ADVANTAGES}:reinforce_pp_verl",
        "verl's reinforce_plus_plus: as reinforce++, but the return carries across masked tokens (SkyRL's stops "
        "there; the two differ only where a mask has holes, as multi-turn observations make)",
        per_trajectory=False,
        verl=("reinforce_plus_plus",),
    ),
    AdvantageEstimator(
        "reinforce_plus_plus_baseline",
        f"{_ADVANTAGES}:reinforce_pp_baseline",
        "verl's REINFORCE++ with a baseline: a sequence's score against its group's mean, whitened over the batch",
        verl=("reinforce_plus_plus_baseline",),
    ),
    AdvantageEstimator(
        "gpg",
        f"{_ADVANTAGES}:gpg",
        "verl's GPG: a sequence's score against its group's mean, times batch size over the non-zero scores",
        group_baseline=True,
        verl=("gpg",),
    ),
    AdvantageEstimator(
        "opo",
        f"{_ADVANTAGES}:opo",
        "verl's OPO: a sequence's score against its group's length-weighted mean score",
        group_baseline=True,
        verl=("opo",),
    ),
    AdvantageEstimator(
        "grpo_passk",
        f"{_ADVANTAGES}:grpo_passk",
        "verl's pass@k GRPO: a group's best sample by its lead over the second best, over the group's std "
        "(grpo_norm_by_std); the others 0",
        group_baseline=True,
        min_group_size=2,
        verl=("grpo_passk",),
    ),
    AdvantageEstimator(
        "gdpo",
        f"{_ADVANTAGES}:gdpo",
        "verl's GDPO on one reward: the GRPO advantage whitened over the batch",
        verl=("gdpo",),
    ),
    AdvantageEstimator(
        "remax",
        f"{_ADVANTAGES}:remax",
        "verl's ReMax: each token's return-to-go minus the reward of a greedy response to its prompt, which the "
        "generator samples beside the rollouts",
        per_trajectory=False,
        inputs=("reward_baselines",),
        verl=("remax",),
    ),
    AdvantageEstimator(
        "optimal_token_baseline",
        f"{_ADVANTAGES}:optimal_token_baseline",
        "verl's optimal token baseline: each token's return-to-go minus its group's returns at that position, "
        "weighted by each sample's accumulated score variance (the policy's sum of squared probabilities)",
        per_trajectory=False,
        inputs=("old_logprobs", "sum_pi_squared", "is_weight"),
        verl=("optimal_token_baseline",),
    ),
    AdvantageEstimator(
        "tir_optimal_token_baseline",
        f"{_ADVANTAGES}:tir_optimal_token_baseline",
        "verl's multi-turn optimal token baseline: as optimal_token_baseline, samples compared by their k-th model "
        "token instead of their k-th position",
        per_trajectory=False,
        inputs=("old_logprobs", "sum_pi_squared", "is_weight"),
        verl=("tir_optimal_token_baseline",),
    ),
    AdvantageEstimator(
        "maxrl",
        f"{_ADVANTAGES}:maxrl",
        "a sequence's score against its group's mean, over that mean",
        group_baseline=True,
    ),
)

KL_ESTIMATORS: tuple[KLEstimator, ...] = (
    KLEstimator("k1", f"{_KL}:k1", "the log-ratio: unbiased, can be negative per token", verl=("kl", "k1")),
    KLEstimator("k2", f"{_KL}:k2", "half the squared log-ratio: biased, non-negative", verl=("mse", "k2")),
    KLEstimator("k3", f"{_KL}:k3", "exp(-d) + d - 1: unbiased and non-negative", verl=("low_var_kl", "k3")),
    KLEstimator("abs", f"{_KL}:abs_kl", "the absolute log-ratio", verl=("abs",)),
)

LOSS_REDUCTIONS: tuple[LossReduction, ...] = (
    LossReduction(
        "token_mean",
        f"{_LOSSES}:token_mean_weights",
        "the mean over every token of the batch",
        verl=("token-mean",),
    ),
    LossReduction(
        "sequence_mean",
        f"{_LOSSES}:sequence_mean_weights",
        "the mean over sequences of each one's token mean",
        verl=("seq-mean-token-mean",),
    ),
    LossReduction(
        "seq_mean_token_sum_norm",
        f"{_LOSSES}:seq_mean_token_sum_norm_weights",
        "the mean over sequences of each one's token sum over max_seq_len (Dr. GRPO)",
        needs_max_seq_len=True,
        verl=("seq-mean-token-sum-norm",),
    ),
    LossReduction(
        "token_mean_legacy",
        f"{_LOSSES}:token_mean_legacy_weights",
        "the mean over micro-batches (micro_train_batch_size_per_gpu rows of the mini-batch, in order) of each "
        "one's token mean: SkyRL's token mean before 0.4",
        over_mini_batch=True,
    ),
    LossReduction(
        "prompt_mean",
        f"{_LOSSES}:prompt_mean_weights",
        "the mean over prompts of the token mean of each prompt's samples",
        over_mini_batch=True,
    ),
)

# verl's rollout_rs modes (trainer.algorithm.off_policy_correction.rejection_sampling): a level and a divergence
# (rlc.runtime.algorithms.rejection).
REJECTION_MODES: tuple[str, ...] = (
    *(f"{level}_k{n}" for level in ("token", "seq_sum", "seq_mean") for n in (1, 2, 3)),
    "seq_max_k2",
    "seq_max_k3",
)
# verl's PF-PPO reweightings (trainer.algorithm.pf_ppo.reweight_method; rlc.runtime.algorithms.pf_ppo).
PF_PPO_REWEIGHTS: tuple[str, ...] = ("pow", "max_min", "max_random")

# The loss SkyRL's legacy and AReaL's `importance_sampling_level: sequence` asks for.
SEQUENCE_RATIO_LOSS = next(card.id for card in POLICY_LOSSES if card.ratio_level == "sequence")

LOSSES = {card.id: card for card in POLICY_LOSSES}
ESTIMATORS = {card.id: card for card in ADVANTAGE_ESTIMATORS}
KLS = {card.id: card for card in KL_ESTIMATORS}
REDUCTIONS = {card.id: card for card in LOSS_REDUCTIONS}


def policy_loss(name: str) -> PolicyLoss:
    """The card of policy loss `name`; an extension's loss gets the defaults' card."""
    return LOSSES.get(name) or PolicyLoss(name, None, "an extension's policy loss")


def advantage_estimator(name: str) -> AdvantageEstimator:
    """The card of advantage estimator `name`; an extension's estimator gets the defaults' card."""
    return ESTIMATORS.get(name) or AdvantageEstimator(name, "", "an extension's advantage estimator")


def ids(cards) -> tuple[str, ...]:
    """The ids of `cards`, in their order."""
    return tuple(card.id for card in cards)


def listed(names) -> str:
    """'a, b or c': names as a rule's title lists them."""
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def verl_names(cards) -> dict[str, str]:
    """verl's name -> the card's id, for each name a card lists."""
    return {name: card.id for card in cards for name in card.verl}
