"""The table of built-in environments (`rlc.core.environments`) against what it names: every class, scorer and writer
imports, and each dataset `rlc data` writes from it is one its environment steps, single-turn ones in one step."""

from __future__ import annotations

from pkgutil import resolve_name

import pytest

pytest.importorskip("skyrl_gym")
pytest.importorskip("pyarrow")

from click.testing import CliRunner  # noqa: E402
from rlc.compiler.cli import cli  # noqa: E402
from rlc.core.environments import BY_ID, ENVIRONMENTS, WRITERS  # noqa: E402
from rlc.runtime.data import read_rows  # noqa: E402
from rlc.runtime.envs import SCORERS, gym  # noqa: E402
from rlc.runtime.envs.arithmetic import MAX_NUMBER  # noqa: E402
from rlc.runtime.generator import gym_extras  # noqa: E402
from rlc.spec.generation import SkyRLGymConfig  # noqa: E402
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402


def test_every_entry_names_an_environment_class_and_its_scorer_and_writer_import():
    assert len(BY_ID) == len(ENVIRONMENTS)  # one entry per id
    for env in ENVIRONMENTS:
        assert issubclass(resolve_name(env.entry_point), BaseTextEnv), env.id
        if env.scorer is not None:
            scorer = resolve_name(env.scorer)()
            assert callable(scorer.prompt) and callable(scorer.reward), env.id
        if env.writer is not None:
            assert callable(resolve_name(env.writer.function)), env.id
    assert set(SCORERS) == {"arithmetic", "synthetic"}


def test_the_arithmetic_commands_default_operand_is_the_environments():
    (high,) = [o for o in WRITERS["arithmetic"].options if o.keyword == "high"]
    assert high.default == MAX_NUMBER


def write(*args: str, home: str) -> list[str]:
    result = CliRunner().invoke(cli, ["data", *args], env={"HOME": home})
    assert result.exit_code == 0, result.output
    return [line.removeprefix("wrote ") for line in result.output.splitlines()]


def step_each(env_class: str, paths: list[str], max_turns: int = 3) -> None:
    """Every written row makes its environment, which scores a reply; a single-turn one ends there."""
    rows = read_rows(paths)
    assert rows
    for row in rows:
        env = gym.make(row.get("env_class") or env_class, SkyRLGymConfig(), gym_extras(row, max_turns))
        env.init(row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}])
        out = env.step("The answer is 7.")
        assert out["reward"] in (0.0, 1.0, -1.0)
        assert out["done"] or BY_ID[env_class].multi_turn


@pytest.mark.parametrize("env_id", sorted(WRITERS))
def test_rlc_data_writes_each_writers_dataset_for_its_environment(env_id, tmp_path):
    listed = CliRunner().invoke(cli, ["data", "--help"]).output
    assert f"  {env_id} " in listed
    paths = write(env_id, "--train", "3", "--validation", "2", "--seed", "4", home=str(tmp_path))
    assert paths == [
        str(tmp_path / ".cache" / "rlc" / "data" / env_id / f"{split}.parquet") for split in ("train", "validation")
    ]
    assert [len(read_rows([p])) for p in paths] == [3, 2]
    assert {row["env_class"] for row in read_rows(paths)} == {env_id}
    step_each(env_id, paths)


def test_verls_format_goes_to_a_directory_of_its_own_and_verl_scores_it(tmp_path):
    paths = write("arithmetic", "--format", "verl", "--train", "3", "--val", "2", home=str(tmp_path))
    assert {p.rsplit("/", 2)[1] for p in paths} == {"arithmetic-verl"}
    assert {row["data_source"] for row in read_rows(paths)} == {"openai/gsm8k"}
    step_each("verl", paths)
    chosen = write("arithmetic", "--format", "verl", "-o", str(tmp_path / "mine"), home=str(tmp_path))
    assert chosen[0] == str(tmp_path / "mine" / "train.parquet")  # -o says where, whatever the format
