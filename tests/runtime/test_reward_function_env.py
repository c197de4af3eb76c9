"""`env_class: reward_function`: verl rows scored by the user's own compute_score file, loaded in the trainer; a
function that fails is an error naming the file, the line and the exception."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

pytest.importorskip("skyrl_gym")

from rlc.runtime.envs import gym  # noqa: E402
from rlc.runtime.envs.reward_function import RewardFunctionError, load  # noqa: E402
from rlc.runtime.generator import gym_extras  # noqa: E402
from rlc.spec.generation import RewardFunctionConfig, SkyRLGymConfig  # noqa: E402

REWARD_FILE = '''
import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0, **kwargs):
    """1 for the ground truth as the last number, plus the bonus for a short answer."""
    numbers = re.findall(r"-?[0-9]+", solution_str)
    right = bool(numbers) and numbers[-1] == ground_truth
    return {"score": float(right) + (bonus if len(solution_str) < 20 else 0.0), "right": right,
            "source": data_source, "split": (extra_info or {}).get("split")}


def plain(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 10


def named(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 1.0, "name": extra_info.get("experiment_name", ""), "index": extra_info["index"]}


def broken(data_source, solution_str, ground_truth, extra_info=None):
    parts = solution_str.split()
    return 1.0 / len(parts)
'''


def _row(truth: str) -> dict:
    return {
        "data_source": "my/math",
        "prompt": [{"role": "user", "content": "What is 6 + 1?"}],
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": 3},
    }


def _env(tmp_path, name="compute_score", experiment_name=None, **kwargs):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    rf = RewardFunctionConfig(path=str(path), name=name, kwargs=kwargs, experiment_name=experiment_name)
    config = dataclasses.replace(SkyRLGymConfig(), reward_function=rf)
    return path, lambda row: gym.make("reward_function", config, gym_extras(row, 1))


def test_the_users_function_scores_verl_rows(tmp_path):
    _, make = _env(tmp_path, bonus=0.5)
    right = make(_row("7")).step("6 + 1 = 7")
    assert right["reward"] == 1.5 and right["metadata"]["right"] is True and right["metadata"]["split"] == "train"
    assert make(_row("7")).step("it is 8, a long way round")["reward"] == 0.0
    assert make(_row("7")).step("so the answer is 7 at the end")["reward"] == 1.0  # no bonus past 20 characters
    _, make = _env(tmp_path, name="plain")
    assert make(_row("7")).step("abcde")["reward"] == 0.5


def test_experiment_name_joins_extra_info_as_verls_gdpo_manager_adds_it(tmp_path):
    _, make = _env(tmp_path, name="named", experiment_name="qwen3_8b_gdpo")
    out = make(_row("7")).step("7")
    assert out["metadata"]["name"] == "qwen3_8b_gdpo" and out["metadata"]["index"] == 3
    _, make = _env(tmp_path, name="named")
    assert make(_row("7")).step("7")["metadata"]["name"] == ""


def test_an_exception_in_the_function_names_the_file_and_line(tmp_path):
    path, make = _env(tmp_path, name="broken")
    env = make(_row("7"))
    with pytest.raises(RewardFunctionError) as info:
        env.step("")
    line = REWARD_FILE.splitlines().index("    return 1.0 / len(parts)") + 1
    assert f"{path}:{line}" in str(info.value) and "ZeroDivisionError" in str(info.value)


def test_a_missing_function_or_a_broken_file_is_named(tmp_path):
    path, make = _env(tmp_path, name="score_it")
    with pytest.raises(RewardFunctionError, match="has no function 'score_it'.*compute_score"):
        make(_row("7"))
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent("x = 1\ny = undefined_name\n"))
    with pytest.raises(RewardFunctionError, match=rf"{bad}:2 failed to load: NameError"):
        load(str(bad), "compute_score")


def test_the_text_in_resolved_yaml_is_what_runs_where_the_file_is_absent(tmp_path):
    fn = load(str(tmp_path / "elsewhere" / "my_reward.py"), "plain", REWARD_FILE)
    assert fn("s", "abc", "1") == 0.3
