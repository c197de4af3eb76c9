"""Datasets: parquet files of rows with a `prompt`, and the commands that write them.

`prompt` is a string or a list of chat messages (`{"role", "content"}`); chat prompts go through the
tokenizer's chat template. `env_class` names the row's environment (else `environment.env_class`); every other
column reaches the environment as SkyRL passes it (`reward_spec`, `extra_info`, ...). rlc's short rows
`{prompt, answer, env_class}` work too: their `answer` stands in for `reward_spec.ground_truth`. `rlc data gsm8k FILE` converts GSM8K's JSON lines / JSON / CSV (`question`,
`answer` with the `#### N` tail), `rlc data synthetic` generates the copy-the-digit task and `rlc data arithmetic`
addition / subtraction word problems.
"""

from __future__ import annotations

import csv
import json
import os
import random
import tempfile
from pathlib import Path
from pkgutil import resolve_name

import pyarrow as pa
import pyarrow.parquet as pq
from rlc.core.environments import Writer
from rlc.runtime.envs.arithmetic import rows as arithmetic_rows
from rlc.runtime.envs.gsm8k import INSTRUCTION, extract_answer
from rlc.runtime.envs.synthetic import rows as synthetic_rows
from rlc.runtime.paths import expand


class DataError(Exception):
    """A dataset is missing or malformed."""


def read_rows(paths: list[str]) -> list[dict]:
    rows: list[dict] = []
    for p in paths:
        path = expand(p)
        try:
            table = pq.read_table(path)
        except FileNotFoundError:
            raise DataError(f"data file {path} does not exist (write it with `rlc data ...`)") from None
        except Exception as exc:  # pyarrow raises several types for a broken file
            raise DataError(f"cannot read {path} as parquet: {exc}") from None
        if "prompt" not in table.column_names:
            raise DataError(f"{path} lacks the column prompt; every row needs one (text or chat messages)")
        rows.extend(table.to_pylist())
    return rows


def write_rows(rows: list[dict], path: Path) -> None:
    """Write a parquet file atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        # Every row gets every column (null where it has none): pyarrow would take the first row's keys alone, and
        # rows of different environments carry different fields.
        columns = list(dict.fromkeys(k for row in rows for k in row))
        pq.write_table(pa.Table.from_pylist([{k: row.get(k) for k in columns} for row in rows]), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# -- writers (`rlc data ...`; each one's options and defaults are its entry's in rlc.core.environments) ----------


def write_dataset(
    writer: Writer, out_dir: Path, train: int | None = None, validation: int | None = None, seed: int = 0, **options
) -> list[Path]:
    """Write an environment's train and validation splits into `out_dir` with `writer` (its entry's); the counts and
    options left out are the entry's defaults."""
    write = resolve_name(writer.function)
    chosen = {option.keyword: option.default for option in writer.options} | options
    return write(
        out_dir,
        writer.train.default if train is None else train,
        writer.validation.default if validation is None else validation,
        seed,
        **chosen,
    )


def synthetic(out_dir: Path, train: int, validation: int, seed: int) -> list[Path]:
    written = []
    for name, count, s in (("train", train, seed), ("validation", validation, seed + 1)):
        path = out_dir / f"{name}.parquet"
        write_rows(synthetic_rows(count, s), path)
        written.append(path)
    return written


def arithmetic(out_dir: Path, train: int, validation: int, seed: int, high: int, fmt: str = "rlc") -> list[Path]:
    """Word problems of `env_class: arithmetic` with numbers up to `high`; no validation question appears in the
    training split. `fmt` "verl" writes them as verl's GSM8K rows (for `env_class: verl`)."""
    held_out = arithmetic_rows(validation, seed + 1, high=high)
    problems = arithmetic_rows(train, seed, exclude={r["prompt"][0]["content"] for r in held_out}, high=high)
    if fmt == "verl":
        # deferred: skyrl-gym, only for verl's rows (not for `rlc data arithmetic`)
        from rlc.runtime.envs.verl import as_verl_rows

        problems, held_out = as_verl_rows(problems, "train"), as_verl_rows(held_out, "test")
    return _write_splits(out_dir, problems, held_out)


def calculator(out_dir: Path, train: int, validation: int, seed: int) -> list[Path]:
    """Multiplication problems of `env_class: calculator` (multi-turn, a calculator tool); no validation question
    appears in the training split."""
    # deferred: skyrl-gym (the environment's base class), kept out of `rlc data` for the other environments
    from rlc.runtime.envs.calculator import rows

    held_out = rows(validation, seed + 1)
    return _write_splits(out_dir, rows(train, seed, exclude={r["prompt"][-1]["content"] for r in held_out}), held_out)


def _write_splits(out_dir: Path, train_rows: list[dict], held_out: list[dict]) -> list[Path]:
    written = []
    for name, split in (("train", train_rows), ("validation", held_out)):
        path = out_dir / f"{name}.parquet"
        write_rows(split, path)
        written.append(path)
    return written


def _load_records(source: Path) -> list[dict]:
    text = source.read_text(encoding="utf-8")
    if source.suffix.lower() == ".csv":
        return list(csv.DictReader(text.splitlines()))
    stripped = text.lstrip()
    if stripped.startswith("["):
        data = json.loads(text)
        if not isinstance(data, list):
            raise DataError(f"{source}: expected a JSON list of records")
        return data
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{source}:{n}: not a JSON line ({exc.msg})") from None
    return records


def gsm8k(source: Path, out_dir: Path, validation: int = 0, seed: int = 0, name: str | None = None) -> list[Path]:
    """GSM8K records to chat-prompt rows; `validation` > 0 holds out that many rows as validation.parquet."""
    try:
        records = _load_records(source)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {source}: {exc}") from None
    except ValueError as exc:
        raise DataError(f"{source}: not JSON ({exc})") from None
    rows = []
    for i, rec in enumerate(records, 1):
        if not isinstance(rec, dict) or "question" not in rec or "answer" not in rec:
            raise DataError(f"{source}: record {i} lacks question/answer")
        answer = extract_answer(str(rec["answer"]), strict=True) or extract_answer(str(rec["answer"]))
        if answer is None:
            raise DataError(f"{source}: record {i} has no numeric answer")
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"{rec['question']} {INSTRUCTION}"}],
                "answer": answer,
                "env_class": "gsm8k",
                "reward_spec": {"method": "rule", "ground_truth": answer},  # what skyrl-gym's gsm8k scores against
            }
        )
    if validation >= len(rows) and validation > 0:
        raise DataError(f"{source} has {len(rows)} records, not enough to hold out {validation}")
    written = []
    if validation > 0:
        random.Random(seed).shuffle(rows)
        write_rows(rows[:validation], out_dir / "validation.parquet")
        written.append(out_dir / "validation.parquet")
        rows = rows[validation:]
    path = out_dir / f"{name or 'train'}.parquet"
    write_rows(rows, path)
    written.insert(0, path)
    return written
