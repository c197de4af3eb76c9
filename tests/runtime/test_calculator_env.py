"""`calculator`, rlc's multi-turn tool environment: the tool evaluates arithmetic and nothing else, a trajectory
is calls then an answer, the reward is the answer's, and `rlc data calculator` writes disjoint splits."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("skyrl_gym")

from conftest import run_rlc  # noqa: E402
from rlc.runtime.envs import gym  # noqa: E402
from rlc.runtime.envs.calculator import CalculatorEnv, CalculatorError, evaluate, rows  # noqa: E402
from rlc.runtime.generator import gym_extras  # noqa: E402
from rlc.spec.generation import SkyRLGymConfig  # noqa: E402


def env(answer: str, max_turns: int = 4) -> CalculatorEnv:
    made = gym.make("calculator", SkyRLGymConfig(), gym_extras({"prompt": [], "answer": answer}, max_turns))
    assert isinstance(made, CalculatorEnv)
    return made


@pytest.mark.parametrize(
    ("expression", "value"), [("37 * 24", 888), ("37*24 + 15", 903), ("(99 - 12) * 3", 261), ("7 / 2", 3.5)]
)
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').getcwd()", "open('/etc/passwd')", "9 ** 9 ** 9", "1 / 0", "", "x" * 100, "[1] * 9", "2 +"],
)
def test_the_calculator_runs_nothing_but_arithmetic(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_a_trajectory_is_calls_then_an_answer_rewarded_by_the_answer():
    e = env("903")
    first = e.step("<calc>37 * 24</calc>")
    assert (first["reward"], first["done"]) == (0.0, False)
    assert first["observations"] == [{"role": "user", "content": "<result>888</result>"}]
    second = e.step("<calc>888 + 15</calc>")
    assert second["observations"][0]["content"] == "<result>903</result>" and not second["done"]
    last = e.step("There are 903 pencils. The answer is 903.")
    assert (last["reward"], last["done"], last["observations"]) == (1.0, True, [])
    assert e.get_metrics() == {"tool_calls": 2, "tool_calls_evaluated": 2, "used_tool_result": 1.0}


def test_a_malformed_call_gets_an_error_result_and_a_wrong_answer_no_reward():
    e = env("888")
    bad = e.step("<calc>thirty-seven times 24</calc>")
    assert bad["observations"][0]["content"].startswith("<result>error:") and not bad["done"]
    wrong = e.step("The answer is 880.")
    assert (wrong["reward"], wrong["done"]) == (0.0, True) and not e.correct("The answer is 880.")
    assert e.get_metrics() == {"tool_calls": 1, "tool_calls_evaluated": 0, "used_tool_result": 0.0}


def test_a_call_in_the_last_turn_ends_the_trajectory_unanswered():
    e = env("888", max_turns=2)
    assert not e.step("<calc>37 * 24</calc>")["done"]
    out = e.step("<calc>888 * 1</calc>")
    assert (out["reward"], out["done"]) == (0.0, True)


def test_the_metrics_aggregate_to_tool_call_success():
    got = CalculatorEnv.aggregate_metrics(
        [
            {"tool_calls": 2, "tool_calls_evaluated": 1, "used_tool_result": 1.0},
            {"tool_calls": 0, "tool_calls_evaluated": 0, "used_tool_result": 0.0},
        ]
    )
    assert got == {"tool_calls": 1.0, "tool_call_success": 0.5, "tool_used": 0.5, "answered_with_tool_result": 0.5}


def test_problems_need_the_tool_and_the_answer_is_right():
    for row in rows(200, 3):
        question = row["prompt"][-1]["content"]
        a, b, *c = (int(n) for n in re.findall(r"\d+", question))
        expected = a * b if not c else (a * b + c[0] if "more" in question else a * b - c[0])
        assert int(row["answer"]) == expected and a * b >= 144, question
        assert row["prompt"][0]["role"] == "system" and row["env_class"] == "calculator"


def test_data_command_writes_disjoint_splits(tmp_path):
    from rlc.runtime.data import read_rows

    made = run_rlc("data", "calculator", "--out", str(tmp_path), "--train", "300", "--val", "40", "--seed", "5")
    assert made.returncode == 0, made.stderr
    train, val = read_rows([str(tmp_path / "train.parquet")]), read_rows([str(tmp_path / "validation.parquet")])
    assert len(train) == 300 and len(val) == 40
    questions = {r["prompt"][-1]["content"] for r in train}
    assert len(questions) == 300 and not questions & {r["prompt"][-1]["content"] for r in val}
    bad = run_rlc("data", "calculator", "--out", str(tmp_path), "--train", "0")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
