"""Every advantage estimator and policy loss verl 0.9.1 and SkyRL 0.4.0 register, and AReaL 1.0.4's algorithm settings
(its PPO actor loss, decoupled loss, reward and advantage normalisation, KL estimators),
against rlc's, on the same random tensors: ragged masks (right padding, a row of one token, a hole in a row), groups of several samples and of one,
float64, every loss reduction rlc has. The peers' own functions are imported from the installed packages; a test
whose package is missing is skipped with the reason.

A loss is compared by its value and its gradient with respect to the log-probs. rlc computes per-token losses and
weights them by the loss reduction (`token_weights`); verl aggregates its loss matrix (`agg_loss`), SkyRL scales the
advantages by the reduction and sums (`apply_loss_reduction_to_advantages_minibatch`). Where a peer fixes the
aggregation whatever it is asked (verl's sapo and geo_mean: per sequence), the comparison is at that reduction.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys
import types

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")  # torch's own dependency: present wherever torch is

from rlc.core import algorithms  # noqa: E402
from rlc.runtime.algorithms import registry  # noqa: E402
from rlc.runtime.algorithms.losses import mini_batch_weights, token_weights  # noqa: E402

F64 = torch.float64
ROWS, LENGTH = 8, 7
LENGTHS = (7, 5, 3, 6, 1, 7, 4, 2)  # every row has a token: verl leaves empty rows out of a per-sequence mean
GROUPS = np.array([0, 0, 0, 1, 1, 1, 2, 3])  # groups of three and the lone samples 6 and 7
# The reductions each rank weighs from the mini-batch's totals; those over the whole mini-batch (prompt_mean,
# token_mean_legacy: SkyRL's only) are compared on their own below.
REDUCTIONS = tuple(card.id for card in algorithms.LOSS_REDUCTIONS if not card.over_mini_batch)
MINI_BATCH_REDUCTIONS = tuple(card.id for card in algorithms.LOSS_REDUCTIONS if card.over_mini_batch)
VERL_AGG = {card.id: card.verl[0] for card in algorithms.LOSS_REDUCTIONS if card.verl}

# verl's and SkyRL's names that rlc does not run, each with the reason. A name in a peer's registry that is neither
# here nor compared below fails test_every_peer_name_is_compared: a new upstream name needs a card or a reason.
NOT_RUN: dict[tuple[str, str, str], str] = {}  # every name of both registries runs today


def _verl():
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl 0.9.1 is not installed (make venv)")


def _skyrl():
    """SkyRL's ppo_utils. SkyRL 0.4.0 asks for Python 3.12: on an older Python its `skyrl.backends` package's
    __init__ (the Tinker API types, which pydantic builds only on 3.12) does not import, so the package is entered
    without it; ppo_utils itself needs none of it."""
    found = importlib.util.find_spec("skyrl")
    if found is None or found.submodule_search_locations is None:
        pytest.skip("skyrl 0.4.0 is not installed (make venv)")
    if sys.version_info < (3, 12) and "skyrl.backends" not in sys.modules:
        package = types.ModuleType("skyrl.backends")
        package.__path__ = [str(pathlib.Path(found.submodule_search_locations[0]) / "backends")]
        sys.modules["skyrl.backends"] = package
    return pytest.importorskip("skyrl.backends.skyrl_train.utils.ppo_utils", reason="SkyRL's ppo_utils did not import")


def _mask(holes: bool = False) -> torch.Tensor:
    mask = (torch.arange(LENGTH)[None, :] < torch.tensor(LENGTHS)[:, None]).to(F64)
    if holes:
        mask[0, 2:4] = 0  # an observation inside a multi-turn response
        mask[5, 1] = 0
    return mask


def _tensors(seed: int = 0):
    """log-probs (a leaf), old and rollout log-probs, advantages: ratios both inside and well outside 0.8-1.2,
    probabilities that move by more than 0.2, advantages of both signs and some exactly 0."""
    g = torch.Generator().manual_seed(seed)
    logp = -(torch.rand(ROWS, LENGTH, generator=g, dtype=F64) * 2.5 + 0.02)
    old = (logp + 0.4 * torch.randn(ROWS, LENGTH, generator=g, dtype=F64)).clamp(max=-1e-3)
    rollout = (old + 0.1 * torch.randn(ROWS, LENGTH, generator=g, dtype=F64)).clamp(max=-1e-3)
    advantages = torch.randn(ROWS, LENGTH, generator=g, dtype=F64)
    advantages[1, :2] = 0.0
    return logp.requires_grad_(), old, rollout, advantages


def _value_and_grad(loss: torch.Tensor, logp: torch.Tensor):
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def _rlc_loss(card_id, logp, old, advantages, mask, reduction, options, rollout=None):
    fn = registry.get_policy_loss(card_id)
    if algorithms.LOSSES[card_id].rollout_anchored:
        options = {**options, "rollout_log_probs": rollout}
    token_loss, _ = fn(logp, old, advantages, mask, **options)
    weights = token_weights(
        mask, reduction, total_tokens=float(mask.sum()), total_sequences=float(ROWS), max_seq_len=LENGTH
    )
    return _value_and_grad((token_loss * weights.to(F64)).sum(), logp)


def _assert_equal(ours, theirs, what):
    # rlc's reduction weights are float32 (token_weights), so agreement is to float32's precision
    for name, a, b in zip(("loss", "gradient"), ours, theirs):
        torch.testing.assert_close(
            a, b.to(a.dtype), rtol=1e-6, atol=1e-9, msg=lambda m, part=name: f"{what} {part}: {m}"
        )


# ---- verl's policy losses ----------------------------------------------------------------------------------


def _verl_config(**policy_loss):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=3,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        tau_pos=1.0,
        tau_neg=1.05,
        policy_loss=PolicyLossConfig(**policy_loss),
    )


_PPO = {"eps_clip_low": 0.2, "eps_clip_high": 0.28}
# verl's name -> (rlc's card, rlc's options, verl's policy_loss settings, the reductions verl honours)
VERL_LOSSES = {
    "vanilla": ("dual_clip", {**_PPO, "clip_ratio_c": 3.0}, {}, REDUCTIONS),
    "dppo_tv": ("dppo_tv", {**_PPO, "clip_ratio_c": 3.0}, {}, REDUCTIONS),
    "dppo_kl": ("dppo_kl", {**_PPO, "clip_ratio_c": 3.0}, {}, REDUCTIONS),
    "gspo": ("gspo", _PPO, {}, REDUCTIONS),
    "sapo": ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, {}, ("sequence_mean",)),
    "gpg": ("gpg", {}, {}, REDUCTIONS),
    # every token a candidate and all of them dropped: the draw at random is the same whatever the generator
    "clip_cov": (
        "clip_cov",
        {**_PPO, "clip_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
        {"clip_cov_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
        REDUCTIONS,
    ),
    "kl_cov": (
        "kl_cov",
        {"kl_cov_frac": 0.3, "ppo_kl_coef": 0.7},
        {"kl_cov_ratio": 0.3, "ppo_kl_coef": 0.7},
        REDUCTIONS,
    ),
    "geo_mean": ("geo_mean", _PPO, {}, ("sequence_mean",)),
    "dro": ("dro", {"beta": 0.3}, {"dro_beta": 0.3}, REDUCTIONS),
    "cispo": ("cispo", {"cispo_eps_clip_low": 0.2, "cispo_eps_clip_high": 0.28}, {}, REDUCTIONS),
}


@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
@pytest.mark.parametrize("name", sorted(VERL_LOSSES))
def test_verl_policy_loss(name, holes):
    core = _verl()
    card_id, options, policy_loss, reductions = VERL_LOSSES[name]
    assert algorithms.verl_names(algorithms.POLICY_LOSSES)[name] == card_id
    config = _verl_config(**policy_loss)
    mask = _mask(holes)
    for reduction in reductions:
        logp, old, rollout, advantages = _tensors()
        ours = _rlc_loss(card_id, logp, old, advantages, mask, reduction, options, rollout)
        loss, _ = core.get_policy_loss_fn(name)(
            old, logp, advantages, mask, loss_agg_mode=VERL_AGG[reduction], config=config
        )
        _assert_equal(ours, _value_and_grad(loss, logp), f"verl {name} ({reduction})")


# ---- verl's rollout correction (algorithm.rollout_correction) -----------------------------------------------

_RS_MODES = algorithms.REJECTION_MODES  # token_k1..3, seq_sum_k1..3, seq_mean_k1..3, seq_max_k2..3
# verl's rollout_correction settings -> rlc's off_policy_correction: every IS level and threshold form, every
# rejection mode (k1 with and without its lower bound), several modes at once.
ROLLOUT_CORRECTIONS = {
    **{
        f"is-{level}-{form}": (
            {"tis_ratio_type": level, f"{level}_tis_ratio_clip_high": 1.3, "tis_ratio_clip_low": low,
             "tis_batch_normalize": norm},
            {"rollout_is": level, "rollout_is_threshold": f"{low}_1.3" if low else 1.3,
             "rollout_is_batch_normalize": norm},
        )
        for level in ("token", "sequence")
        for form, low, norm in (("tis", None, False), ("icepop", 0.8, False), ("tis-norm", None, True),
                                ("icepop-norm", 0.8, True))
    },
    **{
        f"rs-{mode}": (
            {"rejection_sampling": [mode], "rejection_threshold_high": [bound]},
            {"rollout_rs": mode, "rollout_is": None, "rollout_rs_threshold": bound},
        )
        for mode, bound in zip(_RS_MODES, (1.1, 0.004, 0.004, 1.1, 0.02, 0.02, 1.03, 0.004, 0.004, 0.01, 0.01))
    },
    "rs-seq_mean_k1-band": (
        {"rejection_sampling": ["seq_mean_k1"], "rejection_threshold_high": [1.1], "rejection_threshold_low": [0.95]},
        {"rollout_is": None, "rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.95_1.1"},
    ),
    "is-rs-several": (
        {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 2.0,
         "rejection_sampling": ["token_k1", "seq_max_k3", "token_k1"], "rejection_threshold_high": [1.5, 0.2],
         "rejection_threshold_low": [0.7]},
        {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "token_k1,seq_max_k3,token_k1",
         "rollout_rs_threshold": "0.7_1.5,0.2"},
    ),
}  # fmt: skip


@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
@pytest.mark.parametrize("name", sorted(ROLLOUT_CORRECTIONS))
def test_verl_rollout_correction(name, holes):
    """verl's IS weights and rejection mask, from rlc's off_policy_correction with verl's settings."""
    _verl()
    from rlc.runtime.algorithms.off_policy import off_policy_correction
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    ours_options, theirs_options = ROLLOUT_CORRECTIONS[name]
    mask = _mask(holes)
    _, old, rollout, _ = _tensors()
    weight, new_mask, _ = off_policy_correction(old, rollout, mask, **ours_options)
    weights, their_mask, _ = compute_rollout_correction_and_rejection_mask(
        old, rollout, mask, **{"rollout_is_threshold": 2.0, **theirs_options}
    )
    torch.testing.assert_close(new_mask, their_mask.to(new_mask.dtype), msg=f"{name}: mask")
    assert 0 < new_mask.sum() <= mask.sum() and (name.startswith("is-") or new_mask.sum() < mask.sum()), name
    if weights is not None:
        theirs = weights.batch["rollout_is_weights"]
        present = mask.bool()
        torch.testing.assert_close(weight[present], theirs[present].to(weight.dtype), msg=f"{name}: weights")
        assert (weight[present] != 1).any(), name


# verl's bypass_mode loss: rollout_correction settings (rlc's, verl's) and whether a rejection mode drops single
# tokens (verl's seq-mean-token-mean then averages each row over its kept tokens; rlc's reduction counts the batch's).
BYPASS = {
    "plain": ({}, {"rollout_is": None}, False),
    "token-tis": ({"tis_ratio_type": "token", "token_tis_ratio_clip_high": 1.2},
                  {"rollout_is": "token", "rollout_is_threshold": 1.2}, False),
    "sequence-icepop": ({"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 3.0, "tis_ratio_clip_low": 0.3},
                        {"rollout_is": "sequence", "rollout_is_threshold": "0.3_3.0"}, False),
    "seq-rejection": ({"rejection_sampling": ["seq_mean_k3"], "rejection_threshold_high": [0.05]},
                      {"rollout_is": None, "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": 0.05}, False),
    "token-rejection-tis": ({"tis_ratio_type": "token", "token_tis_ratio_clip_high": 2.0,
                             "rejection_sampling": ["token_k2"], "rejection_threshold_high": [0.1]},
                            {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": "token_k2",
                             "rollout_rs_threshold": 0.1}, True),
}  # fmt: skip


@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
@pytest.mark.parametrize("case", sorted(BYPASS))
def test_verl_bypass_mode(case, loss_type, holes):
    """verl's bypass_mode loss (old log-probs := the engine's, the correction against the current policy), with
    the batch's token and sequence counts verl's trainer hands its loss (global_batch_info)."""
    core = _verl()
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    ours_options, theirs_options, drops_tokens = BYPASS[case]
    assert algorithms.verl_names(algorithms.POLICY_LOSSES)["bypass_mode"] == "bypass"
    mask = _mask(holes)
    correction = RolloutCorrectionConfig(bypass_mode=True, loss_type=loss_type, **theirs_options)
    config = _verl_config(loss_mode="bypass_mode", rollout_correction=correction)
    config.global_batch_info.update(dp_size=1, batch_num_tokens=float(mask.sum()), global_batch_size=ROWS)
    options = {"loss_type": loss_type, **_PPO, "clip_ratio_c": 3.0, **ours_options}
    reductions = [r for r in REDUCTIONS if not (drops_tokens and r == "sequence_mean")]
    for reduction in reductions:
        logp, old, rollout, advantages = _tensors()
        ours = _rlc_loss("bypass", logp, old, advantages, mask, reduction, options, rollout)
        loss, _ = core.get_policy_loss_fn("bypass_mode")(
            rollout, logp, advantages, mask, loss_agg_mode=VERL_AGG[reduction], config=config
        )
        _assert_equal(ours, _value_and_grad(loss, logp), f"verl bypass_mode {case} {loss_type} ({reduction})")


@pytest.mark.parametrize("method", algorithms.PF_PPO_REWEIGHTS)
def test_verl_pf_ppo(method):
    """verl's PF-PPO weights, and its resampled batch given the same generator state (verl draws from torch's
    global generator; rlc from a seeded one)."""
    core = _verl()
    from rlc.runtime.algorithms.pf_ppo import pf_ppo_rows, pf_ppo_weights
    from verl.protocol import DataProto

    rows = 64
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(-2, 3, (rows, 1), generator=g).float() * torch.rand(rows, 1, generator=g)
    token_scores = torch.cat([torch.zeros(rows, 4), scores], dim=1)
    data = DataProto.from_dict(tensors={"token_level_scores": token_scores, "row": torch.arange(rows)})
    torch.manual_seed(11)
    theirs = core.compute_pf_ppo_reweight_data(data, method, 1.5).batch["row"]
    ours = pf_ppo_rows(token_scores.sum(-1), method, 1.5, torch.Generator().manual_seed(11))
    assert torch.equal(ours, theirs)
    assert len(set(ours.tolist())) < rows  # rows were drawn again, some twice
    expected = {"pow": scores[:, 0].abs() ** 1.5,
                "max_min": ((scores == scores.max()) | (scores == scores.min()))[:, 0].float(),
                "max_random": torch.where(scores[:, 0] == scores.max(), 0.4, 0.1)}[method]  # fmt: skip
    torch.testing.assert_close(pf_ppo_weights(token_scores.sum(-1), method, 1.5), expected + 1e-8)


# ---- SkyRL's policy losses ---------------------------------------------------------------------------------


def _skyrl_config(policy_loss_type, reduction, **sections):
    from skyrl.train.config import AlgorithmConfig

    config = AlgorithmConfig(policy_loss_type=policy_loss_type, loss_reduction=reduction, max_seq_len=LENGTH)
    config.eps_clip_low, config.eps_clip_high, config.clip_ratio_c = 0.2, 0.28, 3.0
    for section, values in sections.items():
        setattr(config, section, dataclasses.replace(getattr(config, section), **values))
    return config


# SkyRL's name -> (rlc's card, rlc's options, SkyRL's config sections)
SKYRL_LOSSES = {
    "regular": ("regular", {**_PPO, "clip_ratio_c": 3.0}, {}),
    "dual_clip": ("dual_clip", {**_PPO, "clip_ratio_c": 3.0}, {}),
    "gspo": ("gspo", _PPO, {}),
    "sapo": ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, {}),
    "cispo": (
        "cispo",
        {"cispo_eps_clip_low": 0.2, "cispo_eps_clip_high": 0.28},
        {"cispo": {"cispo_eps_clip_low": 0.2, "cispo_eps_clip_high": 0.28}},
    ),
    "rollout_is": ("rollout_is", _PPO, {}),
    "importance_sampling": ("importance_sampling", {}, {}),
    "cross_entropy": ("cross_entropy", {}, {}),
    "dppo": ("dppo", {"dppo_type": "binary_tv", "delta_low": 0.2, "delta_high": 0.15}, {}),
    "dppo-binary_kl": ("dppo", {"dppo_type": "binary_kl", "delta_low": 0.05, "delta_high": 0.03}, {}),
    "clip_cov": (
        "clip_cov",
        {**_PPO, "clip_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
        {"clip_cov": {"clip_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9}},
    ),
    # SkyRL sums the KL penalty over the tokens instead of reducing it with the loss: compared without it (below)
    "kl_cov": (
        "kl_cov",
        {"kl_cov_frac": 0.3, "ppo_kl_coef": 0.0},
        {"kl_cov": {"kl_cov_frac": 0.3, "ppo_kl_coef": 0.0}},
    ),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
@pytest.mark.parametrize("name", sorted(SKYRL_LOSSES))
def test_skyrl_policy_loss(name, holes, reduction):
    ppo = _skyrl()
    card_id, options, sections = SKYRL_LOSSES[name]
    skyrl_name = name.partition("-")[0]
    if card_id == "dppo":
        sections = {"dppo": {k: v for k, v in options.items()}}
    config = _skyrl_config(skyrl_name, reduction, **sections)
    mask = _mask(holes)
    logp, old, rollout, advantages = _tensors()
    ours = _rlc_loss(card_id, logp, old, advantages, mask, reduction, options, rollout)
    scaled = ppo.apply_loss_reduction_to_advantages_minibatch(advantages, mask, reduction, ROWS, LENGTH)
    loss_mask = mask
    if name == "cross_entropy":  # SkyRL's SFT batches carry the loss mask over the batch's tokens: a token mean
        if reduction != "token_mean":
            pytest.skip("SkyRL's SFT loss is a token mean only")
        loss_mask = mask / mask.sum()
    loss, _ = ppo.PolicyLossRegistry.get(skyrl_name)(
        logp, old, scaled, config, loss_mask=loss_mask, rollout_logprobs=rollout
    )
    _assert_equal(ours, _value_and_grad(loss, logp), f"SkyRL {name} ({reduction})")


@pytest.mark.parametrize("micro", [2, 4])
@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
@pytest.mark.parametrize("reduction", MINI_BATCH_REDUCTIONS)
def test_skyrl_reduction_over_the_mini_batch(reduction, holes, micro):
    """SkyRL's prompt_mean and token_mean_legacy against rlc's weights, which the driver computes over the
    mini-batch (`mini_batch_weights`): the same loss and gradient under SkyRL's regular loss."""
    ppo = _skyrl()
    mask = _mask(holes)
    logp, old, _, advantages = _tensors()
    group = torch.as_tensor(GROUPS)
    bounds = [(int(i), int(i) + int((group == g).sum())) for g, i in zip(*np.unique(GROUPS, return_index=True))]
    algorithm = types.SimpleNamespace(loss_reduction=reduction, max_seq_len=LENGTH)
    weights = mini_batch_weights(algorithm, mask, group, micro)
    token_loss, _ = registry.get_policy_loss("regular")(logp, old, advantages, mask, **_PPO)
    ours = _value_and_grad((token_loss * weights.to(F64)).sum(), logp)
    scaled = ppo.apply_loss_reduction_to_advantages_minibatch(
        advantages, mask, reduction, micro, LENGTH, prompt_boundaries=bounds
    )
    config = _skyrl_config("regular", reduction)
    loss, _ = ppo.PolicyLossRegistry.get("regular")(logp, old, scaled, config, loss_mask=mask)
    _assert_equal(ours, _value_and_grad(loss, logp), f"SkyRL regular ({reduction}, micro-batches of {micro})")


def test_skyrl_kl_cov_sums_its_penalty_where_rlc_and_verl_reduce_it():
    """The one known difference: SkyRL's KL-Cov penalty is not scaled by the loss reduction (only the advantages
    are), so under token_mean its weight is the batch's token count times rlc's and verl's."""
    ppo = _skyrl()
    mask = _mask()
    logp, old, _, advantages = _tensors()
    scaled = ppo.apply_loss_reduction_to_advantages_minibatch(advantages, mask, "token_mean", ROWS, LENGTH)

    def penalty(coef):
        config = _skyrl_config("kl_cov", "token_mean", kl_cov={"kl_cov_frac": 0.3, "ppo_kl_coef": coef})
        theirs, _ = ppo.PolicyLossRegistry.get("kl_cov")(logp, old, scaled, config, loss_mask=mask)
        ours, _ = _rlc_loss(
            "kl_cov", logp, old, advantages, mask, "token_mean", {"kl_cov_frac": 0.3, "ppo_kl_coef": coef}
        )
        return theirs.detach(), ours

    (theirs, ours), (theirs0, ours0) = penalty(0.7), penalty(0.0)
    assert float(ours - ours0) > 0
    torch.testing.assert_close(theirs - theirs0, (ours - ours0) * mask.sum(), rtol=1e-6, atol=1e-9)


# ---- AReaL's policy losses ---------------------------------------------------------------------------------

# AReaL's setting -> (rlc's card, rlc's options, AReaL's function and its arguments beyond the tensors). AReaL's
# losses are token means over the batch; its sequence-level ratio averages each sequence's advantages, so that case
# is compared on outcome advantages (one per sequence), where it is GSPO's.
_AREAL = {"eps_clip": 0.2, "eps_clip_higher": 0.28}
AREAL_LOSSES = {
    "ppo": ("regular", {**_PPO, "clip_ratio_c": 3.0}, "ppo_actor_loss_fn", _AREAL),
    "ppo-c_clip": ("dual_clip", {**_PPO, "clip_ratio_c": 3.0}, "ppo_actor_loss_fn", {**_AREAL, "c_clip": 3.0}),
    "ppo-sequence": (
        "gspo",
        _PPO,
        "ppo_actor_loss_fn",
        {**_AREAL, "importance_sampling_level": "sequence"},
    ),
    "sapo": ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, "sapo_loss_fn", {"tau_pos": 1.0, "tau_neg": 1.05}),
}


@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
@pytest.mark.parametrize("name", sorted(AREAL_LOSSES))
def test_areal_policy_loss(name, holes):
    functional = pytest.importorskip("areal.utils.functional.functional", reason="AReaL 1.0.4 is not installed")
    card_id, options, function, arguments = AREAL_LOSSES[name]
    mask = _mask(holes)
    logp, old, _, advantages = _tensors()
    if name == "ppo-sequence":
        advantages = advantages[:, :1].expand_as(advantages).contiguous()
    ours = _rlc_loss(card_id, logp, old, advantages, mask, "token_mean", options)
    fn = getattr(functional, function)
    if function == "ppo_actor_loss_fn":
        loss, _ = fn(logp, old, old, advantages, loss_mask=mask.bool(), **arguments)
    else:
        loss, _ = fn(logp, old, advantages, loss_mask=mask.bool(), **arguments)
    _assert_equal(ours, _value_and_grad(loss, logp), f"AReaL {name}")


def _areal(module: str):
    return pytest.importorskip(module, reason="AReaL 1.0.4 is not installed (make venv)")


def _areal_functions(module: str, *names: str) -> dict:
    """AReaL's own functions `names` of `module`, taken from the installed file's source and run with torch alone:
    the module imports the whole trainer (datasets, swanlab, ...), which the functions never use."""
    import ast

    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)  # the top package only: its subpackages' __init__ import the trainer
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("AReaL 1.0.4 is not installed (make venv)")
    path = pathlib.Path(next(iter(spec.submodule_search_locations)), *rest.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text(), str(path))
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in found} == set(names), f"{module} no longer defines {names}"
    namespace: dict = {"torch": torch}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return {name: namespace[name] for name in names}


@pytest.mark.parametrize("cap", [1.5, 3.0])
@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
def test_areal_decoupled_loss_is_rlcs_loss_with_token_tis(holes, cap):
    """AReaL's decoupled PPO loss (`use_decoupled_loss`: the ratio against the recomputed proximal log-probs, each
    token weighed by the behaviour ratio pi_prox / pi_behave clamped to `rejection_sampling.upper`) is rlc's regular
    loss against the old log-probs with the off-policy correction's token TIS (`token_tis_ratio_clip_high`)."""
    functional = _areal("areal.utils.functional.functional")
    cli = _areal("areal.api.cli_args")
    from rlc.runtime.algorithms.off_policy import off_policy_correction

    mask = _mask(holes)
    logp, prox, behave, advantages = _tensors()
    weight, kept, _ = off_policy_correction(prox, behave, mask, tis_ratio_type="token", token_tis_ratio_clip_high=cap)
    token_loss, _ = registry.get_policy_loss("regular")(logp, prox, advantages, mask, **_PPO)
    w = token_weights(mask, "token_mean", total_tokens=float(mask.sum()), total_sequences=float(ROWS))
    ours = _value_and_grad((token_loss * weight * kept * w.to(F64)).sum(), logp)
    sampling = cli.RejectionSamplingConfig(level="token", action="clamp", metric="ratio", upper=cap, lower=None)
    loss, _ = functional.ppo_actor_loss_fn(
        logp, prox, behave, advantages, loss_mask=mask.bool(), rejection_sampling=sampling, **_AREAL
    )
    _assert_equal(ours, _value_and_grad(loss, logp), f"AReaL decoupled loss (clamp at {cap})")


@pytest.mark.parametrize("threshold", [1e-4, 0.01, 0.05, 1e3])
@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
def test_areal_m2po_masking(holes, threshold):
    """AReaL's M2PO (actor.m2_threshold: the tokens of largest squared behaviour/proximal log-ratio dropped until
    the rest's mean is below the threshold, at least one kept) is off_policy_correction.m2po_threshold: the same
    tokens stay, from dropping all but one to dropping none."""
    m2po = _areal_functions("areal.trainer.ppo.actor", "_apply_m2po_masking", "_get_m2po_loss_mask")
    from rlc.runtime.algorithms.off_policy import off_policy_correction

    mask = _mask(holes)
    _, prox, behave, _ = _tensors()
    weight, kept, metrics = off_policy_correction(prox, behave, mask, m2po_threshold=threshold)
    theirs = m2po["_apply_m2po_masking"](behave, prox, mask.bool(), threshold)
    assert torch.equal(kept.bool(), theirs), threshold
    assert torch.equal(weight, torch.ones_like(weight))
    dropped = float(metrics["m2po_masked_ratio"])
    assert 0.0 <= dropped < 1.0 and (dropped == 0.0) == torch.equal(theirs, mask.bool())


@pytest.mark.parametrize("norm_by_std", [True, False], ids=["std", "no-std"])
def test_areal_group_reward_normalisation_is_grpo(norm_by_std):
    """AReaL's GRPO: `reward_norm` at the group level (each group of `group_size` samples' scores, less their mean,
    over their unbiased std + eps) is rlc's grpo, and without the std (`std_level: null`) its Dr. GRPO. AReaL's eps
    defaults to 1e-5, rlc's (SkyRL's, verl's) is 1e-6: compared at rlc's."""
    data = _areal("areal.utils.data")
    cli = _areal("areal.api.cli_args")
    size = 3
    scores = torch.tensor([1.0, 0.0, 0.5, 0.25, 0.25, 1.0, 0.0, 0.0, 0.0], dtype=F64)  # a group of one score too
    std_level = "group" if norm_by_std else None
    config = cli.NormConfig(mean_level="group", std_level=std_level, std_unbiased=True, eps=1e-6, group_size=size)
    theirs = data.Normalization(config)(scores).to(F64)
    mask = torch.ones(len(scores), 1, dtype=F64)
    index = [str(i // size) for i in range(len(scores))]
    ours, _ = _rlc_advantages("grpo", scores, mask, index, norm_by_std=norm_by_std)
    torch.testing.assert_close(ours[:, 0], theirs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("holes", [False, True], ids=["padded", "holes"])
def test_areal_batch_normalisation_is_advantage_batch_normalize(holes):
    """AReaL's `adv_norm` at the batch level (the default: mean and unbiased std over every token) is rlc's
    advantage_batch_normalize, with rlc's eps (1e-8), on ragged masks too."""
    data = _areal("areal.utils.data")
    cli = _areal("areal.api.cli_args")
    from rlc.runtime.algorithms.advantages import batch_normalize

    mask = _mask(holes)
    _, _, _, advantages = _tensors()
    advantages = advantages * mask
    config = cli.NormConfig(mean_level="batch", std_level="batch", std_unbiased=True, eps=1e-8)
    theirs = data.Normalization(config)(advantages, mask).to(F64)
    torch.testing.assert_close(batch_normalize(advantages, mask), theirs * mask, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_areal_kl_estimator(name):
    """AReaL's KLEstimator (its KL penalty in the reward and its rejection metrics) against rlc's, on log-ratios
    inside AReaL's clamp of +-10 (rlc's k3 clamps as SkyRL does; k1 and k2 are not clamped)."""
    data = _areal("areal.utils.data")
    logp, old, _, _ = _tensors()
    theirs = data.KLEstimator(name)(logp, old).to(F64)
    ours = registry.resolve(algorithms.KLS[name].function)(logp, old)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


# AReaL has no registry of names: its algorithm is PPOActorConfig's settings. Each one is compared above (the test
# named) or not run by rlc, with the reason; test_every_areal_setting_is_compared_or_named holds the list whole.
_LOSS, _DECOUPLED = "test_areal_policy_loss", "test_areal_decoupled_loss_is_rlcs_loss_with_token_tis"
AREAL_SETTINGS = {
    "eps_clip": _LOSS,
    "eps_clip_higher": _LOSS,
    "c_clip": _LOSS,
    "importance_sampling_level": _LOSS,
    "use_sapo_loss": _LOSS,
    "sapo_tau_pos": _LOSS,
    "sapo_tau_neg": _LOSS,
    "use_decoupled_loss": _DECOUPLED,
    "rejection_sampling": _DECOUPLED + " (level token, action clamp, metric ratio, an upper bound: rlc's token TIS. "
    "Not run: action mask, where AReaL divides by the tokens before the mask and rlc's token_mean by those kept; "
    "level sequence, where AReaL weighs by the geometric-mean ratio and rlc's sequence TIS by the product; the KL "
    "metrics)",
    "reward_norm": "test_areal_group_reward_normalisation_is_grpo",
    "adv_norm": "test_areal_batch_normalisation_is_advantage_batch_normalize",
    "kl_estimator": "test_areal_kl_estimator",
    "kl_ctl": "the KL's coefficient in the reward (the importer writes use_kl_in_reward and kl_loss_coef)",
    "discount": "AReaL's GAE runs inside PPOActor._compute_advantages over rolled prompt+response rows, no function of "
    "tensors alone; rlc's gae is compared with SkyRL's and verl's",
    "gae_lambda": "as discount",
    "reward_scaling": "a linear change of the reward, which a std normalisation cancels (the importer refuses it else)",
    "reward_bias": "as reward_scaling",
    "reward_clip": "trainer.algorithm.reward_clip: AReaL's is a torch.clip inside PPOActor.compute_advantages (no "
    "function of its own to call); rlc's bound, after the overlong penalty as AReaL's, is tests/runtime/test_generator.py's",
    "overlong_reward_penalty": "test_areal_overlong_reward_penalty (trainer.algorithm.overlong_buffer_len)",
    "overlong_tokens": "test_areal_overlong_reward_penalty",
    "overlong_penalty_factor": "test_areal_overlong_reward_penalty",
    "mask_no_eos_with_zero": "a mask, not math: generator.apply_overlong_filtering",
    "m2_threshold": "test_areal_m2po_masking (off_policy_correction.m2po_threshold)",
    "recompute_logprob": "where the old log-probs come from: rlc's trainer recomputes them",
    "prox_logp_method": "recompute is rlc's; loglinear (an interpolated proximal policy) is not in rlc",
    "ppo_n_minibatches": "the batch's split (policy_mini_batch_size), not math",
    "log_agent_stats": "logging",
    "log_agent_stats_keys": "logging",
    "max_new_tokens": "the response length (generator.sampling_params.max_generate_length)",
}


def test_every_areal_setting_is_compared_or_named():
    """Each setting AReaL's PPO actor adds to its train engine's is compared above or named with its reason, so a
    setting a new AReaL release adds is noticed."""
    cli = _areal("areal.api.cli_args")
    base = {f.name for f in dataclasses.fields(cli.TrainEngineConfig)}
    settings = {f.name for f in dataclasses.fields(cli.PPOActorConfig)} - base
    assert settings == set(AREAL_SETTINGS)
    tests = {name for name in globals() if name.startswith("test_areal_")}
    for setting, said in AREAL_SETTINGS.items():
        if said.startswith("test_"):
            assert said.split(" ", 1)[0] in tests, setting


# ---- advantage estimators ----------------------------------------------------------------------------------


def _rewards(seed: int = 1, outcome: bool = True):
    """Per-token rewards: an outcome on each row's last token (scores 0/1 and fractions, a tie), or dense."""
    g = torch.Generator().manual_seed(seed)
    mask = _mask()
    if not outcome:
        return torch.randn(ROWS, LENGTH, generator=g, dtype=F64) * mask
    scores = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 0.75, 1.0, 0.0], dtype=F64)
    rewards = torch.zeros(ROWS, LENGTH, dtype=F64)
    rewards[torch.arange(ROWS), torch.tensor(LENGTHS) - 1] = scores
    return rewards


def _algorithm(norm_by_std=True, gamma=1.0, lambd=1.0):
    """The trainer.algorithm fields the estimators read."""
    return types.SimpleNamespace(grpo_norm_by_std=norm_by_std, gamma=gamma, lambd=lambd)


def _rlc_advantages(card_id, rewards, mask, index, values=None, **algorithm):
    fn = registry.get_advantage_estimator(card_id)
    return fn(rewards, mask, index=index, values=values, algorithm=_algorithm(**algorithm))


def _verl_algo_config(norm_by_std=True, gamma=1.0, lam=1.0):
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(norm_adv_by_std_in_grpo=norm_by_std, gamma=gamma, lam=lam)


def _values(seed=2):
    return torch.randn(ROWS, LENGTH, generator=torch.Generator().manual_seed(seed), dtype=F64) * _mask()


def _verl_call(name, core, rewards, mask, norm_by_std, holes_gamma):
    """verl's estimator `name`, called with the normalisation by std as an argument where it takes one (verl's
    trainer leaves it at True for grpo_vectorized and gdpo; the importer says so)."""
    fn = core.get_adv_estimator_fn(name)
    config = _verl_algo_config(norm_by_std, gamma=holes_gamma, lam=0.9)
    if name == "gae":
        return fn(token_level_rewards=rewards, values=_values(), response_mask=mask, gamma=holes_gamma, lam=0.9)
    if name in ("grpo", "grpo_vectorized", "gdpo"):
        return fn(rewards, mask, GROUPS, norm_adv_by_std_in_grpo=norm_by_std, config=config)
    if name == "reinforce_plus_plus":
        return fn(rewards, mask, config=config)
    return fn(rewards, mask, GROUPS, config=config)


VERL_ESTIMATORS = (
    "gae",
    "grpo",
    "grpo_vectorized",
    "gdpo",
    "grpo_passk",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
)


@pytest.mark.parametrize("norm_by_std", [True, False], ids=["std", "no-std"])
@pytest.mark.parametrize("name", VERL_ESTIMATORS)
def test_verl_advantage_estimator(name, norm_by_std):
    core = _verl()
    card_id = algorithms.verl_names(algorithms.ADVANTAGE_ESTIMATORS)[name]
    cases = [(_rewards(), _mask(), 1.0)]
    if not algorithms.ESTIMATORS[card_id].per_trajectory:  # per-token: dense rewards, holes, a discount
        cases += [(_rewards(outcome=False), _mask(), 0.9), (_rewards(outcome=False), _mask(holes=True), 0.9)]
    for rewards, mask, gamma in cases:
        if name == "grpo_passk":  # it refuses a group of one sample
            index = np.array([0, 0, 0, 1, 1, 1, 2, 2])
            theirs = core.get_adv_estimator_fn(name)(
                rewards.clone(), mask, index, config=_verl_algo_config(norm_by_std)
            )
        else:
            index = GROUPS
            theirs = _verl_call(name, core, rewards.clone(), mask, norm_by_std, gamma)
        values = _values() if name == "gae" else None
        ours = _rlc_advantages(card_id, rewards, mask, index, values, norm_by_std=norm_by_std, gamma=gamma, lambd=0.9)
        # verl's vectorized estimators work in float32
        tol = {"rtol": 1e-6, "atol": 1e-6} if name.endswith("vectorized") or name == "gpg" else {}
        for what, a, b in zip(("advantages", "returns"), ours, theirs):
            torch.testing.assert_close(
                a, b.to(a.dtype) * mask, **tol, msg=lambda m, part=what: f"verl {name} {part}: {m}"
            )


def _skyrl_estimator(ppo, name, rewards, mask, index, norm_by_std, gamma):
    fn = ppo.AdvantageEstimatorRegistry.get(name)
    return fn(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        values=_values(),
        gamma=gamma,
        lambd=0.9,
        grpo_norm_by_std=norm_by_std,
        config=None,
    )


@pytest.mark.parametrize("norm_by_std", [True, False], ids=["std", "no-std"])
@pytest.mark.parametrize("name", ["gae", "grpo", "rloo", "reinforce++", "maxrl"])
def test_skyrl_advantage_estimator(name, norm_by_std):
    ppo = _skyrl()
    cases = [(_rewards(), _mask(), 1.0)]
    if not algorithms.ESTIMATORS[name].per_trajectory:
        cases += [(_rewards(outcome=False), _mask(), 0.9)]
        if name != "gae":  # SkyRL's GAE reads the values of masked tokens (rlc's, as verl's, skips them)
            cases += [(_rewards(outcome=False), _mask(holes=True), 0.9)]
    index = [str(i) for i in GROUPS]
    for rewards, mask, gamma in cases:
        theirs = _skyrl_estimator(ppo, name, rewards.clone(), mask, index, norm_by_std, gamma)
        values = _values() if name == "gae" else None
        ours = _rlc_advantages(name, rewards, mask, index, values, norm_by_std=norm_by_std, gamma=gamma, lambd=0.9)
        for what, a, b in zip(("advantages", "returns"), ours, theirs):
            torch.testing.assert_close(a, b.to(a.dtype) * mask, msg=lambda m, part=what: f"SkyRL {name} {part}: {m}")


def _baseline_inputs(seed: int = 3, lengths=LENGTHS):
    """What the optimal token baselines read besides the rewards: old log-probs, each token's sum of squared
    probabilities (a real softmax's, so that 1 - 2p + sum p^2 >= 0 as it is in a run), and truncated importance
    weights."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(ROWS, LENGTH, 11, generator=g, dtype=F64) * 2, -1)
    picked = probs[..., 0]
    weights = (torch.rand(ROWS, LENGTH, generator=g, dtype=F64) * 1.5 + 0.25).clamp(max=1.2)
    return picked.log(), (probs**2).sum(-1), weights


# Groups for the token baselines: a lone longest row (its tail gets no baseline), a tie for the longest (it keeps
# one), a group of one, and a group of two.
OTB_GROUPS = np.array([0, 0, 0, 1, 1, 2, 3, 3])
OTB_LENGTHS = (7, 5, 3, 6, 6, 4, 2, 5)


def _otb_mask(holes: bool = False, empty: bool = False) -> torch.Tensor:
    mask = (torch.arange(LENGTH)[None, :] < torch.tensor(OTB_LENGTHS)[:, None]).to(F64)
    if holes:  # observations inside multi-turn responses
        mask[0, 2:4] = 0
        mask[3, 1] = 0
        mask[7, 2] = 0
    if empty:  # a row without a model token (verl's multi-turn baseline leaves it out of its group)
        mask[6] = 0
    return mask


@pytest.mark.parametrize("is_weight", [False, True], ids=["plain", "is-weight"])
@pytest.mark.parametrize("layout", ["padded", "holes", "empty-row"])
@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_verl_optimal_token_baseline(name, layout, is_weight):
    core = _verl()
    mask = _otb_mask(holes=layout != "padded", empty=layout == "empty-row")
    old, sum_pi_squared, weights = _baseline_inputs()
    rewards = torch.randn(ROWS, LENGTH, generator=torch.Generator().manual_seed(4), dtype=F64) * mask
    rewards[:, -1] += 1.0  # an outcome on the last position too (masked where the row is shorter)
    index = OTB_GROUPS
    theirs = core.get_adv_estimator_fn(name)(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        old_log_probs=old,
        sum_pi_squared=sum_pi_squared,
        rollout_is_weights=weights if is_weight else None,
        config=_verl_algo_config(),
    )
    card_id = algorithms.verl_names(algorithms.ADVANTAGE_ESTIMATORS)[name]
    fn = registry.get_advantage_estimator(card_id)
    inputs = {"old_logprobs": old, "sum_pi_squared": sum_pi_squared, "is_weight": weights if is_weight else None}
    assert set(inputs) == set(algorithms.ESTIMATORS[card_id].inputs)
    ours = fn(rewards, mask, index=index, values=None, algorithm=_algorithm(), **inputs)
    for what, a, b in zip(("advantages", "returns"), ours, theirs):
        torch.testing.assert_close(a, b.to(a.dtype) * mask, msg=lambda m, part=what: f"verl {name} {part}: {m}")


@pytest.mark.parametrize("layout", ["outcome", "dense", "holes"])
def test_verl_remax(layout):
    core = _verl()
    mask = _mask(holes=layout == "holes")
    rewards = _rewards() if layout == "outcome" else _rewards(outcome=False) * mask
    # The greedy response's reward of each row's prompt (one per prompt, repeated over its samples).
    greedy = torch.tensor([0.5, 1.0, 0.0, 0.25], dtype=F64)[torch.as_tensor(GROUPS)]
    theirs = core.get_adv_estimator_fn("remax")(rewards, greedy, mask, config=_verl_algo_config())
    card_id = algorithms.verl_names(algorithms.ADVANTAGE_ESTIMATORS)["remax"]
    assert algorithms.ESTIMATORS[card_id].inputs == ("reward_baselines",)
    ours = registry.get_advantage_estimator(card_id)(
        rewards, mask, index=GROUPS, values=None, algorithm=_algorithm(), reward_baselines=greedy
    )
    for what, a, b in zip(("advantages", "returns"), ours, theirs):
        torch.testing.assert_close(a, b.to(a.dtype) * mask, msg=lambda m, part=what: f"verl remax {part}: {m}")


def test_sum_pi_squared_is_verls():
    """The policy's pass computes each token's sum of squared probabilities as verl's actor does, after the
    temperature, chunk by chunk (`score_tokens`)."""
    _verl()
    from rlc.runtime.algorithms.losses import score_tokens
    from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits

    logits = torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(5), dtype=F64) * 3
    logits[0, 0, 4] = float("-inf")  # a banned token
    ids = torch.randint(0, 17, (3, 5), generator=torch.Generator().manual_seed(6))
    logp, ours = score_tokens(logits, ids, 0.7, sum_pi_squared=True, chunk=4)
    torch.testing.assert_close(ours, calculate_sum_pi_squared_from_logits(logits / 0.7))
    torch.testing.assert_close(logp, score_tokens(logits, ids, 0.7)[0])


# ---- every name is compared ---------------------------------------------------------------------------------


def test_every_peer_name_is_compared():
    """Each name in verl's and SkyRL's registries is compared above or listed in NOT_RUN with its reason."""
    core, ppo = _verl(), _skyrl()
    skyrl_losses = {name.partition("-")[0] for name in SKYRL_LOSSES}
    compared = {
        ("verl", "loss"): {*VERL_LOSSES, "bypass_mode"},
        ("verl", "estimator"): {*VERL_ESTIMATORS, "remax", "optimal_token_baseline", "tir_optimal_token_baseline"},
        ("skyrl", "loss"): skyrl_losses,
        ("skyrl", "estimator"): {"gae", "grpo", "rloo", "reinforce++", "maxrl"},
    }
    registries = {
        ("verl", "loss"): set(core.POLICY_LOSS_REGISTRY),
        ("verl", "estimator"): set(core.ADV_ESTIMATOR_REGISTRY),
        ("skyrl", "loss"): set(ppo.PolicyLossRegistry.list_available()),
        ("skyrl", "estimator"): set(ppo.AdvantageEstimatorRegistry.list_available()),
    }
    for key, names in registries.items():
        skipped = {name for (peer, kind, name) in NOT_RUN if (peer, kind) == key}
        assert names - compared[key] - skipped == set(), f"{key}: names neither compared nor in NOT_RUN"
        assert compared[key] - names == set(), f"{key}: compared names the peer no longer registers"
        assert skipped <= names, f"{key}: NOT_RUN names the peer no longer registers"
    # every compared name is selectable in rlc, by a card
    for name in registries["verl", "loss"] - {n for (_, _, n) in NOT_RUN}:
        assert name in algorithms.verl_names(algorithms.POLICY_LOSSES), name
    for name in registries["verl", "estimator"] - {n for (_, _, n) in NOT_RUN}:
        assert name in algorithms.verl_names(algorithms.ADVANTAGE_ESTIMATORS), name
    for name in registries["skyrl", "loss"]:
        assert name in algorithms.LOSSES, name
    for name in registries["skyrl", "estimator"]:
        assert name in algorithms.ESTIMATORS, name


# ---- reward shaping: DAPO's overlong penalty -----------------------------------------------------------------

# (response length, verl's overlong_buffer_cfg.len, penalty_factor) at max_resp_len 12: before the buffer, at its
# first token, inside it, at the maximum; a buffer as long as the whole response.
OVERLONG_CASES = [(3, 4, 1.0), (8, 4, 1.0), (9, 4, 1.0), (11, 4, 0.5), (12, 4, 1.0), (12, 12, 2.0), (1, 12, 2.0)]
OVERLONG_MAX = 12


def test_verl_dapo_reward_manager_overlong_penalty(tiny_model):
    """verl's dapo reward manager (its legacy class, the arithmetic the reward loop's repeats) on real token rows
    scored by verl's default GSM8K rule, against rlc's GSM8K score plus rlc's overlong penalty."""
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl 0.9.1 is not installed (make venv)")
    from omegaconf import OmegaConf
    from rlc.runtime.algorithms.shaping import overlong_penalty
    from rlc.runtime.envs.verl import score
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    tok = AutoTokenizer.from_pretrained(tiny_model)
    answer = tok.encode("#### 7", add_special_tokens=False)
    filler = tok.encode(" a", add_special_tokens=False)[-1:]
    prompt_len = 3
    for length, buffer_len, factor in OVERLONG_CASES:
        rows = []
        for right in (True, False):
            ids = (filler * OVERLONG_MAX + answer)[-length:] if right else (filler * length)
            ids = ids[:length]
            rows.append(ids)
        responses = torch.full((len(rows), OVERLONG_MAX), tok.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros(len(rows), prompt_len + OVERLONG_MAX, dtype=torch.long)
        mask[:, :prompt_len] = 1
        for i, ids in enumerate(rows):
            responses[i, : len(ids)] = torch.tensor(ids)
            mask[i, prompt_len : prompt_len + len(ids)] = 1
        prompts = torch.full((len(rows), prompt_len), filler[0], dtype=torch.long)
        data = DataProto.from_dict(
            tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
            non_tensors={
                "data_source": np.array(["openai/gsm8k"] * len(rows), dtype=object),
                "reward_model": np.array([{"ground_truth": "7"}] * len(rows), dtype=object),
            },
        )
        cfg = OmegaConf.create({"enable": True, "len": buffer_len, "penalty_factor": factor, "log": False})
        manager = DAPORewardManager(tok, num_examine=0, max_resp_len=OVERLONG_MAX, overlong_buffer_cfg=cfg)
        theirs = manager(data).sum(-1).to(F64)
        ours = torch.tensor(
            [
                score("openai/gsm8k", tok.decode(ids, skip_special_tokens=True), "7")
                + overlong_penalty(len(ids), OVERLONG_MAX, buffer_len, factor)
                for ids in rows
            ],
            dtype=F64,
        )
        torch.testing.assert_close(ours, theirs, msg=lambda m, c=(length, buffer_len, factor): f"{c}: {m}")
    assert overlong_penalty(12, OVERLONG_MAX, 4, 1.0) == -1.0 and overlong_penalty(8, OVERLONG_MAX, 4, 1.0) == 0.0


def test_areal_overlong_reward_penalty():
    """AReaL's overlong reward penalty (actor.overlong_reward_penalty, the arithmetic its PPO actor applies to the
    rewards) against rlc's, on rows whose response lengths fall before, at and inside the buffer and at the maximum."""
    functional = _areal("areal.utils.functional.functional")
    from rlc.runtime.algorithms.shaping import overlong_penalty

    for length, buffer_len, factor in OVERLONG_CASES:
        lengths = [length, max(1, length - 2), OVERLONG_MAX]
        mask = torch.zeros(len(lengths), OVERLONG_MAX + 2, dtype=torch.long)
        for i, n in enumerate(lengths):
            mask[i, 2 : 2 + n] = 1
        rewards = torch.tensor([1.0, 0.0, 0.5], dtype=F64)
        data = {"rewards": rewards.clone(), "input_ids": torch.zeros_like(mask), "loss_mask": mask}
        theirs = functional.reward_overlong_penalty(
            data, overlong_tokens=buffer_len, overlong_penalty_factor=factor, max_response_length=OVERLONG_MAX
        )["rewards"]
        ours = rewards + torch.tensor(
            [overlong_penalty(n, OVERLONG_MAX, buffer_len, factor) for n in lengths], dtype=F64
        )
        torch.testing.assert_close(ours, theirs, msg=lambda m, c=(length, buffer_len, factor): f"{c}: {m}")


# verl's reward managers (its legacy registry and the reward loop's), each with what rlc makes of it: the importer
# (compiler/importers/verl/importer.py) says the same in its notes.
VERL_REWARD_MANAGERS = {
    "naive": "the environment scores each row as the manager does",
    "batch": "the same scores, the scoring function called on the batch at once",
    "dapo": "compared above: the overlong penalty is trainer.algorithm.overlong_buffer_len",
    "prime": "the same scores, computed in parallel processes (a row past 300 s scores 0)",
    "gdpo": "the naive manager's score; its dict's components are gdpo_reward_keys' (test_verl_gdpo_reward_components)",
    "rate_limited": "the naive manager's scores, its calls throttled",
    "remote": "scoring by a remote reward server: not carried (the importer marks it !!)",
}


def test_every_verl_reward_manager_is_accounted_for():
    pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl 0.9.1 is not installed (make venv)")
    import verl.experimental.reward_loop.reward_manager  # noqa: F401  (its managers register on import)
    import verl.workers.reward_manager  # noqa: F401
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY

    names = set(REWARD_MANAGER) | set(REWARD_MANAGER_REGISTRY)
    assert names == set(VERL_REWARD_MANAGERS), names ^ set(VERL_REWARD_MANAGERS)


@pytest.mark.parametrize("weights", [None, [0.7, 1.5, 0.2]], ids=["equal", "weighted"])
@pytest.mark.parametrize("norm_by_std", [True, False], ids=["std", "no-std"])
def test_verl_gdpo_reward_components(weights, norm_by_std):
    """verl's gdpo with algorithm.gdpo_reward_keys (each component of the reward function's dict normalised within
    its group apart, weighted, summed, whitened) against rlc's, the components on each row's last token."""
    core = _verl()
    from verl.trainer.config import AlgoConfig

    keys = ["accuracy", "format", "length"]
    g = torch.Generator().manual_seed(3)
    scores = {k: torch.randint(0, 3, (ROWS,), generator=g).to(F64) / 2 for k in keys}
    scores["format"][3:6] = 1.0  # a group where one component is all equal
    mask = _mask()
    last = torch.tensor(LENGTHS) - 1
    parts = []
    for k in keys:
        part = torch.zeros(ROWS, LENGTH, dtype=F64)
        part[torch.arange(ROWS), last] = scores[k]
        parts.append(part)
    prompt = 2
    batch = {
        "prompts": torch.zeros(ROWS, prompt, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(ROWS, prompt), mask], dim=1).long(),  # verl: an integer mask
    }
    config = AlgoConfig(norm_adv_by_std_in_grpo=norm_by_std, gdpo_reward_keys=keys, gdpo_reward_weights=weights)
    theirs, _ = core.get_adv_estimator_fn("gdpo")(
        torch.zeros(ROWS, LENGTH, dtype=F64),
        mask,
        GROUPS,
        norm_adv_by_std_in_grpo=norm_by_std,
        config=config,
        non_tensor_batch={k: scores[k].numpy() for k in keys},
        batch=batch,
    )
    algorithm = types.SimpleNamespace(grpo_norm_by_std=norm_by_std, gdpo_reward_weights=weights)
    ours, _ = registry.get_advantage_estimator("gdpo")(
        torch.zeros(ROWS, LENGTH, dtype=F64), mask, index=GROUPS, values=None, algorithm=algorithm, components=parts
    )
    # verl reads the components as float32
    torch.testing.assert_close(ours, theirs.to(F64) * mask, rtol=1e-5, atol=1e-6)
