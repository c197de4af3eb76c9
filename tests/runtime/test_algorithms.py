"""The RL math in rlc.runtime.algorithms against values worked out by hand on tiny tensors."""

from __future__ import annotations

import math
import statistics

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.algorithms.advantages import (  # noqa: E402  # noqa: E402
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from rlc.runtime.algorithms.kl import kl_loss, kl_penalized_rewards, token_kl  # noqa: E402
from rlc.runtime.algorithms.losses import (  # noqa: E402  # noqa: E402
    dual_clip_policy_loss,
    entropy_from_logits,
    reduce_loss,
    regular_policy_loss,
    token_log_probs,
)

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


# Four samples of one prompt; the last response is one token shorter.
MASK_4x3 = t([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])


# ---- advantages ---------------------------------------------------------------------------------


def test_grpo_one_group_normalized_by_std():
    # rewards 1,0,1,0: mean 0.5; unbiased var = 4 * 0.5**2 / 3 = 1/3; std = 0.57735
    std = math.sqrt(1 / 3)
    adv, returns = grpo_advantages(t([1.0, 0.0, 1.0, 0.0]), MASK_4x3, index=[0, 0, 0, 0])
    a = 0.5 / (std + 1e-6)  # 0.866
    close(adv, [[a, a, a], [-a, -a, -a], [a, a, a], [-a, -a, 0.0]])
    close(returns, adv)


def test_grpo_groups_by_prompt_key_and_sums_token_rewards():
    # uids interleave two prompts; rewards sit on the last token as the trainer lays them out.
    token_rewards = t([[0, 2.0], [0, 3.0], [0, 0.0], [0, 3.0], [0, 3.0]])
    adv, _ = grpo_advantages(token_rewards, torch.ones(5, 2), index=["a", "b", "a", "b", "b"], norm_by_std=False)
    # group a: 2, 0 -> mean 1 -> +1, -1; group b: 3, 3, 3 -> 0
    close(adv[:, 0], [1.0, 0.0, -1.0, 0.0, 0.0])


def test_grpo_equal_rewards_give_zero_and_a_single_sample_keeps_its_score():
    rewards = t([1.0, 1.0, 1.0, 7.0])  # prompt 0 all equal, prompt 1 a single sample
    adv, _ = grpo_advantages(rewards, torch.ones(4, 2), index=torch.tensor([0, 0, 0, 1]))
    assert not adv.isnan().any()
    close(adv[:3], torch.zeros(3, 2))
    close(adv[3], [7.0 / (1 + 1e-6)] * 2)  # mean 0 and std 1 for a group of one, as SkyRL and verl
    adv, _ = grpo_advantages(rewards, torch.ones(4, 2), index=torch.tensor([0, 0, 0, 1]), norm_by_std=False)
    close(adv[3], [7.0, 7.0])


def test_rloo_leave_one_out_baseline():
    # 1 - mean(0, 1, 0) = 2/3 ; 0 - mean(1, 1, 0) = -2/3 ; the lone sample of prompt 1 gets 0
    adv, returns = rloo_advantages(t([1.0, 0.0, 1.0, 0.0, 5.0]), torch.ones(5, 1), index=[0, 0, 0, 0, 1])
    close(adv[:, 0], [2 / 3, -2 / 3, 2 / 3, -2 / 3, 0.0])
    close(returns, adv)


def test_reinforce_pp_discounted_returns_whitened_over_the_batch():
    rewards = t([[0, 0, 1.0], [0, 1.0, 9.0]])  # the 9 sits on a padded position and must not count
    mask = t([[1, 1, 1], [1, 1, 0]])
    adv, returns = reinforce_pp_advantages(rewards, mask, gamma=0.5)
    # row 0: 0.25, 0.5, 1 ; row 1: 0 + 0.5 * 1 = 0.5, 1, (padding) 0
    close(returns, [[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]])
    valid = [0.25, 0.5, 1.0, 0.5, 1.0]  # mean 0.65, unbiased var 0.45 / 4 = 0.1125
    mean, std = statistics.mean(valid), statistics.stdev(valid)
    z = [(v - mean) / math.sqrt(std**2 + 1e-8) for v in valid]
    close(adv, [[z[0], z[1], z[2]], [z[3], z[4], 0.0]])


def test_gae_recursion_and_whitening():
    rewards, values = t([[0, 0, 1.0]]), t([[0.5, 0.6, 0.7]])
    adv, returns = gae_advantages(rewards, values, torch.ones(1, 3), gamma=0.9, lambd=0.8)
    # t=2: delta = 1 + 0.9*0 - 0.7 = 0.3                       A2 = 0.3
    # t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03   A1 = 0.03 + 0.72*0.3   = 0.246
    # t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04   A0 = 0.04 + 0.72*0.246 = 0.21712
    raw = [0.21712, 0.246, 0.3]
    close(returns, [[0.71712, 0.846, 1.0]])  # A + V, not whitened
    mean, std = statistics.mean(raw), statistics.stdev(raw)
    close(adv, [[(a - mean) / math.sqrt(std**2 + 1e-8) for a in raw]])


def test_gae_ignores_padding_on_either_side():
    base_adv, base_ret = gae_advantages(t([[0, 1.0]]), t([[0.2, 0.4]]), torch.ones(1, 2), gamma=0.9, lambd=0.8)
    # The same response right-padded and left-padded, with junk values and rewards in the padding.
    rewards = t([[0, 1.0, 5.0], [5.0, 0, 1.0]])
    values = t([[0.2, 0.4, 99.0], [99.0, 0.2, 0.4]])
    mask = t([[1, 1, 0], [0, 1, 1]])
    _, ret = gae_advantages(rewards, values, mask, gamma=0.9, lambd=0.8)
    close(ret[0, :2], base_ret[0])
    close(ret[1, 1:], base_ret[0])
    assert ret[0, 2] == 0 and ret[1, 0] == 0


def test_fully_masked_sequence_gets_zero_advantage_without_nan():
    mask = t([[1, 1], [0, 0]])
    rewards = t([[0, 1.0], [0, 1.0]])
    outputs = [
        grpo_advantages(rewards, mask, index=[0, 0]),
        rloo_advantages(rewards, mask, index=[0, 1]),
        reinforce_pp_advantages(rewards, mask),
        gae_advantages(rewards, t([[0.1, 0.2], [0.3, 0.4]]), mask),
    ]
    for adv, returns in outputs:
        assert not adv.isnan().any() and not returns.isnan().any()
        assert (adv[1] == 0).all()
    everything_masked = torch.zeros(2, 2)
    adv, _ = reinforce_pp_advantages(rewards, everything_masked)
    assert not adv.isnan().any() and (adv == 0).all()


# ---- KL -----------------------------------------------------------------------------------------


def test_kl_estimators_for_a_known_pair():
    # policy p = 0.5, reference q = 0.25: delta = log p - log q = log 2 = 0.693147
    lp, ref = t([math.log(0.5), math.log(0.25)]), t([math.log(0.25), math.log(0.5)])
    d = math.log(2)
    close(token_kl(lp, ref, estimator="k1"), [d, -d])
    close(token_kl(lp, ref, estimator="abs"), [d, d])
    close(token_kl(lp, ref, estimator="k2"), [0.5 * d * d, 0.5 * d * d])  # 0.240227
    # k3 = q/p - log(q/p) - 1: 0.5 + d - 1 = 0.193147 ; 2 - d - 1 = 0.306853
    close(token_kl(lp, ref, estimator="k3"), [0.5 + d - 1, 2 - d - 1])


def test_k3_is_clamped_and_mask_hides_nan():
    lp, ref = t([-40.0, 0.0, 0.0, float("nan")]), t([-10.0, -40.0, -5.0, 0.0])
    kl = token_kl(lp, ref, mask=t([1, 1, 1, 0]), estimator="k3")
    # k3 = e^x - x - 1 with x = ref - lp:
    # x = 30 -> clamped to 20 -> e^20 - 21 -> clamped to 10 ; x = -40 -> -20 -> e^-20 + 19 -> clamped to 10
    # x = -5 -> e^-5 + 4 = 4.006738 (inside both clamps) ; masked NaN -> 0
    close(kl, [10.0, 10.0, math.exp(-5) + 4.0, 0.0])


def test_kl_loss_averages_tokens_then_sequences():
    lp = t([[math.log(0.5), math.log(0.5)], [math.log(0.5), 0.0]])
    ref = t([[math.log(0.25), math.log(0.5)], [math.log(0.25), 123.0]])
    mask = t([[1, 1], [1, 0]])
    # k1 per token: row 0 -> log 2, 0 (mean log2 / 2) ; row 1 -> log 2 (mean log 2)
    close(kl_loss(lp, ref, mask, estimator="k1"), (math.log(2) / 2 + math.log(2)) / 2)


def test_kl_in_reward_subtracts_coef_times_kl():
    rewards, kl = t([0.0, 0.0, 1.0]), t([0.1, 0.2, 0.3])
    close(kl_penalized_rewards(rewards, kl, coef=0.5), [-0.05, -0.1, 0.85])
    close(kl_penalized_rewards(rewards, kl, coef=-1.0), rewards)


# ---- log-probs, entropy, temperature ------------------------------------------------------------


def test_token_log_probs_with_temperature():
    logits = t([[[0.0, math.log(3)]]])  # softmax -> 1/4, 3/4
    ids = torch.tensor([[1]])
    close(token_log_probs(logits, ids), [[math.log(0.75)]])
    # temperature 2: logits 0, log(3)/2 -> weights 1, sqrt 3 -> p = sqrt3 / (1 + sqrt3) = 0.634
    close(token_log_probs(logits, ids, temperature=2.0), [[math.log(math.sqrt(3) / (1 + math.sqrt(3)))]])
    with pytest.raises(ValueError):
        token_log_probs(logits, ids, temperature=0.0)


def test_token_log_probs_upcasts_half_precision():
    out = token_log_probs(torch.zeros(1, 2, 4, dtype=torch.bfloat16), torch.tensor([[0, 3]]))
    assert out.dtype == torch.float32
    close(out, [[-math.log(4), -math.log(4)]])


def test_entropy_from_logits():
    ninf = float("-inf")
    logits = t([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, ninf, ninf], [0.0, math.log(3), ninf, ninf]]])
    # uniform over 4 -> log 4 ; two live tokens -> log 2 ; p = 1/4, 3/4 -> 0.562335
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    close(entropy_from_logits(logits), [[math.log(4), math.log(2), h]])
    # temperature flattens: p = 1/(1+sqrt3), sqrt3/(1+sqrt3)
    p = 1 / (1 + math.sqrt(3))
    close(entropy_from_logits(logits[:, 2:], temperature=2.0), [[-(p * math.log(p) + (1 - p) * math.log(1 - p))]])


# ---- reductions ---------------------------------------------------------------------------------

LOSS = t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
LOSS_MASK = t([[1, 1, 1], [1, 0, 0]])  # lengths 3 and 1


@pytest.mark.parametrize(
    "reduction, expected",
    [
        ("token_mean", (1 + 2 + 3 + 4) / 4),  # 2.5
        ("sequence_mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # 3.0
        ("seq_mean_token_sum_norm", ((1 + 2 + 3) / 8 + 4 / 8) / 2),  # max_seq_len 8 -> 0.625
    ],
)
def test_reductions_with_unequal_lengths(reduction, expected):
    close(reduce_loss(LOSS, LOSS_MASK, reduction, max_seq_len=8), expected)


def test_reductions_with_a_fully_masked_row():
    loss = torch.cat([LOSS, t([[float("nan"), float("inf"), 1.0]])])
    mask = torch.cat([LOSS_MASK, t([[0, 0, 0]])])
    close(reduce_loss(loss, mask, "token_mean"), 2.5)  # the empty row changes nothing
    # the sequence modes average over every row, as SkyRL does: the empty row adds a 0
    close(reduce_loss(loss, mask, "sequence_mean"), (2 + 4 + 0) / 3)
    close(reduce_loss(loss, mask, "seq_mean_token_sum_norm", max_seq_len=8), (6 / 8 + 4 / 8 + 0) / 3)


def test_reduction_errors():
    with pytest.raises(ValueError, match="max_seq_len"):
        reduce_loss(LOSS, LOSS_MASK, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="token_mean"):
        reduce_loss(LOSS, LOSS_MASK, "token_sum")


# ---- PPO losses ---------------------------------------------------------------------------------


def test_regular_ppo_clipping():
    ratios = [1.5, 0.5, 0.5, 1.2]
    log_probs = t([[math.log(r) for r in ratios]], dtype=F64).requires_grad_()
    adv = t([[1.0, 1.0, -1.0, 1.0]])
    loss, metrics = regular_policy_loss(log_probs, torch.zeros(1, 4, dtype=F64), adv, torch.ones(1, 4))
    # r=1.5,A=+1: min(1.5, 1.2) -> -1.2 (clipped) ; r=0.5,A=+1: min(0.5, 0.8) -> -0.5
    # r=0.5,A=-1: min(-0.5, -0.8) -> 0.8 (clipped) ; r=1.2,A=+1: on the boundary -> -1.2, not clipped
    close(loss, (-1.2 - 0.5 + 0.8 - 1.2) / 4)
    close(metrics["clip_fraction"], 2 / 4)
    close(metrics["approx_kl"], -sum(math.log(r) for r in ratios) / 4, tol=1e-5)
    loss.backward()
    # d(-r*A)/d(log p) = -r*A where unclipped (boundary included), 0 where the clip is active
    close(log_probs.grad, [[0.0, -0.5 / 4, 0.0, -1.2 / 4]])


def test_asymmetric_clip_bounds():
    log_probs = t([[math.log(1.5), math.log(0.5)]])
    loss, _ = regular_policy_loss(
        log_probs,
        torch.zeros(1, 2, dtype=F64),
        t([[1.0, -1.0]]),
        torch.ones(1, 2),
        eps_clip_low=0.1,
        eps_clip_high=0.28,
    )
    # min(1.5, 1.28) -> -1.28 ; A=-1: min(-0.5, -0.9) -> 0.9
    close(loss, (-1.28 + 0.9) / 2)


def test_dual_clip_caps_only_negative_advantages():
    log_probs = t([[math.log(5.0), math.log(2.0), math.log(5.0)]])
    old, adv, mask = torch.zeros(1, 3, dtype=F64), t([[-1.0, -1.0, 1.0]]), torch.ones(1, 3)
    regular, _ = regular_policy_loss(log_probs, old, adv, mask)
    dual, metrics = dual_clip_policy_loss(log_probs, old, adv, mask, clip_ratio_c=3.0)
    # regular per token: max(5, 1.2) = 5 ; max(2, 1.2) = 2 ; -min(5, 1.2) = -1.2
    close(regular, (5 + 2 - 1.2) / 3)
    # dual: min(5, 3) = 3 ; min(2, 3) = 2 ; A > 0 keeps -1.2 although -3 would be lower
    close(dual, (3 + 2 - 1.2) / 3)
    close(metrics["dual_clip_fraction"], 1 / 3)
    with pytest.raises(ValueError):
        dual_clip_policy_loss(log_probs, old, adv, mask, clip_ratio_c=1.0)


def test_policy_loss_reductions_and_masked_rows():
    log_probs = t([[0.0, 0.0, 0.0], [0.0, 50.0, -50.0], [80.0, 80.0, 80.0]]).requires_grad_()
    adv = t([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0], [9.0, 9.0, 9.0]])
    mask = t([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # lengths 3, 1, 0; junk where masked
    for reduction, expected in [
        ("token_mean", -(1 + 2 + 3 + 4) / 4),
        ("sequence_mean", -((1 + 2 + 3) / 3 + 4 + 0) / 3),
        ("seq_mean_token_sum_norm", -((1 + 2 + 3) / 10 + 4 / 10 + 0) / 3),
    ]:
        loss, metrics = regular_policy_loss(
            log_probs, torch.zeros(3, 3, dtype=F64), adv, mask, loss_reduction=reduction, max_seq_len=10
        )
        close(loss, expected)
        close(metrics["clip_fraction"], 0.0)
    loss.backward()
    assert torch.isfinite(log_probs.grad).all() and (log_probs.grad[mask == 0] == 0).all()


def test_registry_calls_share_one_signature():
    args = (t([[0.0]]), t([[0.0]]), t([[1.0]]), torch.ones(1, 1))
    kwargs = dict(eps_clip_low=0.2, eps_clip_high=0.2, clip_ratio_c=3.0, loss_reduction="token_mean", max_seq_len=4)
    for fn in (regular_policy_loss, dual_clip_policy_loss):
        loss, _ = fn(*args, **kwargs)
        close(loss, -1.0)
