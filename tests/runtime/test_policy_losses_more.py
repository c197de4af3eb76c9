"""gspo, cispo, sapo, clip_cov and kl_cov against values worked out by hand, and the loss/estimator registry."""

from __future__ import annotations

import math
import textwrap

import pytest

torch = pytest.importorskip("torch")

from rlc.core import algorithms  # noqa: E402
from rlc.runtime.algorithms import registry  # noqa: E402
from rlc.runtime.algorithms.advantages import gae_advantages, grpo_advantages  # noqa: E402
from rlc.runtime.algorithms.losses import (  # noqa: E402  # noqa: E402  # noqa: E402
    cispo_token_loss,
    clip_cov_token_loss,
    gspo_token_loss,
    kl_cov_token_loss,
    regular_token_loss,
    sapo_token_loss,
    token_weights,
)
from rlc.runtime.algorithms.registry import policy_loss_options  # noqa: E402
from rlc.spec import algorithm as spec  # noqa: E402

POLICY_TOKEN_LOSSES = registry.functions(algorithms.POLICY_LOSSES)

F64 = torch.float64
NAN, INF = math.nan, math.inf
NEW_LOSSES = ("gspo", "clip_cov", "kl_cov", "cispo", "sapo")
LN2 = math.log(2.0)


def t(values, dtype=F64, grad=False):
    return torch.tensor(values, dtype=dtype, requires_grad=grad)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(actual.detach(), torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def defaults(name: str) -> dict:
    return policy_loss_options(name, spec.AlgorithmConfig())


# ---- options --------------------------------------------------------------------------------------


def test_options_read_from_the_algorithm_config():
    a = spec.AlgorithmConfig(eps_clip_low=0.1, eps_clip_high=0.3, clip_ratio_c=4.0)
    a.sapo.tau_neg, a.cispo.cispo_eps_clip_high, a.kl_cov.ppo_kl_coef = 2.0, 3.0, 0.5
    assert policy_loss_options("regular", a) == {"eps_clip_low": 0.1, "eps_clip_high": 0.3, "clip_ratio_c": 4.0}
    assert policy_loss_options("dual_clip", a) == policy_loss_options("regular", a)
    assert policy_loss_options("gspo", a) == {"eps_clip_low": 0.1, "eps_clip_high": 0.3}
    assert policy_loss_options("clip_cov", a) == {
        "eps_clip_low": 0.1,
        "eps_clip_high": 0.3,
        "clip_ratio": 0.0002,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
    }
    assert policy_loss_options("kl_cov", a) == {"kl_cov_frac": 0.2, "ppo_kl_coef": 0.5}
    assert policy_loss_options("cispo", a) == {"cispo_eps_clip_low": 0.0, "cispo_eps_clip_high": 3.0}
    assert policy_loss_options("sapo", a) == {"tau_pos": 1.0, "tau_neg": 2.0}
    with pytest.raises(KeyError, match="not a built-in policy loss"):
        policy_loss_options("nope", a)


@pytest.mark.parametrize("name", sorted(POLICY_TOKEN_LOSSES))
def test_worker_call_shape_for_every_loss(name):
    # As the worker calls it: the loss from the table, options from the config.
    logp = t([[-1.0, -2.0], [-0.5, -0.1]], grad=True)
    # an option without a default is one the compiler asks for (dro.beta, RLC-E315)
    options = {k: 0.1 if v is None and k == "beta" else v for k, v in defaults(name).items()}
    if algorithms.LOSSES[name].rollout_anchored:  # the worker adds the engine's log-probs
        options["rollout_log_probs"] = logp.detach() - 0.05
    token_loss, metrics = POLICY_TOKEN_LOSSES[name](
        logp, logp.detach() + 0.05, t([[1.0, 1.0], [-1.0, -1.0]]), t([[1, 1], [1, 0]]), **options
    )
    assert token_loss.shape == (2, 2) and torch.isfinite(token_loss).all()
    assert all(v.dim() == 0 and not v.requires_grad and torch.isfinite(v) for v in metrics.values())


# ---- edge cases shared by the new losses --------------------------------------------------------


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_single_on_policy_token_gets_the_plain_policy_gradient(name):
    # r = 1: every loss's gradient w.r.t. log p is -A (sapo's gate has slope 1 there, cispo weighs by 1).
    logp = t([[-0.7]], grad=True)
    token_loss, _ = POLICY_TOKEN_LOSSES[name](logp, t([[-0.7]]), t([[1.5]]), t([[1]]), **defaults(name))
    expected = {"gspo": -1.5, "clip_cov": -1.5, "kl_cov": -1.5, "cispo": -1.0 * 1.5 * -0.7, "sapo": -1.5 * 4 * 0.5}
    close(token_loss, [[expected[name]]])
    token_loss.sum().backward()
    close(logp.grad, [[-1.5]])


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_inf_and_nan_in_masked_slots_never_leak(name):
    mask = t([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    logp_clean = [[-1.0, -0.5, 0.0], [0.0, 0.0, 0.0], [-0.3, 0.0, 0.0]]
    old_clean = [[-1.2, -0.4, 0.0], [0.0, 0.0, 0.0], [-0.1, 0.0, 0.0]]
    adv_clean = [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [-2.0, 0.0, 0.0]]
    logp_dirty = t([[-1.0, -0.5, -INF], [NAN, -INF, INF], [-0.3, NAN, -INF]], grad=True)
    old_dirty = [[-1.2, -0.4, NAN], [INF, NAN, -INF], [-0.1, -INF, NAN]]
    adv_dirty = [[1.0, 1.0, INF], [NAN, -INF, NAN], [-2.0, NAN, INF]]
    fn, options = POLICY_TOKEN_LOSSES[name], defaults(name)
    if name == "clip_cov":  # a wide band so a token is dropped, by the same draw both times
        options.update(clip_cov_lb=-10.0, generator=torch.Generator().manual_seed(0))
    dirty, dirty_metrics = fn(logp_dirty, t(old_dirty), t(adv_dirty), mask, **options)
    if name == "clip_cov":
        options["generator"].manual_seed(0)
    clean, clean_metrics = fn(t(logp_clean), t(old_clean), t(adv_clean), mask, **options)
    assert torch.isfinite(dirty).all() and (dirty[mask == 0] == 0).all()
    close(dirty, clean, tol=1e-12)
    for key, value in clean_metrics.items():
        close(dirty_metrics[key], value, tol=1e-12)
    w = token_weights(mask, "sequence_mean", total_tokens=3, total_sequences=3)
    (dirty * w).sum().backward()
    assert torch.isfinite(logp_dirty.grad).all() and (logp_dirty.grad[mask == 0] == 0).all()


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_fully_masked_batch_gives_zero_loss_and_metrics(name):
    logp = t([[NAN, -INF]], grad=True)
    token_loss, metrics = POLICY_TOKEN_LOSSES[name](
        logp, t([[0.0, NAN]]), t([[INF, 1.0]]), t([[0, 0]]), **defaults(name)
    )
    close(token_loss, [[0.0, 0.0]])
    assert all(float(v) == 0.0 for v in metrics.values())


# ---- gspo ----------------------------------------------------------------------------------------


def test_gspo_shares_the_sequence_ratio_and_clips_it():
    # Row 0 log-ratios 0.1, 0.3 (third token masked) -> s = e^0.2 = 1.2214 > 1.2: A = 2 > 0 is clipped.
    # Row 1 log-ratios -0.1, 0, -0.1 -> s = e^(-1/15) = 0.93551, inside the clip range; A = -1.
    logp = t([[-1.0, -2.0, -INF], [-0.5, -1.5, -1.0]], grad=True)
    old = t([[-1.1, -2.3, NAN], [-0.4, -1.5, -0.9]])
    adv = t([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    s0, s1 = math.exp(0.2), math.exp(-1 / 15)
    token_loss, metrics = gspo_token_loss(logp, old, adv, mask, eps_clip_low=0.2, eps_clip_high=0.2)
    close(token_loss, [[-2.4, -2.4, 0.0], [s1, s1, s1]])
    close(metrics["clip_fraction"], 2 / 5)
    close(metrics["approx_kl"], -(0.1 + 0.3 - 0.1 + 0.0 - 0.1) / 5)
    close(metrics["ratio_mean"], (2 * s0 + 3 * s1) / 5)
    token_loss.sum().backward()
    # Each token's gradient is its own: d(-s_t * A)/d log p_t = -s * A; clipped tokens get none.
    close(logp.grad, [[0.0, 0.0, 0.0], [s1, s1, s1]])


def test_gspo_ratio_on_the_clip_boundary_is_not_clipped():
    logp = t([[-1.0, -2.0]], grad=True)
    token_loss, metrics = gspo_token_loss(
        logp, t([[-1.0, -2.0]]), t([[3.0, -3.0]]), t([[1, 1]]), eps_clip_low=0.0, eps_clip_high=0.0
    )
    close(token_loss, [[-3.0, 3.0]])
    close(metrics["clip_fraction"], 0.0)
    token_loss.sum().backward()
    close(logp.grad, [[-3.0, 3.0]])


def test_gspo_ratio_is_the_geometric_mean_not_the_token_ratio():
    # Token ratios 2 and 1/2 average to log-ratio 0: the sequence is on-policy, nothing is clipped.
    token_loss, metrics = gspo_token_loss(t([[LN2, -LN2]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[1, 1]]))
    close(token_loss, [[-1.0, -1.0]])
    close(metrics["clip_fraction"], 0.0)


# ---- cispo ---------------------------------------------------------------------------------------


def test_cispo_weights_the_log_prob_by_the_clipped_ratio_as_a_constant():
    # Ratios 2, 1, 1/2 clip to 1.2, 1, 0.8 in [0.8, 1.2].
    logp = t([[-0.5, -1.0, -2.0]], grad=True)
    old = t([[-0.5 - LN2, -1.0, -2.0 + LN2]])
    adv = t([[1.0, -1.0, 2.0]])
    token_loss, metrics = cispo_token_loss(
        logp, old, adv, t([[1, 1, 1]]), cispo_eps_clip_low=0.2, cispo_eps_clip_high=0.2
    )
    close(token_loss, [[-1.2 * 1.0 * -0.5, -1.0 * -1.0 * -1.0, -0.8 * 2.0 * -2.0]])
    close(metrics["clip_fraction"], 2 / 3)
    close(metrics["ratio_mean"], (2 + 1 + 0.5) / 3)
    close(metrics["clipped_ratio_mean"], (1.2 + 1 + 0.8) / 3)
    close(metrics["approx_kl"], 0.0)
    token_loss.sum().backward()
    # Gradient -w * A only: differentiating the ratio too would add -w' * A * log p terms.
    close(logp.grad, [[-1.2, 1.0, -1.6]])


def test_cispo_clipped_tokens_still_learn_where_ppo_gives_none():
    logp = t([[-0.5]], grad=True)
    old, adv, mask = t([[-0.5 - LN2]]), t([[1.0]]), t([[1]])
    cispo_token_loss(logp, old, adv, mask, cispo_eps_clip_low=0.2, cispo_eps_clip_high=0.2)[0].sum().backward()
    close(logp.grad, [[-1.2]])
    ppo_logp = t([[-0.5]], grad=True)
    regular_token_loss(ppo_logp, old, adv, mask)[0].sum().backward()
    close(ppo_logp.grad, [[0.0]])


def test_cispo_ratio_on_the_lower_bound_is_not_clipped():
    # Spec defaults: low 0, so the bound is exactly r = 1.
    _, metrics = cispo_token_loss(
        t([[-1.0, -2.0]]), t([[-1.0, -2.0 + LN2]]), t([[1.0, 1.0]]), t([[1, 1]]), **defaults("cispo")
    )
    close(metrics["clip_fraction"], 0.5)
    close(metrics["clipped_ratio_mean"], 1.0)


# ---- sapo ----------------------------------------------------------------------------------------


def test_sapo_gate_values_and_gradients():
    # Gate f(r) = 4/tau * sigmoid(tau * (r - 1)); df/d log p = 4 * s * (1 - s) * r, tau cancels.
    logp = t([[-1.0, -1.0, -1.0 + LN2, -2.0]], grad=True)
    old = t([[-1.0, -1.0, -1.0, -2.0]])
    adv = t([[1.0, -1.0, 2.0, 0.0]])
    token_loss, metrics = sapo_token_loss(logp, old, adv, t([[1, 1, 1, 1]]), tau_pos=1.0, tau_neg=1.05)
    s1 = sigmoid(1.0)
    close(token_loss, [[-2.0, 0.5 * 4 / 1.05, -2.0 * 4 * s1, 0.0]])
    slope = [1.0, 1.0, 4 * s1 * (1 - s1), 1.0]
    close(metrics["gate_weight_mean"], sum(slope) / 4)
    close(metrics["ratio_mean"], (1 + 1 + 2 + 1) / 4)
    token_loss.sum().backward()
    close(logp.grad, [[-1.0, 1.0, -2.0 * slope[2] * 2.0, 0.0]])


def test_sapo_negative_advantages_use_tau_neg():
    r = 1.5
    token_loss, _ = sapo_token_loss(t([[math.log(r)]]), t([[0.0]]), t([[-1.0]]), t([[1]]), tau_pos=1.0, tau_neg=2.0)
    close(token_loss, [[4 / 2.0 * sigmoid(2.0 * (r - 1))]])


# ---- clip_cov ------------------------------------------------------------------------------------

# Five tokens: mean A = (2 + 2 + 2 - 1 - 1) / 5 = 0.8, mean log p = -8 / 5 = -1.6, so
# cov = (1.2)(0.6) = 0.72, (1.2)(-0.4) = -0.48, (1.2)(-1.4) = -1.68, (-1.8)(1.1) = -1.98, (-1.8)(0.1) = -0.18.
COV_LOGP = [[-1.0, -2.0, -3.0], [-0.5, -1.5, -INF]]
COV_ADV = [[2.0, 2.0, 2.0], [-1.0, -1.0, NAN]]
COV_MASK = [[1, 1, 1], [1, 1, 0]]
# Token (0, 0) has ratio 2: PPO clips it (A > 0), so it is no Clip-Cov candidate despite its cov.
COV_OLD = [[-1.0 - LN2, -2.0, -3.0], [-0.5, -1.5, NAN]]


def test_clip_cov_drops_candidates_inside_the_covariance_band():
    logp = t(COV_LOGP, grad=True)
    token_loss, metrics = clip_cov_token_loss(
        logp, t(COV_OLD), t(COV_ADV), t(COV_MASK), clip_ratio=0.4, clip_cov_lb=-1.0, clip_cov_ub=1.0
    )
    # Band (-1, 1) holds -0.48 and -0.18 (0.72 is PPO-clipped); floor(0.4 * 5) = 2 -> both dropped.
    close(token_loss, [[-2.4, 0.0, -2.0], [1.0, 0.0, 0.0]])
    close(metrics["clip_fraction"], 1 / 5)
    close(metrics["cov_clip_fraction"], 2 / 5)
    close(metrics["approx_kl"], -LN2 / 5)
    token_loss.sum().backward()
    close(logp.grad, [[0.0, 0.0, -2.0], [1.0, 0.0, 0.0]])


def test_clip_cov_draws_from_the_generator():
    def dropped(seed):
        g = torch.Generator().manual_seed(seed)
        token_loss, metrics = clip_cov_token_loss(
            t(COV_LOGP),
            t(COV_OLD),
            t(COV_ADV),
            t(COV_MASK),
            clip_ratio=0.2,
            clip_cov_lb=-1.0,
            clip_cov_ub=1.0,
            generator=g,
        )
        close(metrics["cov_clip_fraction"], 1 / 5)  # floor(0.2 * 5) = 1 of the 2 candidates
        return tuple(map(tuple, (token_loss == 0).nonzero().tolist()))

    picks = {seed: dropped(seed) for seed in range(16)}
    assert all(p in {((0, 1), (1, 2)), ((1, 1), (1, 2))} for p in picks.values())
    assert len(set(picks.values())) == 2
    assert all(dropped(seed) == p for seed, p in picks.items())


def test_clip_cov_drops_at_least_one_token_and_none_outside_the_band():
    _, metrics = clip_cov_token_loss(
        t(COV_LOGP), t(COV_OLD), t(COV_ADV), t(COV_MASK), clip_ratio=0.0, clip_cov_lb=-1.0, clip_cov_ub=1.0
    )
    close(metrics["cov_clip_fraction"], 1 / 5)
    # Defaults (band (1, 5)): no token qualifies, so this is the plain PPO loss.
    token_loss, metrics = clip_cov_token_loss(t(COV_LOGP), t(COV_OLD), t(COV_ADV), t(COV_MASK), clip_ratio=1.0)
    close(token_loss, [[-2.4, -2.0, -2.0], [1.0, 1.0, 0.0]])
    close(metrics["cov_clip_fraction"], 0.0)


def test_clip_cov_with_equal_advantages_is_plain_ppo():
    # All covariances are 0, outside any band above 0.
    token_loss, metrics = clip_cov_token_loss(
        t([[-1.0, -3.0]]), t([[-1.0, -3.0]]), t([[0.5, 0.5]]), t([[1, 1]]), clip_ratio=1.0, clip_cov_lb=0.0
    )
    close(token_loss, [[-0.5, -0.5]])
    close(metrics["cov_clip_fraction"], 0.0)


# ---- kl_cov --------------------------------------------------------------------------------------


def test_kl_cov_penalizes_the_top_covariance_tokens():
    # Same covariances as above; the top two are 0.72 at (0, 0) and -0.18 at (1, 1).
    logp = t(COV_LOGP, grad=True)
    old = t([[-1.0 - LN2, -2.0, -3.0], [-0.5, -1.4, NAN]])  # (1, 1): log r = -0.1
    token_loss, metrics = kl_cov_token_loss(logp, old, t(COV_ADV), t(COV_MASK), kl_cov_frac=0.4, ppo_kl_coef=0.5)
    r11 = math.exp(-0.1)
    close(token_loss, [[-2 * 2 + 0.5 * LN2, -2.0, -2.0], [1.0, r11 + 0.5 * 0.1, 0.0]])
    close(metrics["kl_cov_fraction"], 2 / 5)
    close(metrics["approx_kl"], -(LN2 - 0.1) / 5)
    token_loss.sum().backward()
    # d/d log p of -A r + c |log r| = -A r + c sign(log r); no clipping anywhere.
    close(logp.grad, [[-4.0 + 0.5, -2.0, -2.0], [1.0, r11 - 0.5, 0.0]])


def test_kl_cov_ties_go_to_the_earlier_token():
    # Equal advantages: every covariance is 0, so the first floor(0.5 * 4) = 2 unmasked tokens are chosen.
    logp = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    old = logp - 0.2
    token_loss, metrics = kl_cov_token_loss(
        logp, old, t([[1.0] * 3] * 2), t([[0, 1, 1], [1, 1, 0]]), kl_cov_frac=0.5, ppo_kl_coef=1.0
    )
    r = math.exp(0.2)
    close(token_loss, [[0.0, -r + 0.2, -r + 0.2], [-r, -r, 0.0]])
    close(metrics["kl_cov_fraction"], 0.5)


# ---- registry ------------------------------------------------------------------------------------


def halve(log_probs, old_log_probs, advantages, mask, *, scale):
    return -scale * advantages * mask, {}


def test_registry_finds_the_built_ins():
    for name, fn in POLICY_TOKEN_LOSSES.items():
        assert registry.get_policy_loss(name) is fn
    a = spec.AlgorithmConfig()
    assert registry.get_policy_loss_options("sapo", a) == {"tau_pos": 1.0, "tau_neg": 1.05}


def test_built_in_estimators_share_the_custom_calling_convention():
    a = spec.AlgorithmConfig(grpo_norm_by_std=False, gamma=0.5, lambd=0.5)
    rewards, mask = t([1.0, 0.0, 0.5]), t([[1, 1], [1, 1], [1, 0]])
    got = registry.get_advantage_estimator("grpo")(rewards, mask, index=[0, 0, 1], values=None, algorithm=a)
    want = grpo_advantages(rewards, mask, [0, 0, 1], norm_by_std=False)
    for g, w in zip(got, want):
        close(g, w)
    token_rewards, values = t([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]), t([[0.5, 0.2], [0.1, 0.3], [0.0, 0.0]])
    got = registry.get_advantage_estimator("gae")(token_rewards, mask, index=None, values=values, algorithm=a)
    want = gae_advantages(token_rewards, values, mask, gamma=0.5, lambd=0.5)
    for g, w in zip(got, want):
        close(g, w)
    with pytest.raises(ValueError, match="critic"):
        registry.get_advantage_estimator("gae")(token_rewards, mask, index=None, values=None, algorithm=a)


def test_registered_policy_loss_and_its_options():
    registry.register_policy_loss("test_halve", halve, options=lambda a: {"scale": a.eps_clip_high})
    assert registry.get_policy_loss("test_halve") is halve
    assert registry.get_policy_loss_options("test_halve", spec.AlgorithmConfig(eps_clip_high=0.5)) == {"scale": 0.5}
    registry.register_policy_loss("test_default_options", regular_token_loss)
    assert registry.get_policy_loss_options("test_default_options", spec.AlgorithmConfig()) == {
        "eps_clip_low": 0.2,
        "eps_clip_high": 0.2,
        "clip_ratio_c": 3.0,
    }
    with pytest.raises(ValueError, match="built-in"):
        registry.register_policy_loss("regular", halve)
    with pytest.raises(TypeError):
        registry.register_policy_loss("test_bad_options", halve, options={"scale": 1.0})


def test_registered_advantage_estimator():
    def constant(rewards, mask, *, index, values, algorithm):
        return mask * 2.0, mask * 3.0

    registry.register_advantage_estimator("test_constant", constant)
    adv, returns = registry.get_advantage_estimator("test_constant")(
        t([1.0]), t([[1, 0]]), index=[0], values=None, algorithm=spec.AlgorithmConfig()
    )
    close(adv, [[2.0, 0.0]])
    close(returns, [[3.0, 0.0]])
    with pytest.raises(ValueError, match="built-in"):
        registry.register_advantage_estimator("grpo", constant)


@pytest.fixture
def installed_extension(tmp_path, monkeypatch):
    """A distribution on sys.path declaring one policy loss and one estimator as entry points."""
    (tmp_path / "rlc_test_ep_ext.py").write_text(
        textwrap.dedent("""
        def scaled(log_probs, old_log_probs, advantages, mask, *, scale):
            return -scale * advantages * mask, {}

        scaled.rlc_options = lambda algorithm: {"scale": algorithm.eps_clip_low * 10}

        def ones(rewards, mask, *, index, values, algorithm):
            return mask * 1.0, mask * 1.0
    """)
    )
    info = tmp_path / "rlc_test_ep_ext-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlc-test-ep-ext\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rlc.policy_losses]\nep_scaled = rlc_test_ep_ext:scaled\n\n"
        "[rlc.advantage_estimators]\nep_ones = rlc_test_ep_ext:ones\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))


def test_entry_points_supply_losses_and_estimators(installed_extension):
    loss = registry.get_policy_loss("ep_scaled")
    options = registry.get_policy_loss_options("ep_scaled", spec.AlgorithmConfig(eps_clip_low=0.3))
    assert options == {"scale": pytest.approx(3.0)}
    token_loss, _ = loss(t([[0.0]]), t([[0.0]]), t([[2.0]]), t([[1]]), **options)
    close(token_loss, [[-6.0]])
    adv, _ = registry.get_advantage_estimator("ep_ones")(
        t([1.0]), t([[1, 1]]), index=[0], values=None, algorithm=spec.AlgorithmConfig()
    )
    close(adv, [[1.0, 1.0]])


def test_unknown_name_explains_how_to_add_one(installed_extension):
    with pytest.raises(KeyError) as caught:
        registry.get_policy_loss("my_loss")
    message = str(caught.value)
    assert "unknown policy loss 'my_loss'" in message
    assert "cispo" in message and "ep_scaled" in message
    assert 'ext.add_values("trainer.algorithm.policy_loss_type", ["my_loss"])' in message
    assert '"rlc.policy_losses"' in message
    with pytest.raises(KeyError, match="trainer.algorithm.advantage_estimator.*rlc.advantage_estimators"):
        registry.get_advantage_estimator("my_estimator")
