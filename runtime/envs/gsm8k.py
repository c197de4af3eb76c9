"""`gsm8k`: grade-school math word problems scored by exact match of the final number."""

from __future__ import annotations

import re

_MARKED = re.compile(r"####\s*(-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def extract_answer(text: str, strict: bool = False) -> str | None:
    """The number after the last `####`; without strict, the last number in the text as a fallback."""
    marked = _MARKED.findall(text)
    if marked:
        found = marked[-1]
    elif strict:
        return None
    else:
        numbers = [n for n in _NUMBER.findall(text) if any(c.isdigit() for c in n)]
        if not numbers:
            return None
        found = numbers[-1]
    found = found.replace(",", "").rstrip(".")
    if "." in found:
        found = found.rstrip("0").rstrip(".")
    return found or None


class GSM8K:
    name = "gsm8k"

    def prompt(self, row: dict) -> str:
        return row["prompt"]

    def reward(self, row: dict, response: str, finished: bool) -> float:
        """1 when the `####` answer equals the reference answer, else 0."""
        got = extract_answer(response, strict=True)
        want = (
            extract_answer(str(row["answer"])) if not str(row["answer"]).lstrip("-").isdigit() else str(row["answer"])
        )
        return 1.0 if got is not None and got == want else 0.0
