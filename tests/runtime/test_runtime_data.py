"""Datasets and environments: the parquet rows `rlc data` writes, and how a completion is scored."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("pyarrow")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from conftest import run_rlc  # noqa: E402
from rlc.runtime import data, envs  # noqa: E402
from rlc.runtime.data import DataError, read_rows, write_rows  # noqa: E402
from rlc.runtime.envs import synthetic as synthetic_env  # noqa: E402
from rlc.runtime.envs.arithmetic import Arithmetic  # noqa: E402
from rlc.runtime.envs.gsm8k import INSTRUCTION, extract_answer  # noqa: E402
from rlc.runtime.envs.synthetic import CopyDigit  # noqa: E402

RECORDS = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "In May she sold 48/2 = 24.\nIn all 48+24 = 72.\n#### 72",
    },
    {"question": "A shop has 1,000 pens and gets 234 more. How many now?", "answer": "1000 + 234 = 1234\n#### 1,234"},
    {"question": "Half of 7?", "answer": "7 / 2 = 3.50\n#### 3.50"},
]
ANSWERS = ["72", "1234", "3.5"]


# -- environments ------------------------------------------------------------------------------------


def test_make_builds_rlcs_scorers():
    assert isinstance(envs.make("arithmetic"), Arithmetic)
    assert isinstance(envs.make("synthetic"), CopyDigit)
    with pytest.raises(ValueError, match="arithmetic, synthetic"):
        envs.make("gsm8k")  # skyrl-gym's environment, not a scorer of rlc's


def gsm8k_reward(row: dict, response: str) -> float:
    """The reward skyrl-gym's `gsm8k` gives a response to a row, built as the runtime builds it."""
    pytest.importorskip("skyrl_gym")
    from rlc.runtime.envs import gym
    from rlc.runtime.generator import gym_extras

    return gym.make("gsm8k", None, gym_extras(row, 1)).step(response)["reward"]


@pytest.mark.parametrize(
    "text, strict, expected",
    [
        ("so the total is #### 1,234", False, "1234"),
        ("#### 3.50", False, "3.5"),
        ("#### 3.0", True, "3"),
        ("#### -5", True, "-5"),
        ("first #### 1 then #### 2", True, "2"),
        ("she has 12 apples, then 15", False, "15"),
        ("she has 12 apples, then 15", True, None),
        ("no number here", False, None),
        ("####", False, None),
    ],
)
def test_extract_answer(text, strict, expected):
    assert extract_answer(text, strict=strict) == expected


@pytest.mark.parametrize(
    "response, reward",
    [
        ("48 / 2 = 24, 48 + 24 = 72 #### 72", 1.0),
        ("#### 72 and later #### 71", 1.0),  # SkyRL's gsm8k reads the first marked answer
        ("#### 72.00", 0.0),  # ... as written: 72.00 is not 72
        ("#### 71", 0.0),
        ("the answer is 72", 0.0),  # the reward wants the marked answer
        ("", 0.0),
    ],
)
def test_gsm8k_reward_is_skyrl_gyms(response, reward):
    assert gsm8k_reward({"reward_spec": {"ground_truth": "72"}}, response) == reward


def test_a_short_row_answer_is_the_ground_truth():
    assert gsm8k_reward({"answer": "1234"}, "#### 1,234") == 1.0
    assert gsm8k_reward({"answer": "1234"}, "#### 234") == 0.0


def test_synthetic_rows_are_deterministic_per_seed():
    rows = synthetic_env.rows(50, seed=3)
    assert rows == synthetic_env.rows(50, seed=3)
    assert rows != synthetic_env.rows(50, seed=4)
    assert len({r["answer"] for r in rows}) > 5
    for r in rows:
        assert set(r) == {"prompt", "answer", "env_class"} and r["env_class"] == "synthetic"
        assert r["answer"] in "0123456789" and r["prompt"] == f"copy the digit {r['answer']}:"


@pytest.mark.parametrize(
    "response, finished, reward",
    [
        ("7", True, 1.0),
        (" 7", True, 1.0),
        ("7", False, 0.25),
        ("78", True, 0.25),
        ("3", True, 0.0),
        ("", True, 0.0),
    ],
)
def test_copy_digit_reward(response, finished, reward):
    assert CopyDigit().reward({"answer": "7"}, response, finished) == reward


def test_environment_prompt_is_the_row_prompt():
    row = synthetic_env.rows(1, seed=0)[0]
    assert CopyDigit().prompt(row) == row["prompt"]


# -- parquet rows ------------------------------------------------------------------------------------


def test_rows_round_trip_through_parquet(tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4", "env_class": "gsm8k"},
        {"prompt": [{"role": "user", "content": "3+3?"}], "answer": "6", "env_class": "gsm8k"},
    ]
    write_rows(rows, tmp_path / "a" / "train.parquet")
    write_rows(synthetic_env.rows(3, 0), tmp_path / "b.parquet")
    assert read_rows([str(tmp_path / "a" / "train.parquet"), str(tmp_path / "b.parquet")]) == rows + synthetic_env.rows(
        3, 0
    )


def test_a_missing_data_file_names_its_path_and_the_fix(tmp_path):
    path = tmp_path / "nowhere" / "train.parquet"
    with pytest.raises(DataError) as err:
        read_rows([str(path)])
    assert str(path) in str(err.value) and "rlc data" in str(err.value)


def test_a_file_without_the_prompt_column_is_refused(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "x", "answer": "1"}]), path)
    with pytest.raises(DataError, match="prompt"):
        read_rows([str(path)])


def test_rows_in_skyrls_shape_are_read_as_they_are(tmp_path):
    row = {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "env_class": "gsm8k",
        "reward_spec": {"method": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 0},
    }
    write_rows([row], tmp_path / "train.parquet")
    assert read_rows([str(tmp_path / "train.parquet")]) == [row]


def test_a_file_that_is_not_parquet_is_refused(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_text("prompt,answer\nx,1\n")
    with pytest.raises(DataError, match="parquet"):
        read_rows([str(path)])


def test_write_rows_replaces_a_file_whole_or_not_at_all(tmp_path):
    path = tmp_path / "train.parquet"
    write_rows([{"prompt": "old", "answer": "1"}], path)
    with pytest.raises(pa.ArrowInvalid):
        write_rows([{"prompt": "new", "answer": 1}, {"prompt": "new", "answer": [1, 2]}], path)  # no common type
    assert read_rows([str(path)]) == [{"prompt": "old", "answer": "1"}]
    write_rows([{"prompt": "new", "answer": "2"}], path)
    assert read_rows([str(path)]) == [{"prompt": "new", "answer": "2"}]
    assert [p.name for p in tmp_path.iterdir()] == ["train.parquet"]  # no temporary files left behind


def test_synthetic_dataset(tmp_path):
    train, val = data.synthetic(tmp_path, train=20, validation=4, seed=5)
    assert (train, val) == (tmp_path / "train.parquet", tmp_path / "validation.parquet")
    assert read_rows([str(train)]) == synthetic_env.rows(20, 5)
    assert len(read_rows([str(val)])) == 4
    assert read_rows([str(train)]) == read_rows([str(data.synthetic(tmp_path / "again", 20, 4, seed=5)[0])])


def write_source(tmp_path, kind: str, records=RECORDS):
    if kind == "jsonl":
        path = tmp_path / "gsm8k.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    elif kind == "json":
        path = tmp_path / "gsm8k.json"
        path.write_text(json.dumps(records, indent=2))
    else:
        path = tmp_path / "gsm8k.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["question", "answer"])
            writer.writeheader()
            writer.writerows(records)
    return path


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv"])
def test_gsm8k_conversion(tmp_path, kind):
    source = write_source(tmp_path, kind)
    out = tmp_path / "out"
    assert data.gsm8k(source, out) == [out / "train.parquet"]
    rows = read_rows([str(out / "train.parquet")])
    assert [r["answer"] for r in rows] == ANSWERS
    for rec, row in zip(RECORDS, rows):
        assert row["env_class"] == "gsm8k"
        assert row["prompt"] == [{"role": "user", "content": f"{rec['question']} {INSTRUCTION}"}]
    # What the converter writes, skyrl-gym's environment scores.
    assert [r["reward_spec"]["ground_truth"] for r in rows] == ANSWERS
    assert gsm8k_reward(rows[0], "#### 72") == 1.0


def test_gsm8k_validation_holdout_and_name(tmp_path):
    source = write_source(tmp_path, "jsonl")
    paths = data.gsm8k(source, tmp_path / "out", validation=1, seed=0, name="test")
    assert paths == [tmp_path / "out" / "test.parquet", tmp_path / "out" / "validation.parquet"]
    train, val = (read_rows([str(p)]) for p in paths)
    assert (len(train), len(val)) == (2, 1)
    assert sorted(r["answer"] for r in train + val) == sorted(ANSWERS)
    again = data.gsm8k(source, tmp_path / "again", validation=1, seed=0, name="test")
    assert read_rows([str(again[1])]) == val


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "q", "answer": "#### 1"}\n{"question": \n', ":2: not a JSON line"),
        ('[{"question": "q", "answer": "#### 1"},', "not JSON"),
        ('{"question": "q"}\n', "record 1 lacks question/answer"),
        ('[{"question": "q", "answer": "#### 1"}, 7]', "record 2 lacks question/answer"),
        ('{"question": "q", "answer": "no number"}\n', "record 1 has no numeric answer"),
    ],
)
def test_malformed_gsm8k_input_is_a_data_error(tmp_path, content, message):
    source = tmp_path / "bad.jsonl"
    source.write_text(content)
    with pytest.raises(DataError, match=message):
        data.gsm8k(source, tmp_path / "out")
    assert not (tmp_path / "out" / "train.parquet").exists()


def test_gsm8k_csv_without_an_answer_column_is_a_data_error(tmp_path):
    source = tmp_path / "bad.csv"
    source.write_text("question,solution\nq,#### 1\n")
    with pytest.raises(DataError, match="lacks question/answer"):
        data.gsm8k(source, tmp_path / "out")


def test_gsm8k_missing_source_and_too_large_holdout(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        data.gsm8k(tmp_path / "absent.jsonl", tmp_path / "out")
    with pytest.raises(DataError, match="not enough to hold out 3"):
        data.gsm8k(write_source(tmp_path, "jsonl"), tmp_path / "out", validation=3)


# -- `rlc data` ----------------------------------------------------------------------------------------


def test_rlc_data_synthetic(tmp_path):
    result = run_rlc("data", "synthetic", "-o", str(tmp_path / "syn"), "--train", "20", "--validation", "4")
    assert result.returncode == 0, result.stderr
    assert f"wrote {tmp_path / 'syn' / 'train.parquet'}" in result.stdout
    assert len(read_rows([str(tmp_path / "syn" / "train.parquet")])) == 20
    assert len(read_rows([str(tmp_path / "syn" / "validation.parquet")])) == 4


def test_rlc_data_gsm8k(tmp_path):
    result = run_rlc(
        "data", "gsm8k", str(write_source(tmp_path, "jsonl")), "-o", str(tmp_path / "g"), "--validation", "1"
    )
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    assert len(read_rows([str(tmp_path / "g" / "train.parquet")])) == 2
    assert len(read_rows([str(tmp_path / "g" / "validation.parquet")])) == 1


def test_rlc_data_gsm8k_reports_a_malformed_file(tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"question": "q", "answer": "#### 1"}\nnot json\n')
    result = run_rlc("data", "gsm8k", str(source), "-o", str(tmp_path / "g"))
    assert result.returncode == 1
    assert result.stderr.startswith("rlc data:") and f"{source}:2" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())


def test_rows_of_different_environments_keep_each_ones_fields(tmp_path):
    rows = [
        {"prompt": "a", "env_class": "gsm8k", "reward_spec": {"ground_truth": "1"}},
        {"prompt": "b", "env_class": "text2sql", "db_id": "shop", "data": "spider"},
    ]
    write_rows(rows, tmp_path / "mixed.parquet")
    back = read_rows([str(tmp_path / "mixed.parquet")])
    assert back[1]["db_id"] == "shop" and back[1]["data"] == "spider" and back[1]["reward_spec"] is None
    assert back[0]["reward_spec"] == {"ground_truth": "1"} and back[0]["db_id"] is None
