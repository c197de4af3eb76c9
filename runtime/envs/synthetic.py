"""`synthetic`: copy the digit. A task a randomly initialised tiny model learns by RL alone in minutes.

The prompt shows one digit; the answer is that digit and then end-of-sequence. Its rows are generated,
so a local run needs no download.
"""

from __future__ import annotations

import random

_TEMPLATE = "copy the digit {d}:"


def rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        d = str(rng.randrange(10))
        out.append({"prompt": _TEMPLATE.format(d=d), "answer": d, "env_class": "synthetic"})
    return out


class CopyDigit:
    name = "synthetic"

    def prompt(self, row: dict) -> str:
        return row["prompt"]

    def reward(self, row: dict, response: str, finished: bool) -> float:
        """1 for exactly the digit followed by EOS; 0.25 for the right digit first but no clean stop."""
        text = response.strip()
        if text == row["answer"] and finished:
            return 1.0
        return 0.25 if text[:1] == row["answer"] else 0.0
