"""The RL algorithm section of spec v1 (trainer.algorithm), with SkyRL's names and defaults."""

from rlc.core import algorithms
from rlc.core.dataclass import dataclass
from rlc.spec.fields import section, setting

# The accepted values, from the catalog of built-in algorithms (each card's properties are there too).
ADVANTAGE_ESTIMATORS = algorithms.ids(algorithms.ADVANTAGE_ESTIMATORS)
POLICY_LOSSES = algorithms.ids(algorithms.POLICY_LOSSES)
LOSS_REDUCTIONS = algorithms.ids(algorithms.LOSS_REDUCTIONS)
KL_ESTIMATORS = algorithms.ids(algorithms.KL_ESTIMATORS)


@dataclass
class KLCtrlConfig:
    type: str = setting("fixed", "KL coefficient controller for KL-in-reward.", enum=("fixed", "adaptive"))
    kl_target: float = setting(0.1, "Target KL of the adaptive controller.", minimum=0)
    horizon: int = setting(10000, "Update horizon of the adaptive controller.", minimum=1)


@dataclass
class SAPOConfig:
    tau_pos: float = setting(1.0, "SAPO gate temperature for positive advantages.", exclusive_minimum=0)
    tau_neg: float = setting(1.05, "SAPO gate temperature for negative advantages.", exclusive_minimum=0)


@dataclass
class DynamicSamplingConfig:
    type: str | None = setting(None, "Dynamic sampling strategy; null disables.", enum=("filter", "replace"))
    max_sample_batches: int = setting(30, "Most batches sampled per step; -1 samples forever.")
    min_replace_ratio: float = setting(
        0.3, "Least share of good samples used to replace bad ones (replace).", minimum=0, maximum=1
    )


@dataclass
class ClipCovConfig:
    clip_ratio: float = setting(0.0002, "Fraction of tokens clipped by covariance.", minimum=0, maximum=1)
    clip_cov_lb: float = setting(1.0, "Lower covariance bound.")
    clip_cov_ub: float = setting(5.0, "Upper covariance bound.")


@dataclass
class KLCovConfig:
    kl_cov_frac: float = setting(0.2, "Fraction of tokens given the KL penalty.", minimum=0, maximum=1)
    ppo_kl_coef: float = setting(1.0, "Coefficient of the KL penalty.", minimum=0)


@dataclass
class CISPOConfig:
    cispo_eps_clip_low: float = setting(0.0, "Offset below 1 of the importance-ratio clip.", minimum=0)
    cispo_eps_clip_high: float = setting(5.0, "Offset above 1 of the importance-ratio clip.", minimum=0)
    cispo_anchor: str = setting(
        "old", "SkyRL 0.4: log-probs the ratio is anchored on (old or rollout).", enum=("old", "rollout")
    )


@dataclass
class DPPOConfig:
    dppo_type: str = setting("binary_tv", "SkyRL 0.4: DPPO divergence.", enum=("binary_tv", "binary_kl"))
    delta_low: float = setting(0.2, "SkyRL 0.4: divergence threshold for negative advantages.", minimum=0)
    delta_high: float = setting(0.2, "SkyRL 0.4: divergence threshold for positive advantages.", minimum=0)


@dataclass
class DROConfig:
    beta: float | None = setting(
        None,
        "verl: DRO's quadratic log-ratio penalty (policy_loss_type=dro); verl has no default.",
        exclusive_minimum=0,
        rlc_only=True,
    )


@dataclass
class OffPolicyCorrectionConfig:
    tis_ratio_type: str | None = setting(
        None,
        "Truncated importance sampling of old-policy vs rollout log-probs; null disables.",
        enum=("token", "sequence"),
    )
    token_tis_ratio_clip_high: float = setting(2.0, "Token TIS ratio cap (tis_ratio_type=token).", exclusive_minimum=0)
    sequence_tis_ratio_clip_high: float = setting(
        5.0, "Sequence TIS ratio cap (tis_ratio_type=sequence).", exclusive_minimum=0
    )
    sequence_mask_metric: str | None = setting(
        None, "Mask sequences whose cumulative ratio leaves its band; null disables.", enum=("product", "geometric")
    )
    geo_mask_high: float = setting(1.01, "Upper band of the geometric-mean ratio.")
    geo_mask_low: float = setting(0.99, "Lower band of the geometric-mean ratio.")
    product_mask_high: float = setting(2.0, "Upper band of the product ratio.")
    product_mask_low: float = setting(0.5, "Lower band of the product ratio.")
    outlier_token_is_threshold_low: float | None = setting(None, "Mask a sequence holding a token ratio below this.")
    outlier_token_is_threshold_high: float | None = setting(None, "Mask a sequence holding a token ratio above this.")
    token_mask_is_threshold_low: float | None = setting(None, "Mask tokens whose ratio is below this.")
    token_mask_is_threshold_high: float | None = setting(None, "Mask tokens whose ratio is above this.")
    tis_ratio_clip_low: float | None = setting(
        None,
        "verl's IcePop (rollout_is_threshold 'low_high'): a TIS weight outside [this, the clip_high] is 0, not capped.",
        exclusive_minimum=0,
        rlc_only=True,
    )
    tis_batch_normalize: bool = setting(
        False, "verl: divide the TIS weights by their batch mean (per sequence for sequence TIS).", rlc_only=True
    )
    rejection_sampling: list[str] | None = setting(
        None,
        "verl's rollout_rs: drop tokens or sequences whose divergence from the engine passes its bound; modes "
        "token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2..3, every one must pass.",
        rlc_only=True,
    )
    rejection_threshold_high: list[float] | None = setting(
        None,
        "Bound of each rejection_sampling mode (one shared, or one per mode): the ratio's for k1, else the divergence.",
        rlc_only=True,
    )
    rejection_threshold_low: list[float] | None = setting(
        None,
        "Lower ratio bound of the k1 modes (one shared, or one per k1 mode); null: 1 / their high bound.",
        rlc_only=True,
    )
    m2po_threshold: float | None = setting(
        None,
        "AReaL's M2PO (actor.m2_threshold): drop the tokens of largest squared log-ratio to the engine until the "
        "mean of the rest is below this; null disables.",
        exclusive_minimum=0,
        rlc_only=True,
    )


@dataclass
class BypassConfig:
    loss_type: str = setting(
        "ppo_clip",
        "verl's rollout_correction.loss_type: PPO's clip on the ratio to the engine (ppo_clip) or -w * A * log p "
        "(reinforce), for policy_loss_type bypass.",
        enum=("ppo_clip", "reinforce"),
        rlc_only=True,
    )


@dataclass
class PFPPOConfig:
    reweight_method: str | None = setting(
        None,
        "verl's PF-PPO: resample the batch by reward-derived weights (pow, max_min, max_random); null disables.",
        enum=algorithms.PF_PPO_REWEIGHTS,
        rlc_only=True,
    )
    weight_pow: float = setting(2.0, "The power of |reward| that weighs a row (reweight_method pow).", rlc_only=True)


@dataclass
class AlgorithmConfig:
    advantage_estimator: str = setting("grpo", "Advantage estimator.", enum=ADVANTAGE_ESTIMATORS)
    kl_ctrl: KLCtrlConfig = section(KLCtrlConfig, "KL controller (only with use_kl_in_reward).")
    kl_estimator_type: str = setting("k3", "KL estimator (see joschu.net/blog/kl-approx).", enum=KL_ESTIMATORS)
    use_kl_in_reward: bool = setting(False, "Subtract a KL penalty from rewards (exclusive with use_kl_loss).")
    use_kl_loss: bool = setting(True, "Add a KL loss to the policy loss (exclusive with use_kl_in_reward).")
    kl_loss_coef: float = setting(0.001, "KL loss coefficient (initial coefficient for KL-in-reward).", minimum=0)
    use_entropy_loss: bool = setting(False, "Add an entropy bonus to the policy loss.")
    entropy_loss_coef: float = setting(0.01, "Entropy bonus coefficient.")
    temperature: float | None = setting(
        None, "Logit temperature in the loss; derived from generator.sampling_params.temperature.", minimum=0
    )
    advantage_batch_normalize: bool = setting(False, "Normalize advantages over the training batch.")
    value_head_prefix: str = setting("value_head", "Name prefix of the critic's value head.")
    policy_loss_type: str = setting("regular", "Policy loss.", enum=POLICY_LOSSES)
    loss_reduction: str = setting("token_mean", "How token losses reduce to a scalar.", enum=LOSS_REDUCTIONS)
    grpo_norm_by_std: bool = setting(True, "Divide GRPO advantages by the group's reward std.")
    zero_variance_filter: bool = setting(False, "Mask prompts whose group rewards are all equal.")
    zero_variance_filter_tol: float = setting(1e-6, "SkyRL 0.4: reward spread counted as zero variance.", minimum=0)
    lambd: float = setting(1.0, "GAE lambda.", minimum=0, maximum=1)
    gamma: float = setting(1.0, "Discount factor.", minimum=0, maximum=1)
    eps_clip_low: float = setting(0.2, "PPO clip below 1.", minimum=0)
    eps_clip_high: float = setting(0.2, "PPO clip above 1.", minimum=0)
    clip_ratio_c: float = setting(3.0, "Dual-clip constant (dual_clip loss).", exclusive_minimum=1)
    tis_imp_ratio_cap: float = setting(-1.0, "Deprecated: use off_policy_correction.token_tis_ratio_clip_high.")
    use_tis: bool = setting(False, "Deprecated: use off_policy_correction.tis_ratio_type=token.")
    off_policy_correction: OffPolicyCorrectionConfig = section(OffPolicyCorrectionConfig, "Off-policy correction.")
    sapo: SAPOConfig = section(SAPOConfig, "SAPO loss settings (policy_loss_type=sapo).")
    value_clip: float = setting(0.2, "Critic value clip.", minimum=0)
    dynamic_sampling: DynamicSamplingConfig = section(DynamicSamplingConfig, "Dynamic sampling (DAPO).")
    clip_cov: ClipCovConfig = section(ClipCovConfig, "Clip-Cov settings (policy_loss_type=clip_cov).")
    kl_cov: KLCovConfig = section(KLCovConfig, "KL-Cov settings (policy_loss_type=kl_cov).")
    cispo: CISPOConfig = section(CISPOConfig, "CISPO settings (policy_loss_type=cispo).")
    dppo: DPPOConfig = section(DPPOConfig, "SkyRL 0.4: DPPO settings.")
    dro: DROConfig = section(DROConfig, "verl's DRO settings (policy_loss_type=dro).")
    overlong_buffer_len: int | None = setting(
        None,
        "DAPO's soft overlong penalty: a response in the last N tokens before generator.sampling_params."
        "max_generate_length loses up to overlong_buffer_penalty_factor of its reward, in proportion to how far in "
        "it reaches (SkyRL's main_dapo, verl's dapo reward manager); null disables.",
        minimum=1,
        rlc_only=True,
    )
    overlong_buffer_penalty_factor: float = setting(
        1.0, "The most reward the overlong buffer takes away (at max_generate_length).", minimum=0, rlc_only=True
    )
    reward_clip: float | None = setting(
        None,
        "AReaL's actor.reward_clip: each reward (each turn's) clipped to [-this, this], after the overlong penalty; "
        "null disables.",
        exclusive_minimum=0,
        rlc_only=True,
    )
    gdpo_reward_keys: list[str] = setting(
        doc="verl's GDPO (advantage_estimator gdpo): the entries of the reward function's dict (env_class "
        "reward_function) normalised within each group apart, then summed; empty: the one reward.",
        factory=list,
        rlc_only=True,
    )
    gdpo_reward_weights: list[float] | None = setting(
        None, "verl's GDPO: each of gdpo_reward_keys' weight in the sum; null: 1 each.", rlc_only=True
    )
    bypass: BypassConfig = section(BypassConfig, "verl's bypass mode (policy_loss_type=bypass).")
    pf_ppo: PFPPOConfig = section(PFPPOConfig, "verl's PF-PPO: the batch resampled by reward before the update.")
    enable_sample_support_replay: bool = setting(False, "SkyRL 0.4: replay the engines' sampling support set.")
    max_seq_len: int | None = setting(
        None,
        "Sequence-length normalizer of seq_mean_token_sum_norm; derived as max_input_length + max_generate_length.",
        minimum=1,
    )
