"""skyrl-gym's `text2sql` with the model's SQL run in rlc's sandbox, against a read-only view of the database.

skyrl-gym runs the model's queries (the tool's, and the final `<solution>` the reward executes) through `sqlite3`
in the trainer's own process: a `SELECT zeroblob(...)` costs the trainer gigabytes, an `ATTACH` creates files
where the model says. Here each query runs in the sandbox, on the database opened read-only and immutable, with
SQLite's value size capped, at most `_MAX_ROWS` rows fetched, and the rows printed as JSON; the trainer builds the
observation (as skyrl-gym words it) and compares the result sets for the reward (skyrl-gym's rule: the same set
of rows as the gold query's).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from rlc.runtime.envs.sandbox import Limits, default_limits, run_python_each
from skyrl_gym.envs.sql.env import SQLEnv
from skyrl_gym.envs.sql.utils import verify_format_and_extract
from skyrl_gym.tools.core import ToolGroup, tool

TOOL_TIMEOUT_S = 5.0  # skyrl-gym's SQL tool
REWARD_TIMEOUT_S = 30.0  # skyrl-gym's reward query
_MAX_ROWS = 10_000
_MAX_VALUE = 1_000_000  # bytes of one SQLite string or blob

# One query per run (the SQL on stdin): printed as {"rows": [...]} or {"error": "..."}; blobs as {"hex": ...}.
_QUERY_RUNNER = r"""
import json, sqlite3, sys
def plain(v):
    return {"hex": v.hex()} if isinstance(v, bytes) else v
try:
    db = sqlite3.connect("file:data/db.sqlite?mode=ro&immutable=1", uri=True)
    db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE)
    db.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    rows = db.execute(sys.stdin.read()).fetchmany(MAX_ROWS)
    print(json.dumps({"rows": [[plain(v) for v in row] for row in rows]}))
except Exception as e:
    print(json.dumps({"error": str(e)}))
""".replace("MAX_VALUE", str(_MAX_VALUE)).replace("MAX_ROWS", str(_MAX_ROWS))


def run_queries(db_file: str, queries: list[str], seconds: float) -> list[list[tuple] | str | None]:
    """Each query's rows, or its error message, or None when it ran out of time or printed nothing readable."""
    limits = Limits(**{**default_limits().__dict__, "seconds": seconds})
    outcomes = run_python_each(_QUERY_RUNNER, queries, limits=limits, readonly={"db.sqlite": db_file})
    results: list[list[tuple] | str | None] = []
    for o in outcomes:
        try:
            said = json.loads(o.stdout) if not (o.timed_out or o.truncated) else None
        except ValueError:
            said = None
        if isinstance(said, dict) and isinstance(said.get("rows"), list):
            results.append([tuple(_hashable(v) for v in row) for row in said["rows"]])
        elif isinstance(said, dict) and "error" in said:
            results.append(str(said["error"]))
        else:
            results.append(None)
    return results


def _hashable(value: Any) -> Any:
    try:
        return bytes.fromhex(value["hex"]) if isinstance(value, dict) and "hex" in value else value
    except (TypeError, ValueError):
        return repr(value)


class SandboxedSQLToolGroup(ToolGroup):
    """skyrl-gym's SQL tool (same name, tool and messages), the query run in the sandbox."""

    def __init__(self, db_file: str):
        self.db_file = db_file
        super().__init__(name="SQLCodeExecutorToolGroup")

    @tool
    def sql(self, db_id: str, sql: str | None, turns_left: int, timeout: float = TOOL_TIMEOUT_S) -> str:
        reminder = f"<reminder>You have {turns_left} turns left to complete the task.</reminder>"
        if sql is None:
            obs = (
                "Your previous action is invalid. Follow the format of outputting thinking process and sql tool, "
                "and try again."
            )
        else:
            obs = self.observe(sql, timeout)
        return f"\n\n<observation>{obs}\n{reminder}</observation>\n\n"

    def observe(self, sql: str, timeout: float) -> str:
        (result,) = run_queries(self.db_file, [sql], timeout)
        if result is None:
            return f"SQL Timeout:\n{sql}"
        if isinstance(result, str):
            return f"Error executing SQL: {result}"
        try:  # rows the model's SQL chose: whatever fails to render is its error to read, not the environment's
            frame = pd.DataFrame(list(dict.fromkeys(result)))
            text = frame.to_string(index=False)
            if len(text) > 9000:  # skyrl-gym's cut, then a cap on characters too: one cell can be long
                text = "Truncated to 50 lines since returned response too long: " + frame.head(50).to_string(
                    index=False
                )
        except Exception as exc:
            return f"Error executing SQL: {type(exc).__name__}"
        return text[:9000]


class SandboxedSQLEnv(SQLEnv):
    """skyrl-gym's `text2sql` (tool calls, then a `<solution>` scored against the gold query), run in the sandbox."""

    def __init__(self, env_config: Any, extras: dict | None = None):
        super().__init__(env_config, extras or {})
        self.tool_group = SandboxedSQLToolGroup(self.db_file)
        self.init_tool_groups([self.tool_group])

    def _get_reward(self, action: str, done: bool) -> float:
        if not done:
            return 0
        completion = "".join(item["content"] for item in self.chat_history)
        valid, _, predicted, _ = verify_format_and_extract(completion)
        if not valid:
            return -1.0
        got, gold = run_queries(self.db_file, [predicted, self.gold_sql], REWARD_TIMEOUT_S)
        try:  # the predicted rows are the model's: rows that cannot be compared are wrong, reward 0
            same = isinstance(got, list) and isinstance(gold, list) and frozenset(got) == frozenset(gold)
        except Exception:
            same = False
        return 1.0 if same else 0.0
