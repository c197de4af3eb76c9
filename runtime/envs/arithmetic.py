"""`arithmetic`: one-step addition and subtraction word problems, scored by the final number of the response.

The rows are generated (`rlc data arithmetic`), so a run needs no download. A problem reads like "Mia has 23
shells. She finds 15 more. How many shells does Mia have now?"; the prompt is a chat message that asks for the
answer as the last number. The operands run from 2 to `MAX_NUMBER` (20 unless `rlc data arithmetic --max-number`
says otherwise): SmolLM2-135M-Instruct writes the right equation for some of these and gets the sum right once it
has, so groups of samples disagree from the first step and what GRPO teaches (say the equation, then stop) shows
in the accuracy; with operands up to 99 its own arithmetic is wrong too often for a 20-minute run to move it.
The reward is 1 when the response ends and its final number (the one after the last `####` when there is one,
else the last number in the text) equals the answer, else 0.
"""

from __future__ import annotations

import random

from rlc.runtime.envs.gsm8k import extract_answer

INSTRUCTION = "Give the final answer as a number at the end."
MAX_NUMBER = 20
NAMES = ("Mia", "Tom", "Ana", "Ben", "Lily", "Sam", "Nora", "Omar", "Zoe", "Leo", "Ivy", "Max", "Eva", "Raj", "Kai")
ITEMS = (
    "apples",
    "books",
    "marbles",
    "stickers",
    "shells",
    "coins",
    "cookies",
    "pencils",
    "stamps",
    "cards",
    "balloons",
    "flowers",
)
_ADD = (
    "{n} has {a} {item}. {p} finds {b} more. How many {item} does {n} have now?",
    "{n} had {a} {item} and bought {b} more. How many {item} does {n} have in total?",
    "There are {a} {item} in a box. {n} puts in {b} more. How many {item} are in the box now?",
    "{n} collected {a} {item} on Monday and {b} {item} on Tuesday. How many {item} did {n} collect?",
)
_SUB = (
    "{n} has {a} {item}. {p} gives {b} of them away. How many {item} does {n} have left?",
    "{n} had {a} {item} and lost {b}. How many {item} does {n} have now?",
    "There are {a} {item} in a box. {n} takes out {b}. How many {item} are left in the box?",
    "{n} baked {a} {item} and ate {b} of them. How many {item} are left?",
)


def problem(rng: random.Random, low: int = 2, high: int = MAX_NUMBER) -> tuple[str, int]:
    """One word problem and its answer; subtraction never goes below zero."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    pronoun = "She" if name in ("Mia", "Ana", "Lily", "Nora", "Zoe", "Ivy", "Eva") else "He"
    a, b = rng.randint(low, high), rng.randint(low, high)
    if rng.random() < 0.5:
        return rng.choice(_ADD).format(n=name, p=pronoun, a=a, b=b, item=item), a + b
    a, b = max(a, b), min(a, b)
    return rng.choice(_SUB).format(n=name, p=pronoun, a=a, b=b, item=item), a - b


def rows(count: int, seed: int, exclude: set[str] | None = None, high: int = MAX_NUMBER) -> list[dict]:
    """`count` chat-prompt rows with numbers from 2 to `high`, no prompt twice; `exclude` holds prompt texts (the
    user message, instruction included) that must not appear: another split's."""
    rng = random.Random(seed)
    out: list[dict] = []
    seen = set(exclude or ())
    while len(out) < count:
        question, answer = problem(rng, high=high)
        content = f"{question} {INSTRUCTION}"
        if content in seen:
            continue
        seen.add(content)
        out.append(
            {
                "prompt": [{"role": "user", "content": content}],
                "answer": str(answer),
                "env_class": "arithmetic",
            }
        )
    return out


def final_number(text: str) -> str | None:
    """The number after the last `####`, else the last number in the text."""
    return extract_answer(text)


class Arithmetic:
    name = "arithmetic"

    def prompt(self, row: dict) -> list[dict] | str:
        return row["prompt"]

    def correct(self, row: dict, response: str) -> bool:
        return final_number(response) == str(row["answer"]).strip()

    def reward(self, row: dict, response: str, finished: bool) -> float:
        """1 when the response ends (EOS) and its final number equals the answer, else 0.

        A response cut off by the length limit scores 0 even when its last number happens to be right: otherwise
        stopping is what the wrong answers do (a short restatement of the question), GRPO pushes EOS down, and the
        responses grow to the limit until nothing scores."""
        return 1.0 if finished and self.correct(row, response) else 0.0
