"""`verl`: a verl dataset scored as verl's default reward scores it, so an imported verl job trains on its data as is.

A verl row holds `data_source`, `prompt` (chat messages), `reward_model.ground_truth` and `extra_info`. verl's
naive reward manager picks the scoring rule by `data_source` (verl/utils/reward_score/__init__.py,
`default_compute_score`); this environment follows the same dispatch for the math and GSM8K sources, with rules
rewritten here from verl's (the same score on the same response; tests/runtime/test_verl_env.py holds cases):

- `openai/gsm8k`: 1 when the last `#### N` in the response's last 300 characters equals the ground truth
  (commas and `$` removed), else 0.
- `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval`, `HuggingFaceH4/MATH-500`: 1 when the last `\\boxed{...}`
  equals the ground truth after the Hendrycks MATH normalisation, else 0.
- `math_dapo`, `math`, `math_dapo_reasoning` and `aime*`: DAPO's rule, 1 or -1: the last `Answer: ...` line,
  else the last `\\boxed{...}` of the final 100 characters, against the ground truth (Minerva's normalisation).

Any other data source is refused at the first row, as verl's own reward raises for it.
"""

from __future__ import annotations

import re
from typing import Any

from rlc.runtime.envs.arithmetic import INSTRUCTION as ARITHMETIC_INSTRUCTION
from rlc.runtime.envs.gsm8k import INSTRUCTION as GSM8K_INSTRUCTION
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

GSM8K_SOURCES = ("openai/gsm8k",)
MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")


class UnscoredSource(ValueError):
    """A data source verl's default reward has no rule for here."""


def score(data_source: str, response: str, ground_truth: Any) -> float:
    """The reward verl's default_compute_score gives `response` for a row of `data_source`."""
    if data_source in GSM8K_SOURCES:
        return gsm8k_score(response, ground_truth)
    if data_source in MATH_SOURCES:
        return math_score(response, ground_truth)
    if data_source in DAPO_SOURCES or data_source.startswith("aime"):
        return dapo_score(response, ground_truth)
    raise UnscoredSource(
        f"no verl scoring rule for data_source {data_source!r} here; rlc scores "
        f"{', '.join(GSM8K_SOURCES + MATH_SOURCES + DAPO_SOURCES)} and aime*"
    )


# -- GSM8K -------------------------------------------------------------------------------------------------------

_GSM8K_MARK = re.compile(r"#### (-?[0-9.,]+)")


def gsm8k_score(response: str, ground_truth: Any) -> float:
    found = _GSM8K_MARK.findall(response[-300:])
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "").replace("$", "") == ground_truth else 0.0


# -- MATH (Hendrycks' normalisation) -----------------------------------------------------------------------------


class _Unnormalisable(Exception):
    """The normalisation cannot read the answer; the two strings are then compared as written."""


def last_boxed(text: str, fbox: bool = True) -> str | None:
    """The last `\\boxed{...}` (or `\\fbox{...}`) with its braces balanced, or None."""
    if fbox and "\\boxed " in text:
        return "\\boxed " + text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed" if fbox else "\\boxed{")
    if start < 0 and fbox:
        start = text.rfind("\\fbox")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def unbox(boxed: str) -> str | None:
    """The inside of `\\boxed{...}` / `\\boxed x`; None when it is not of that shape (`\\fbox`, say)."""
    if "\\boxed " in boxed:
        return boxed[len("\\boxed ") :] if boxed.startswith("\\boxed ") else None
    if boxed.startswith("\\boxed{") and boxed.endswith("}"):
        return boxed[len("\\boxed{") : -1]
    return None


def math_score(response: str, ground_truth: Any) -> float:
    boxed = last_boxed(response)
    answer = unbox(boxed) if boxed is not None else None
    if answer is None:
        return 0.0
    try:
        same = normalise_math(answer) == normalise_math(ground_truth)
    except _Unnormalisable:
        same = answer == ground_truth
    return 1.0 if same else 0.0


def _braced_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{b}` -> `\\frac{1}{b}`; left as is when a fraction is too short."""
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        if not part:
            raise _Unnormalisable
        out += "\\frac"
        if part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return s
        a, b, tail = part[0], part[1], part[2:]
        out += "{" + a + "}" + ("{" + b + "}" if b != "{" else b) + tail
    return out


def _slash_to_frac(s: str) -> str:
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _braced_sqrt(s: str) -> str:
    head, *rest = s.split("\\sqrt")
    out = head
    for part in rest:
        if not part:
            raise _Unnormalisable
        out += "\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
    return out


def normalise_math(s: Any) -> str:
    """Hendrycks MATH's answer normalisation (as verl's math_reward applies it); _Unnormalisable where it fails."""
    if not isinstance(s, str):
        raise _Unnormalisable
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
                     ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):  # fmt: skip
        s = s.replace(old, new)
    if "\\text{ " in s:  # units written after the number
        units = s.split("\\text{ ")
        if len(units) != 2:
            raise _Unnormalisable
        s = units[0]
    s = s.replace("\\\\%", "").replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 3" -> "3"
        s = sides[1]
    s = _braced_sqrt(s) if "\\sqrt" in s else s
    s = _braced_fracs(s.replace(" ", ""))
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


# -- DAPO (Minerva's normalisation) --------------------------------------------------------------------------------

_REPLACED = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
             (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))  # fmt: skip
_DELETED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
            "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
            "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
            "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
            ",\\!", "{,}", '"', "\\dots")  # fmt: skip
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


def normalise_final_answer(answer: str) -> str:
    s = answer.split("=")[-1]
    for old, new in _REPLACED:
        s = s.replace(old, new)
    for gone in _DELETED:
        s = s.replace(gone, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", s)
    for command in ("text", "textbf", "overline"):
        s = re.sub(r"(\\" + command + r"\{)(.*?)(\})", r"\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", s)
    s = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)
    s = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s).replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def dapo_score(response: str, ground_truth: Any) -> float:
    tail = response[-300:]
    lines = _ANSWER_LINE.findall(tail)
    if lines:
        return 1.0 if normalise_final_answer(lines[-1]) == normalise_final_answer(ground_truth) else -1.0
    boxed = last_boxed(tail[-100:], fbox=False)
    if boxed is not None:
        return 1.0 if boxed[len("\\boxed{") : -1] == ground_truth else -1.0
    return -1.0


# -- the environment -----------------------------------------------------------------------------------------------


class VerlEnv(BaseTextEnv):
    """One turn: the response scored by the row's data_source against reward_model.ground_truth."""

    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__()
        extras = extras or {}
        reward_model = extras.get("reward_model") or {}
        if "data_source" not in extras or "ground_truth" not in reward_model:
            raise ValueError("a verl row needs data_source and reward_model.ground_truth")
        self.source = str(extras["data_source"])
        self.truth = reward_model["ground_truth"]
        score(self.source, "", self.truth)  # an unscored source is refused before any generation

    def step(self, action: str) -> BaseTextEnvStepOutput:
        reward = self.score(action)
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={"data_source": self.source})

    def correct(self, action: str) -> bool:
        """Whether the answer is right (the eval accuracy): a score of 1."""
        return self.score(action) >= 1.0

    def score(self, action: str) -> float:
        """The rule's score; a response the rule cannot read scores as a wrong answer (DAPO's -1, else 0), never as
        an environment error, which would spare a wrong sample its negative advantage."""
        try:
            return score(self.source, action, self.truth)
        except Exception:
            return -1.0 if self.source in DAPO_SOURCES or self.source.startswith("aime") else 0.0


# -- `rlc data arithmetic --format verl` ---------------------------------------------------------------------------


def as_verl_rows(rows: list[dict], split: str) -> list[dict]:
    """rlc's arithmetic rows (rlc.runtime.envs.arithmetic) in verl's GSM8K row format: the question with verl's
    GSM8K instruction, `data_source: openai/gsm8k` (so verl's GSM8K rule scores it, in verl and here),
    `reward_model.ground_truth`, and `extra_info` (of verl's split `split`) as verl's preprocessing writes them."""
    converted = []
    for index, row in enumerate(rows):
        question = row["prompt"][-1]["content"].removesuffix(f" {ARITHMETIC_INSTRUCTION}")
        converted.append(
            {
                "data_source": GSM8K_SOURCES[0],
                "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(row["answer"])},
                "extra_info": {"split": split, "index": index, "answer": str(row["answer"]), "question": question},
            }
        )
    return converted
