"""Advantage estimators (`trainer.algorithm.advantage_estimator`): SkyRL's grpo, rloo, maxrl, reinforce++ and gae,
and verl's gpg, opo, grpo_passk, gdpo, reinforce_plus_plus_baseline, remax and the optimal token baselines, with
verl's own rloo and reinforce++ where they differ from SkyRL's (`rloo_verl`, `reinforce++_verl`).

Tensors are (batch, response_len) with `mask` marking response tokens; every estimator returns
`(advantages, returns)` of that shape, zero outside the mask. Positions outside the mask are
treated as absent, so the same code serves left- and right-padded response windows.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TypeAlias

import torch

# Index of a sample's prompt: the GRPO/RLOO group key (SkyRL passes the prompt uid per sample).
GroupIndex: TypeAlias = "Sequence[Hashable] | torch.Tensor"


def _group_ids(index: GroupIndex, device: torch.device) -> torch.Tensor:
    """Dense group number per sample, from any hashable prompt keys."""
    if isinstance(index, torch.Tensor):
        return torch.unique(index, return_inverse=True)[1].to(device)
    numbers: dict[Hashable, int] = {}
    return torch.tensor([numbers.setdefault(key, len(numbers)) for key in index], dtype=torch.long, device=device)


def _outcome_scores(rewards: torch.Tensor) -> torch.Tensor:
    """One score per sequence: the reward itself, or the sum of per-token rewards."""
    scores = rewards.sum(dim=-1) if rewards.dim() == 2 else rewards
    return scores if scores.is_floating_point() else scores.float()


def _group_stats(scores: torch.Tensor, index: GroupIndex) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample group size, group mean and unbiased group std (as `torch.std`)."""
    groups = _group_ids(index, scores.device)
    if groups.numel() != scores.numel():
        raise ValueError(f"index has {groups.numel()} entries for {scores.numel()} sequences")
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    zeros = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    count = zeros.index_add(0, groups, torch.ones_like(scores))
    mean = zeros.index_add(0, groups, scores) / count.clamp(min=1)
    squares = zeros.index_add(0, groups, (scores - mean[groups]) ** 2)
    std = (squares / (count - 1).clamp(min=1)).sqrt()
    return count[groups], mean[groups], std[groups]


def _masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Z-score over the masked entries of the whole batch (unbiased variance); zero outside the mask."""
    count = mask.sum()
    mean = (values * mask).sum() / count.clamp(min=1)
    var = (((values - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def _per_token(advantages: torch.Tensor, count: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome advantages on every response token; a prompt with a single sample learns nothing (0)."""
    advantages = torch.where(count > 1, advantages, 0.0)
    advantages = advantages[:, None] * mask.to(advantages.dtype)
    return advantages, advantages


@torch.no_grad()
def grpo_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: GroupIndex,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each sequence's score minus its group mean, over (group std + eps) when `norm_by_std`.

    `rewards` is (batch,) or (batch, response_len) (summed); a group of one sample gets its score (over 1 + eps).
    """
    scores = _outcome_scores(rewards)
    count, mean, std = _group_stats(scores, index)
    # As SkyRL and verl: a group of one sample has mean 0 and std 1, so it keeps its score.
    alone = count < 2
    centred = scores - torch.where(alone, 0.0, mean)
    advantages = centred / (torch.where(alone, 1.0, std) + eps) if norm_by_std else centred
    advantages = advantages[:, None] * mask.to(advantages.dtype)
    return advantages, advantages


def batch_normalize(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`advantage_batch_normalize`: the advantages whitened over every token of the batch (unbiased std, eps 1e-8);
    0 outside `mask`."""
    m = mask.bool()
    values = advantages[m]
    return torch.where(m, (advantages - values.mean()) / (values.std() + 1e-8), 0.0)


@torch.no_grad()
def rloo_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: GroupIndex,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: each sequence's score minus the mean score of the other samples of its prompt.

    `rewards` is (batch,) or (batch, response_len) (summed); a group of one sample gets 0.
    """
    scores = _outcome_scores(rewards)
    count, mean, _ = _group_stats(scores, index)
    # s - mean(others) == (s - mean(all)) * n / (n - 1)
    advantages = (scores - mean) * count / (count - 1).clamp(min=1)
    return _per_token(advantages, count, mask)


@torch.no_grad()
def maxrl_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: GroupIndex,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MaxRL (SkyRL's `maxrl`): each sequence's score minus its group mean, over (group mean + eps).

    Dividing by the mean instead of the std weights a prompt by how rarely it succeeds. As in SkyRL a group of
    one sample has mean 0 there, so its advantage is its score.
    """
    scores = _outcome_scores(rewards)
    count, mean, _ = _group_stats(scores, index)
    advantages = torch.where(count > 1, (scores - mean) / (mean + eps), scores)
    advantages = advantages[:, None] * mask.to(advantages.dtype)
    return advantages, advantages


@torch.no_grad()
def reinforce_pp_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    carry_across_masked: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go per token, whitened over all response tokens of the batch.

    A masked position ends the return (SkyRL's), or, with `carry_across_masked`, is skipped with the return passed
    on unchanged (verl's): the two differ only for masks with holes, such as multi-turn observation tokens.
    """
    mask = mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        step = rewards[:, t] + gamma * running
        returns[:, t] = step * mask[:, t]
        running = torch.where(mask[:, t].bool(), step, running if carry_across_masked else 0.0)
    return _masked_whiten(returns, mask), returns


def _alone_as_zero(mean: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The group mean, 0 for a group of one sample (verl's baseline for it)."""
    return torch.where(count > 1, mean, 0.0)


@torch.no_grad()
def rloo_verl_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's RLOO: as `rloo_advantages`, but a group of one sample keeps its score (SkyRL's gets 0)."""
    scores = _outcome_scores(rewards)
    count, mean, _ = _group_stats(scores, index)
    advantages = torch.where(count > 1, (scores - mean) * count / (count - 1).clamp(min=1), scores)
    advantages = advantages[:, None] * mask.to(advantages.dtype)
    return advantages, advantages


@torch.no_grad()
def gpg_advantages(rewards: torch.Tensor, mask: torch.Tensor, index: GroupIndex) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al., 2025): the score minus its group mean (0 for a group of one), times batch size over the
    number of non-zero scores, which scales a batch of mostly failed samples up."""
    scores = _outcome_scores(rewards)
    count, mean, _ = _group_stats(scores, index)
    alpha = scores.numel() / max(int(torch.count_nonzero(scores)), 1)
    advantages = alpha * (scores - _alone_as_zero(mean, count))
    advantages = advantages[:, None] * mask.to(advantages.dtype)
    return advantages, advantages


@torch.no_grad()
def opo_advantages(rewards: torch.Tensor, mask: torch.Tensor, index: GroupIndex) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al., 2025): the score minus its group's length-weighted mean score (0 for a group of one)."""
    scores = _outcome_scores(rewards)
    lengths = mask.to(scores.dtype).sum(-1)
    count, weighted, _ = _group_stats(scores * lengths, index)
    _, mean_length, _ = _group_stats(lengths, index)
    baseline = weighted / mean_length.clamp(min=torch.finfo(scores.dtype).tiny)
    advantages = scores - _alone_as_zero(baseline, count)
    advantages = advantages[:, None] * mask.to(advantages.dtype)
    return advantages, advantages


@torch.no_grad()
def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, index: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a baseline (verl's reinforce_plus_plus_baseline): the score minus its group mean (0 for a
    group of one) on every token, whitened over all response tokens of the batch."""
    scores = _outcome_scores(rewards)
    count, mean, _ = _group_stats(scores, index)
    centred = (scores - _alone_as_zero(mean, count))[:, None] * mask.to(scores.dtype)
    advantages = _masked_whiten(centred, mask.to(scores.dtype))
    return advantages, advantages


@torch.no_grad()
def gdpo_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: GroupIndex,
    norm_by_std: bool = True,
    components: list[torch.Tensor] | None = None,
    weights: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (verl's): each reward component's GRPO advantage (its own group normalisation), their weighted sum,
    whitened over all response tokens of the batch. `components` are per-token rewards like `rewards` (each
    component's score on the row's last token); without them the one reward is the one component."""
    parts = components or [rewards]
    weights = list(weights) if weights is not None else [1.0] * len(parts)
    total = sum(w * grpo_advantages(part, mask, index, norm_by_std=norm_by_std)[0] for w, part in zip(weights, parts))
    assert isinstance(total, torch.Tensor)
    advantages = _masked_whiten(total, mask.to(total.dtype))
    return advantages, advantages


@torch.no_grad()
def grpo_passk_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, index: GroupIndex, norm_by_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al., 2025): only each group's best sample learns, by its lead over the second best
    (over the group's std + eps when `norm_by_std`); every group needs two samples or more."""
    scores = _outcome_scores(rewards)
    groups = _group_ids(index, scores.device)
    advantages = torch.zeros_like(scores)
    for group in torch.unique(groups):
        members = (groups == group).nonzero().squeeze(-1)
        if members.numel() < 2:
            raise ValueError(f"grpo_passk needs two samples or more per prompt; a prompt has {members.numel()}")
        top, at = torch.topk(scores[members], 2)
        lead = top[0] - top[1]
        advantages[members[at[0]]] = lead / (scores[members].std() + eps) if norm_by_std else lead
    advantages = advantages[:, None] * mask.to(advantages.dtype)
    return advantages, advantages


def _returns_to_go(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The undiscounted sum of the masked rewards from each position to the end of the row."""
    return (rewards * mask).flip(-1).cumsum(-1).flip(-1)


@torch.no_grad()
def remax_advantages(
    rewards: torch.Tensor, mask: torch.Tensor, reward_baselines: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al., 2023): each token's return-to-go minus the reward of a greedy response to its prompt
    (`reward_baselines`, one per row), which the generator samples beside the step's rollouts."""
    mask = mask.to(rewards.dtype)
    returns = _returns_to_go(rewards, mask)
    advantages = (returns - reward_baselines.to(rewards.dtype)[:, None]) * mask
    return advantages, returns * mask


def _token_baselines(
    returns: torch.Tensor, path_weight: torch.Tensor, present: torch.Tensor, groups: torch.Tensor, members: torch.Tensor
) -> torch.Tensor:
    """Per position, the path-weighted mean return of the group's `members` (rows) present there:
    sum(G * W) / (sum(W) + 1e-8); 0 for a group of one member. A group's longest row, when it alone is the longest,
    gets no baseline from the second longest's length on (nothing to compare it with there)."""
    eps = 1e-8
    n_groups = int(groups.max()) + 1 if groups.numel() else 0
    weight = path_weight * present * members[:, None]
    zeros = returns.new_zeros(n_groups, returns.shape[1])
    numerator = zeros.index_add(0, groups, returns * weight)
    denominator = zeros.index_add(0, groups, weight) + eps
    count = groups.new_zeros(n_groups).index_add(0, groups, members.long())
    baselines = torch.where((count[groups] > 1)[:, None], (numerator / denominator)[groups], 0.0)
    # A group's longest row past every other one's length: its baseline there would be its own return.
    lengths = torch.where(members, present.sum(-1).long(), -1)
    longest = lengths.new_full((n_groups,), -1).scatter_reduce(0, groups, lengths, "amax")
    at_longest = members & (lengths == longest[groups])
    n_longest = groups.new_zeros(n_groups).index_add(0, groups, at_longest.long())
    others = torch.where(members & ~at_longest, lengths, -1)
    second = others.new_full((n_groups,), -1).scatter_reduce(0, groups, others, "amax")
    alone = at_longest & (n_longest[groups] == 1) & (count[groups] > 1)
    beyond = torch.arange(returns.shape[1], device=returns.device)[None, :] >= second[groups][:, None]
    return torch.where(alone[:, None] & beyond, 0.0, baselines)


def _path_weight(
    old_logprobs: torch.Tensor, sum_pi_squared: torch.Tensor, mask: torch.Tensor, is_weight: torch.Tensor | None
) -> torch.Tensor:
    """W_t: the running sum of each token's squared score norm, 1 - 2 p_t + sum(p^2) (times its squared
    importance weight under an off-policy correction)."""
    step = 1 - 2 * old_logprobs.exp() + sum_pi_squared
    if is_weight is not None:
        step = step * is_weight**2
    return (step * mask).cumsum(-1)


@torch.no_grad()
def optimal_token_baseline_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    index: GroupIndex,
    old_logprobs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    is_weight: torch.Tensor | None = None,
    by_model_token: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The optimal token baseline (verl's optimal_token_baseline): each token's return-to-go minus a baseline of its
    own position, the group's returns there weighted by each row's accumulated score variance W_t (`_path_weight`).

    `by_model_token` (verl's tir_optimal_token_baseline): rows are compared by their k-th model token rather than
    their k-th position, so observations inside a multi-turn response shift nothing; a row without a model token is
    no member of its group."""
    mask = mask.to(rewards.dtype)
    returns = _returns_to_go(rewards, mask)
    weight = _path_weight(old_logprobs.to(rewards.dtype), sum_pi_squared.to(rewards.dtype), mask, is_weight)
    groups = _group_ids(index, rewards.device)
    if not by_model_token:
        every = torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)
        baselines = _token_baselines(returns, weight, mask, groups, every)
        return (returns - baselines) * mask, returns * mask
    # Each model token's rank in its row: the packed layout, where the k-th model tokens of a group line up.
    rank = (mask.cumsum(-1) - 1).clamp(min=0).long()
    packed = [torch.zeros_like(returns).scatter_add(1, rank, x * mask) for x in (returns, weight)]
    present = (torch.arange(mask.shape[1], device=mask.device)[None, :] < mask.sum(-1, keepdim=True)).to(mask.dtype)
    baselines = _token_baselines(packed[0], packed[1], present, groups, mask.sum(-1) > 0)
    return (returns - baselines.gather(1, rank)) * mask, returns * mask


@torch.no_grad()
def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lambd: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) from per-token rewards and critic values; advantages are whitened, returns are not.

    The value after the last response token is 0 (the episode ends with the response). A masked token (padding, an
    observation inside a multi-turn response) is skipped: the recursion passes over it, as verl's does.
    """
    mask = mask.to(rewards.dtype)
    rewards, values = rewards * mask, values.to(rewards.dtype) * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        present = mask[:, t].bool()
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(present, delta + gamma * lambd * running, running)
        next_value = torch.where(present, values[:, t], next_value)
        advantages[:, t] = running
    advantages = advantages * mask
    returns = (advantages + values) * mask
    return _masked_whiten(advantages, mask), returns


# The estimators in the common calling convention (rlc.runtime.algorithms.registry), which the catalog's cards
# (rlc.core.algorithms) name: outcome estimators read `index`, gae reads `values`, each its knobs from `algorithm`;
# the batch's fields a card lists in `inputs` come as keywords of those names.


def grpo(rewards, mask, *, index, values, algorithm):
    return grpo_advantages(rewards, mask, index, norm_by_std=algorithm.grpo_norm_by_std)


def rloo(rewards, mask, *, index, values, algorithm):
    return rloo_advantages(rewards, mask, index)


def maxrl(rewards, mask, *, index, values, algorithm):
    return maxrl_advantages(rewards, mask, index)


def reinforce_pp(rewards, mask, *, index, values, algorithm):
    return reinforce_pp_advantages(rewards, mask, gamma=algorithm.gamma)


def reinforce_pp_verl(rewards, mask, *, index, values, algorithm):
    return reinforce_pp_advantages(rewards, mask, gamma=algorithm.gamma, carry_across_masked=True)


def rloo_verl(rewards, mask, *, index, values, algorithm):
    return rloo_verl_advantages(rewards, mask, index)


def gpg(rewards, mask, *, index, values, algorithm):
    return gpg_advantages(rewards, mask, index)


def opo(rewards, mask, *, index, values, algorithm):
    return opo_advantages(rewards, mask, index)


def reinforce_pp_baseline(rewards, mask, *, index, values, algorithm):
    return reinforce_pp_baseline_advantages(rewards, mask, index)


def gdpo(rewards, mask, *, index, values, algorithm, components=None):
    weights = getattr(algorithm, "gdpo_reward_weights", None)
    return gdpo_advantages(rewards, mask, index, algorithm.grpo_norm_by_std, components, weights)


def grpo_passk(rewards, mask, *, index, values, algorithm):
    return grpo_passk_advantages(rewards, mask, index, norm_by_std=algorithm.grpo_norm_by_std)


def remax(rewards, mask, *, index, values, algorithm, reward_baselines):
    return remax_advantages(rewards, mask, reward_baselines)


def optimal_token_baseline(rewards, mask, *, index, values, algorithm, old_logprobs, sum_pi_squared, is_weight):
    return optimal_token_baseline_advantages(rewards, mask, index, old_logprobs, sum_pi_squared, is_weight)


def tir_optimal_token_baseline(rewards, mask, *, index, values, algorithm, old_logprobs, sum_pi_squared, is_weight):
    return optimal_token_baseline_advantages(
        rewards, mask, index, old_logprobs, sum_pi_squared, is_weight, by_model_token=True
    )


def gae(rewards, mask, *, index, values, algorithm):
    if values is None:
        raise ValueError("advantage estimator 'gae' needs critic values (trainer.critic)")
    return gae_advantages(rewards, values, mask, gamma=algorithm.gamma, lambd=algorithm.lambd)


def broadcast_to_steps(per_trajectory: torch.Tensor, last_step: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Step-wise trajectories (a row per turn, a trajectory's rows consecutive, `last_step` marking each last one):
    every row gets the row of `per_trajectory` (one per trajectory, as computed on the last steps), under its own
    mask."""
    trajectory = torch.cat([torch.zeros(1, dtype=torch.long, device=last_step.device), last_step[:-1].long()]).cumsum(0)
    return per_trajectory[trajectory] * mask
