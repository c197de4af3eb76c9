"""GSM8K's data side: the instruction `rlc data gsm8k` puts after each question, and reading a number answer.

The `gsm8k` environment itself is skyrl-gym's (reward 1 when the first `#### N` of the response equals the
row's `reward_spec.ground_truth`), so rlc scores GSM8K exactly as SkyRL does."""

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
