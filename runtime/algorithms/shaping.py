"""Reward shaping applied to a trajectory's outcome before the advantages: DAPO's soft overlong penalty
(`trainer.algorithm.overlong_buffer_len`).

Plain Python on one row at a time: the generator applies it as it turns a trajectory into a training row, where the
reward and the response's length are already numbers.
"""

from __future__ import annotations


def overlong_penalty(length: int, max_length: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment (verl's dapo reward manager, SkyRL's main_dapo), a value <= 0 added to the
    reward: none up to `max_length - buffer_len` tokens, then falling linearly to `-penalty_factor` at `max_length`
    (and on, past it, as verl's arithmetic goes on)."""
    exceed = length - (max_length - buffer_len)
    return min(-exceed / buffer_len * penalty_factor, 0.0)
