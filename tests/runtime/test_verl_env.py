"""The `verl` environment scores a verl row as verl's default reward does (verl/utils/reward_score): each case is a
response and ground truth with the score verl's rule gives it."""

from __future__ import annotations

import pytest

pytest.importorskip("skyrl_gym")

from rlc.runtime.envs import gym  # noqa: E402
from rlc.runtime.envs.verl import UnscoredSource, score  # noqa: E402
from rlc.runtime.generator import gym_extras  # noqa: E402
from rlc.spec.generation import SkyRLGymConfig  # noqa: E402

GSM8K = [
    ("so she has 72 left.\n#### 72", "72", 1.0),
    ("#### 1,000", "1000", 1.0),  # commas removed
    ("#### 72.", "72", 0.0),  # the trailing dot stays part of the number
    ("####72", "72", 0.0),  # strict: a space after ####
    ("the answer is 72", "72", 0.0),  # no #### mark, no score (verl's strict method)
    ("#### 71 ... no wait #### 72", "72", 1.0),  # the last mark counts
    ("#### 72" + "x" * 300, "72", 0.0),  # only the last 300 characters are read
    ("#### 72", 72, 0.0),  # a ground truth that is no string never equals the extracted text
]
MATH = [
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}", 1.0),  # dfrac -> frac, \frac12 -> \frac{1}{2}
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{1/2}", "\\frac{1}{2}", 1.0),  # a/b -> \frac{a}{b}
    ("\\boxed{x = 3}", "3", 1.0),  # a short left-hand side is dropped
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),  # units after \text{ are dropped
    ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{3}", "4", 0.0),
    ("the answer is 3", "3", 0.0),  # nothing boxed
    ("\\fbox{3}", "3", 0.0),  # found, but not of the \boxed{...} shape verl unboxes
    ("\\boxed 7$", "7", 1.0),  # `\boxed x` up to the next $
    ("\\boxed{\\sqrt}", "\\sqrt", 1.0),  # unreadable by the normalisation: compared as written
]
DAPO = [
    ("...\nAnswer: 42", "42", 1.0),
    ("Answer: $42$ dollars", "42", 1.0),
    ("Answer: 41", "42", -1.0),  # DAPO's rule scores a wrong answer -1
    ("so \\boxed{42}", "42", 1.0),  # no Answer line: the last box of the final 100 characters
    ("nothing at all", "42", -1.0),
]


@pytest.mark.parametrize(("response", "truth", "expected"), GSM8K)
def test_gsm8k_is_scored_as_verls_gsm8k_rule(response, truth, expected):
    assert score("openai/gsm8k", response, truth) == expected


@pytest.mark.parametrize(("response", "truth", "expected"), MATH)
def test_math_is_scored_as_verls_math_reward(response, truth, expected):
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert score(source, response, truth) == expected


@pytest.mark.parametrize(("response", "truth", "expected"), DAPO)
def test_dapo_math_is_scored_as_verls_math_dapo(response, truth, expected):
    for source in ("math_dapo", "math", "aime2024"):
        assert score(source, response, truth) == expected


def test_a_source_verls_default_reward_has_no_rule_for_is_refused_at_the_first_row():
    with pytest.raises(UnscoredSource, match="my_source"):
        score("my_source", "#### 1", "1")
    row = {
        "prompt": [{"role": "user", "content": "q"}],
        "data_source": "my_source",
        "reward_model": {"ground_truth": "1"},
    }
    with pytest.raises(UnscoredSource):
        gym.make("verl", SkyRLGymConfig(), gym_extras(row, 1))


def test_a_verl_row_steps_as_an_environment_reading_reward_model_and_data_source():
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "Tom has 3 apples and buys 4. How many? Let's think step by step."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": {"split": "train", "index": 0},
    }
    env = gym.make("verl", SkyRLGymConfig(), gym_extras(row, 1))
    assert env.step("3 + 4 = 7\n#### 7")["reward"] == 1.0
    env = gym.make("verl", SkyRLGymConfig(), gym_extras(row, 1))
    assert env.step("#### 8")["reward"] == 0.0


HOSTILE = [  # responses written to make a rule raise: each must score as a wrong answer
    "#### " + "9" * 100_000,
    "\\boxed{" + "{" * 100_000 + "}" * 100_000 + "}",
    "\\boxed{" + "1/" + "7" * 5000 + "}",
    "\\boxed{\\frac}\\boxed{\\sqrt}",
    "\\boxed{\\text{ a}\\text{ b}}",
    "Answer: " + "$" * 299,
    "\x00\udcff" * 1000,
]


@pytest.mark.parametrize("source, floor", [("openai/gsm8k", 0.0), ("lighteval/MATH", 0.0), ("math_dapo", -1.0)])
def test_a_response_made_to_break_the_rule_scores_as_wrong_not_as_an_error(source, floor):
    # Issue 50: an exception from the graded output would count as an environment error (no loss), so a wrong
    # sample would opt out of its negative advantage.
    row = {"data_source": source, "prompt": [], "reward_model": {"ground_truth": "7"}}
    for response in HOSTILE:
        env = gym.make("verl", SkyRLGymConfig(), gym_extras(row, 1))
        assert env.step(response)["reward"] == floor
        assert env.correct(response) is False
