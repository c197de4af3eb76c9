"""How a rank cuts its rows into micro-batches: a fixed number of rows each, or as many as a token budget holds
(`trainer.max_tokens_per_microbatch`, SkyRL 0.4's token-based micro-batching).

A micro-batch's cost is the tokens the model runs for it: the real tokens of its rows when they are packed into
one row, and rows x width when they are padded (each micro-batch padded to its own longest prompt and response,
`trimmed`). Rows are placed longest first into the first micro-batch that still holds them, so rows of like
length share one; a row longer than the budget runs alone (SkyRL's soft cap). The losses are weighted by the
whole mini-batch's counts (`workers/common.py`), so any cut gives the same gradient.
"""

from __future__ import annotations

import dataclasses

import torch
from rlc.runtime.batch import TrainBatch

# (rows, prompt_len + response_len, ...); the other 2-D fields are (rows, response_len), one entry per response token.
SEQUENCE_FIELDS = ("input_ids", "attention_mask", "routed_experts")


def lengths(batch: TrainBatch) -> tuple[list[int], list[int]]:
    """Real prompt and response tokens of each row."""
    plen = batch.prompt_len
    real = batch.attention_mask.bool()
    return real[:, :plen].sum(-1).tolist(), real[:, plen:].sum(-1).tolist()


def by_tokens(prompts: list[int], responses: list[int], budget: int, packed: bool) -> list[list[int]]:
    """Row indices grouped into micro-batches of at most `budget` tokens each (a longer row alone), first-fit by
    decreasing length; each micro-batch's rows in their batch order. Tokens: real ones when `packed`, else rows x
    (longest prompt + longest response)."""
    order = sorted(range(len(prompts)), key=lambda i: (-(prompts[i] + responses[i]), i))
    bins: list[list[int]] = []
    stats: list[tuple[int, int, int]] = []  # per micro-batch: tokens, longest prompt, longest response
    for i in order:
        p, r = prompts[i], responses[i]
        for b, (tokens, long_p, long_r) in enumerate(stats):
            grown = (tokens + p + r) if packed else (len(bins[b]) + 1) * (max(long_p, p) + max(long_r, r, 1))
            if grown <= budget:
                bins[b].append(i)
                stats[b] = (tokens + p + r, max(long_p, p), max(long_r, r))
                break
        else:
            bins.append([i])
            stats.append((p + r, p, r))
    return [sorted(rows) for rows in bins]


def trimmed(batch: TrainBatch) -> TrainBatch:
    """The same rows in their narrowest padded layout: prompt columns that are padding in every row and response
    columns past the longest response dropped. Every real token keeps its position and its neighbours, so the
    model's outputs are the same; per-token tensors are narrowed with the responses."""
    prompts, responses = lengths(batch)
    if not prompts:
        return batch
    cut = batch.prompt_len - max(prompts)
    width = max(max(responses), 1)
    if cut == 0 and width == batch.response_ids.shape[1]:
        return batch
    changes = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if not torch.is_tensor(value) or value.dim() < 2:
            continue
        if f.name in SEQUENCE_FIELDS:
            changes[f.name] = value[:, cut : batch.prompt_len + width]
        else:
            changes[f.name] = value[:, :width]
    return dataclasses.replace(batch, prompt_len=batch.prompt_len - cut, **changes)


def widened(out: torch.Tensor, width: int) -> torch.Tensor:
    """Per-response-token outputs of a trimmed micro-batch, zero-padded back to the batch's `width`."""
    return torch.nn.functional.pad(out, (0, width - out.shape[1]))


def inert(batch: TrainBatch) -> TrainBatch:
    """A one-row micro-batch with no loss: the shortest row with its loss mask cleared. A rank with fewer
    micro-batches than its peers runs these, so that every rank takes part in every collective."""
    prompts, responses = lengths(batch)
    shortest = min(range(len(prompts)), key=lambda i: prompts[i] + responses[i])
    row = batch.select(slice(shortest, shortest + 1))
    row.loss_mask = torch.zeros_like(row.loss_mask)
    return row
