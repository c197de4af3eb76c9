"""Training batches: rollouts to padded tensors, and splits into mini-batches and rank shards.

Layout (SkyRL's): `input_ids` = [left-padded prompt | right-padded response]; every response-level
tensor is (rows, response_len) and aligned with `response_ids`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str
    reward: float
    group: int  # index of the prompt in the step's batch: the GRPO group
    zeroed: bool = False  # a reward set to 0 because the completion did not stop (zero_reward_on_non_stop)
    # Multi-turn trajectories (rlc.runtime.generator): None keeps the single-turn meaning.
    loss_mask: list[float] | None = None  # per response token: 1 on the model's tokens, 0 on observations
    token_rewards: list[float] | None = None  # per response token: each turn's reward on its last token
    last_step: bool = True  # step_wise_trajectories: the trajectory's last turn (its rows are consecutive)
    turns: int = 1
    env_class: str = ""
    env_error: str | None = None  # why the environment failed this trajectory (it then has no loss)
    correct: bool | None = None  # the environment's judgement of the final answer, when it has one
    env_metrics: dict | None = None
    reward_components: dict[str, float] | None = None  # the last step's numeric metadata (a reward function's dict)
    baseline: float | None = None  # the reward of a greedy response to its prompt (remax), when the job needs it
    # Routing replay: (tokens, layers, top_k) expert ids of the first tokens of prompt + response, as the engine
    # routed them (`inference/routes.py`); None when the engine captures none.
    routed_experts: torch.Tensor | None = None


def trajectory_reward(r: Rollout) -> float:
    """What a row's rewards sum to in the batch (`to_batch`): each turn's reward, or the outcome on the last token."""
    if r.token_rewards is not None:
        return float(sum(r.token_rewards))
    return float(r.reward) if r.response_ids else 0.0


@dataclass
class TrainBatch:
    """A step's rows as padded tensors, and what the driver adds to them phase by phase.

    The first fields come from the rollouts (`to_batch`). The optional ones are None until a phase computes
    them, and what is None changes what runs: without `old_logprobs` the policy's only update takes its own
    log-probs as the old ones (ratio 1); without `ref_logprobs` there is no KL term; `is_weight` is set only
    under an off-policy correction; `old_values` only with a critic.
    """

    input_ids: torch.Tensor  # (rows, prompt_len + response_len): [left-padded prompt | right-padded response]
    attention_mask: torch.Tensor  # like input_ids: 1 on real tokens
    response_ids: torch.Tensor  # (rows, response_len)
    loss_mask: torch.Tensor  # (rows, response_len) float: the tokens the losses count
    rollout_logprobs: torch.Tensor  # (rows, response_len): the engine's log-probs of its samples (0 where none)
    token_rewards: torch.Tensor  # (rows, response_len): the outcome reward on each row's last response token
    group: torch.Tensor  # (rows,) long: the prompt's index in the step's batch (the GRPO group)
    prompt_len: int  # the prompts' padded length: response token j sits at input position prompt_len + j
    old_logprobs: torch.Tensor | None = None  # the policy's log-probs before this step's updates
    ref_logprobs: torch.Tensor | None = None  # the reference model's (KL loss or KL in the reward)
    old_values: torch.Tensor | None = None  # the critic's values before this step's updates
    is_weight: torch.Tensor | None = None  # off-policy correction: truncated importance weights per token
    # What an advantage estimator's card lists in its `inputs` besides the above (rlc.core.algorithms):
    reward_baselines: torch.Tensor | None = None  # (rows,): the reward of a greedy response to each row's prompt
    sum_pi_squared: torch.Tensor | None = None  # the policy's sum of squared probabilities at each response token
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None  # the critic's regression targets
    # (rows, response_len): the loss reduction's per-token weights, set by the driver on a mini-batch when the
    # reduction is one over the whole mini-batch (prompt_mean, token_mean_legacy); else the ranks compute them
    loss_weights: torch.Tensor | None = None
    padding_rows: int = 0  # rows at the end that only fill a fixed shape (Megatron pipeline stages); no loss
    # Routing replay: (rows, prompt_len + response_len, layers, top_k) expert ids aligned with input_ids, the
    # engine's routes where it ran the token and a filler route elsewhere (`inference/routes.py`)
    routed_experts: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.response_ids.shape[0]

    @property
    def real_rows(self) -> int:
        """Rows that are not padding."""
        return self.rows - self.padding_rows

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TrainBatch:
        """`fn` applied to every tensor present; `prompt_len` and absent fields stay."""
        return dataclasses.replace(
            self,
            **{
                f.name: fn(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if torch.is_tensor(getattr(self, f.name))
            },
        )

    def select(self, rows) -> TrainBatch:
        """The given rows (a slice or index tensor) of every tensor."""
        return self.map(lambda v: v[rows])

    def to(self, device) -> TrainBatch:
        return self.map(lambda v: v.to(device))


def to_batch(rollouts: list[Rollout], pad_id: int, *, mask_truncated: bool = False) -> TrainBatch:
    """Padded tensors of a list of rollouts; `loss_mask` drops truncated ones when `mask_truncated`."""
    plen = max(len(r.prompt_ids) for r in rollouts)
    rlen = max(1, max(len(r.response_ids) for r in rollouts))
    # Rows are built as lists and turned into tensors once: per-row tensor writes cost more than the rest of a
    # small model's step.
    ids, attention, response, mask, logprobs, rewards = [], [], [], [], [], []
    for r in rollouts:
        p, n = len(r.prompt_ids), len(r.response_ids)
        ids.append([pad_id] * (plen - p) + list(r.prompt_ids) + list(r.response_ids) + [pad_id] * (rlen - n))
        attention.append([0] * (plen - p) + [1] * (p + n) + [0] * (rlen - n))
        response.append(list(r.response_ids) + [pad_id] * (rlen - n))
        keep = 1.0 if n and not (mask_truncated and r.finish_reason != "stop") else 0.0
        row_mask = [keep * m for m in r.loss_mask] if r.loss_mask is not None else [keep] * n
        mask.append(row_mask + [0.0] * (rlen - n))
        logprobs.append((list(r.logprobs) if r.logprobs is not None else [0.0] * n) + [0.0] * (rlen - n))
        if r.token_rewards is not None:
            reward = list(r.token_rewards) + [0.0] * (rlen - n)
        else:
            reward = [0.0] * rlen
            if n:
                reward[n - 1] = r.reward  # an outcome reward sits on the last response token
        rewards.append(reward)
    input_ids, attention = torch.tensor(ids, dtype=torch.long), torch.tensor(attention, dtype=torch.long)
    response = torch.tensor(response, dtype=torch.long)
    mask, logprobs, rewards = (torch.tensor(x, dtype=torch.float32) for x in (mask, logprobs, rewards))
    baselines = [r.baseline for r in rollouts]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_ids=response,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        token_rewards=rewards,
        group=torch.tensor([r.group for r in rollouts], dtype=torch.long),
        prompt_len=plen,
        reward_baselines=None if None in baselines else torch.tensor(baselines, dtype=torch.float32),
        routed_experts=aligned(
            [(len(r.prompt_ids), len(r.response_ids), r.routed_experts) for r in rollouts], plen, rlen
        ),
    )


def select(batch: TrainBatch, rows) -> TrainBatch:
    """The given rows (a slice or index tensor) of every tensor."""
    return batch.select(rows)


def shards(batch: TrainBatch, world_size: int) -> list[TrainBatch]:
    """Contiguous, equal row blocks, one per rank (the compiler checks divisibility)."""
    rows = batch.rows
    if rows % world_size:
        raise ValueError(f"{rows} rows do not split over {world_size} ranks")
    size = rows // world_size
    return [batch.select(slice(r * size, (r + 1) * size)) for r in range(world_size)]


def mini_batches(batch: TrainBatch, rows_per_mini_batch: int) -> list[TrainBatch]:
    return [batch.select(slice(i, i + rows_per_mini_batch)) for i in range(0, batch.rows, rows_per_mini_batch)]


def group_mini_batches(batch: TrainBatch, groups_per_mini_batch: int) -> list[TrainBatch]:
    """Mini-batches of whole prompt groups (`groups_per_mini_batch` prompts each), for rows that vary in number per
    prompt (step-wise trajectories: a row per turn). Rows of a group are consecutive, groups in ascending order."""
    groups = batch.group.tolist()
    starts = [
        i
        for i in range(len(groups))
        if i == 0 or groups[i] // groups_per_mini_batch != groups[i - 1] // groups_per_mini_batch
    ]
    ends = starts[1:] + [len(groups)]
    return [batch.select(slice(a, b)) for a, b in zip(starts, ends)]


def pad_rows(batch: TrainBatch, multiple: int) -> TrainBatch:
    """The batch with copies of its last row appended, loss-masked, until its rows divide by `multiple` (ranks that
    must each get the same number of rows); `padding_rows` counts them."""
    short = -batch.rows % multiple
    if not short:
        return batch
    index = torch.cat([torch.arange(batch.rows), torch.full((short,), batch.rows - 1)])
    padded = batch.select(index)
    padded.loss_mask = padded.loss_mask.clone()
    padded.loss_mask[batch.rows :] = 0.0
    padded.padding_rows = batch.padding_rows + short
    return padded


def totals(batch: TrainBatch) -> dict:
    mask = batch.loss_mask
    return {"tokens": float(mask.sum()), "sequences": float(mask.shape[0])}


# -- routed experts (routing replay) ----------------------------------------------------------------------------


def filler(layers: int, top_k: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """A route for a position no engine ran (padding, a sequence's last token): experts 0..k-1 in every layer,
    distinct as a dropless dispatcher needs; what it computes reaches no loss."""
    return torch.arange(top_k, dtype=dtype).expand(layers, top_k)


def aligned(
    rows: list[tuple[int, int, torch.Tensor | None]], prompt_len: int, response_len: int
) -> torch.Tensor | None:
    """(rows, prompt_len + response_len, layers, k) routes in the batch layout of `runtime/batch.py`
    ([left-padded prompt | right-padded response]) from each row's (prompt tokens, response tokens, routes of
    its first tokens); positions without a route (padding, the tokens past what the engine ran) get `filler`.
    None when no row has routes."""
    some = next((r for _, _, r in rows if r is not None), None)
    if some is None:
        return None
    layers, top_k = some.shape[-2:]
    out = filler(layers, top_k, some.dtype).repeat(len(rows), prompt_len + response_len, 1, 1)
    for i, (p, n, routes) in enumerate(rows):
        if routes is None:
            continue
        if routes.shape[-2:] != (layers, top_k):
            raise ValueError(f"row {i}'s routes are {tuple(routes.shape)}, others (tokens, {layers}, {top_k})")
        if routes.shape[0] > p + n:
            raise ValueError(f"row {i} has routes for {routes.shape[0]} tokens but {p + n} tokens")
        start = prompt_len - p
        out[i, start : start + routes.shape[0]] = routes.to(out.dtype)
    return out
