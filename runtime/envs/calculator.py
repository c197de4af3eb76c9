"""`calculator`: multiplication word problems a small model can answer only through a calculator tool.

A problem reads like "A crate holds 37 pencils. How many pencils are in 24 crates?" with both numbers from 12 to
99, so the product is out of reach of a 135M model's own arithmetic, and the prompt says how to use the tool:
write ``<calc>37 * 24</calc>`` and the result comes back (``<result>888</result>``, as the next user message).
Each turn the model either calls the calculator (the environment answers, no reward yet) or answers; the answer
turn ends the trajectory with reward 1 when its final number is the product, else 0. A call in the last allowed
turn (`max_turns`) ends it with reward 0. Sampling stops at ``</calc>`` (the job's stop string), so a call turn
ends where the tool takes over.

The environment reports per trajectory the calls it got, how many of them it could evaluate (a malformed
expression gets ``<result>error: ...</result>``), and whether a result the tool gave is the final answer.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

from rlc.runtime.envs.gsm8k import extract_answer
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

LOW, HIGH = 12, 99
CALL = re.compile(r"<calc>(.*?)</calc>", re.S)
MAX_EXPRESSION = 64  # characters the calculator reads
INSTRUCTION = "Use the calculator, then give the final answer as a number."
# The prompt shows two solved problems first, as a conversation: the call, the tool's answer, the final answer.
EXAMPLE = (
    {
        "role": "system",
        "content": "You can use a calculator: write <calc>expression</calc> and its result comes back to you.",
    },
    {"role": "user", "content": f"A box holds 23 eggs. How many eggs are in 41 boxes? {INSTRUCTION}"},
    {"role": "assistant", "content": "<calc>23 * 41</calc>"},
    {"role": "user", "content": "<result>943</result>"},
    {"role": "assistant", "content": "There are 943 eggs in 41 boxes. The answer is 943."},
    {
        "role": "user",
        "content": f"Ana has 12 bags of 31 beads and 7 more beads. How many beads does Ana have? {INSTRUCTION}",
    },
    {"role": "assistant", "content": "<calc>12 * 31 + 7</calc>"},
    {"role": "user", "content": "<result>379</result>"},
    {"role": "assistant", "content": "Ana has 379 beads. The answer is 379."},
)
ITEMS = ("pencils", "apples", "books", "marbles", "stickers", "cookies", "cards", "stamps", "coins", "shells")
_TEMPLATES = (
    ("A crate holds {a} {item}. How many {item} are in {b} crates?", lambda a, b, c: a * b),
    ("{n} buys {b} packs of {item} with {a} in each pack. How many {item} does {n} buy?", lambda a, b, c: a * b),
    (
        "{n} has {b} boxes of {a} {item} and {c} more {item} on the table. How many {item} does {n} have?",
        lambda a, b, c: a * b + c,
    ),
    (
        "A shelf has {b} rows of {a} {item}. {n} takes {c} of them away. How many {item} are left on the shelf?",
        lambda a, b, c: a * b - c,
    ),
)
NAMES = ("Mia", "Tom", "Ana", "Ben", "Lily", "Sam", "Nora", "Omar", "Zoe", "Leo")

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class CalculatorError(ValueError):
    """An expression the calculator does not evaluate."""


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression of numbers, + - * / // % and parentheses (nothing else is run)."""
    text = expression.strip().replace("×", "*").replace("x", "*")
    if not text or len(text) > MAX_EXPRESSION:
        raise CalculatorError(f"an expression of 1 to {MAX_EXPRESSION} characters, please")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot read {text!r}") from None

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            try:
                return _OPS[type(node.op)](value(node.left), value(node.right))
            except ZeroDivisionError:
                raise CalculatorError("division by zero") from None
        raise CalculatorError(f"only numbers and + - * / are allowed in {text!r}")

    return value(tree.body)


def shown(v: int | float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.4g}"


def problem(rng: random.Random) -> tuple[str, int]:
    """One problem and its answer: a product, or a product and one more number added or taken away."""
    template, answer = rng.choice(_TEMPLATES)
    a, b, c = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
    return template.format(a=a, b=b, c=c, item=rng.choice(ITEMS), n=rng.choice(NAMES)), answer(a, b, c)


def rows(count: int, seed: int, exclude: set[str] | None = None) -> list[dict]:
    """`count` chat-prompt rows, no prompt twice; `exclude` holds user messages another split has."""
    rng = random.Random(seed)
    out: list[dict] = []
    seen = set(exclude or ())
    while len(out) < count:
        question, answer = problem(rng)
        content = f"{question} {INSTRUCTION}"
        if content in seen:
            continue
        seen.add(content)
        out.append(
            {
                "prompt": [*EXAMPLE, {"role": "user", "content": content}],
                "answer": str(answer),
                "env_class": "calculator",
            }
        )
    return out


class CalculatorEnv(BaseTextEnv):
    """One trajectory of a calculator problem (the row's `answer`, or `reward_spec.ground_truth`)."""

    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__()
        extras = extras or {}
        spec = extras.get("reward_spec") or {}
        truth = spec.get("ground_truth") if isinstance(spec, dict) else None
        self.answer = str(truth if truth is not None else extras.get("answer", ""))
        self.max_turns = int(extras.get("max_turns") or 1)
        self.calls = self.good_calls = 0
        self.results: list[str] = []
        self.final: str | None = None

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        call = CALL.search(action)
        if call is None or self.turns >= self.max_turns:
            self.final = action
            reward = 1.0 if call is None and self.correct(action) else 0.0
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})
        self.calls += 1
        try:
            result = shown(evaluate(call.group(1)))
            self.good_calls += 1
            self.results.append(result)
        except (CalculatorError, OverflowError, RecursionError) as exc:
            result = f"error: {exc}"
        observation = {"role": "user", "content": f"<result>{result}</result>"}
        return BaseTextEnvStepOutput(observations=[observation], reward=0.0, done=False, metadata={})

    def correct(self, action: str) -> bool:
        """Whether the answer turn's final number is the product."""
        return CALL.search(action) is None and extract_answer(action) == self.answer

    def get_metrics(self) -> dict[str, Any]:
        answered = self.final is not None and CALL.search(self.final) is None
        return {
            "tool_calls": self.calls,
            "tool_calls_evaluated": self.good_calls,
            "used_tool_result": float(answered and extract_answer(self.final or "") in self.results),
        }

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """Per step: calls per trajectory, the share of calls the calculator could evaluate (tool-call success),
        the share of trajectories that made an evaluated call, and the share that answered with a tool result."""
        if not metrics:
            return {}
        calls = sum(m.get("tool_calls", 0) for m in metrics)
        good = sum(m.get("tool_calls_evaluated", 0) for m in metrics)
        return {
            "tool_calls": calls / len(metrics),
            "tool_call_success": good / calls if calls else 0.0,
            "tool_used": sum(m.get("tool_calls_evaluated", 0) > 0 for m in metrics) / len(metrics),
            "answered_with_tool_result": sum(m.get("used_tool_result", 0.0) for m in metrics) / len(metrics),
        }
