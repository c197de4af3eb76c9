"""Training batches: rollouts to padded tensors, and splits into mini-batches and rank shards.

Layout (SkyRL's): `input_ids` = [left-padded prompt | right-padded response]; every response-level
tensor is (rows, response_len) and aligned with `response_ids`.
"""

from __future__ import annotations

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


def to_batch(rollouts: list[Rollout], pad_id: int, *, mask_truncated: bool = False) -> dict:
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
        mask.append([keep] * n + [0.0] * (rlen - n))
        logprobs.append((list(r.logprobs) if r.logprobs is not None else [0.0] * n) + [0.0] * (rlen - n))
        reward = [0.0] * rlen
        if n:
            reward[n - 1] = r.reward  # an outcome reward sits on the last response token
        rewards.append(reward)
    input_ids, attention = torch.tensor(ids, dtype=torch.long), torch.tensor(attention, dtype=torch.long)
    response = torch.tensor(response, dtype=torch.long)
    mask, logprobs, rewards = (torch.tensor(x, dtype=torch.float32) for x in (mask, logprobs, rewards))
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "response_ids": response,
        "loss_mask": mask,
        "rollout_logprobs": logprobs,
        "token_rewards": rewards,
        "group": torch.tensor([r.group for r in rollouts], dtype=torch.long),
        "prompt_len": plen,
    }


def select(batch: dict, rows) -> dict:
    """The given rows (a slice or index tensor) of every tensor; scalars are shared."""
    return {k: (v[rows] if torch.is_tensor(v) else v) for k, v in batch.items()}


def shards(batch: dict, world_size: int) -> list[dict]:
    """Contiguous, equal row blocks, one per rank (the compiler checks divisibility)."""
    rows = batch["response_ids"].shape[0]
    if rows % world_size:
        raise ValueError(f"{rows} rows do not split over {world_size} ranks")
    size = rows // world_size
    return [select(batch, slice(r * size, (r + 1) * size)) for r in range(world_size)]


def mini_batches(batch: dict, rows_per_mini_batch: int) -> list[dict]:
    rows = batch["response_ids"].shape[0]
    return [select(batch, slice(i, i + rows_per_mini_batch)) for i in range(0, rows, rows_per_mini_batch)]


def totals(batch: dict) -> dict:
    mask = batch["loss_mask"]
    return {"tokens": float(mask.sum()), "sequences": float(mask.shape[0])}
