"""SkyRL-Gym environments as the runtime builds them, against real components: SQLite databases, a retrieval
server on 127.0.0.1, code run against its test cases in the sandbox."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

pytest.importorskip("skyrl_gym")

from retrieval import RetrievalServer  # noqa: E402
from rlc.runtime.envs import gym  # noqa: E402
from rlc.runtime.generator import gym_extras  # noqa: E402
from rlc.spec.generation import SkyRLGymConfig  # noqa: E402

SKYRL_GYM_IDS = {"aime", "gsm8k", "gsm8k_multi_turn", "lcb", "search", "searchcode", "text2sql"}


@pytest.fixture(autouse=True)
def sandbox_level(monkeypatch):
    """The code environments' grading runs in the jail where the machine gives one, else unisolated: what these
    tests judge is the grading; tests/runtime/test_sandbox.py tries the jail itself."""
    from rlc.runtime.envs import sandbox

    level = "bubblewrap" if sandbox.probe().bubblewrap else "unisolated"
    monkeypatch.setattr(sandbox, "_policy", sandbox._Policy(level))


def make(env_class: str, row: dict, config: SkyRLGymConfig | None = None, max_turns: int = 5):
    return gym.make(env_class, config or SkyRLGymConfig(), gym_extras(row, max_turns))


def test_every_skyrl_gym_environment_and_rlcs_own_are_registered():
    assert SKYRL_GYM_IDS | {"arithmetic", "synthetic", "llm_as_a_judge"} <= set(gym.registered())


def test_the_compilers_list_of_environments_is_what_the_runtime_registers():
    from importlib.metadata import entry_points

    from rlc.core.environments import ENVIRONMENTS
    from rlc.core.runtime_facts import BUILTIN_ENVS, CHAT_TEMPLATE_NAMES, SKYRL_GYM_ENVS
    from rlc.runtime.chat import NAMED_TEMPLATES

    extensions = {ep.name for ep in entry_points(group=gym.ENV_GROUP)}
    assert set(BUILTIN_ENVS) == set(gym.registered()) - extensions
    # skyrl-gym's own registry, in a process where rlc has registered nothing over it: its ids, and the classes rlc
    # registers again where it runs skyrl-gym's own (rlc.core.environments)
    own = subprocess.run(
        [sys.executable, "-c", "import skyrl_gym\nfor k, v in skyrl_gym.registry.items(): print(k, v.entry_point)"],
        capture_output=True,
        text=True,
        check=True,
    )
    theirs = dict(line.split() for line in own.stdout.splitlines())
    assert set(SKYRL_GYM_ENVS) == set(theirs)
    kept = {env.id: env.entry_point for env in ENVIRONMENTS if not env.entry_point.startswith("rlc.")}
    assert kept == {env_id: theirs[env_id] for env_id in kept}
    assert set(kept) == {"aime", "gsm8k", "gsm8k_multi_turn", "search"}
    assert CHAT_TEMPLATE_NAMES == tuple(sorted(NAMED_TEMPLATES))


def test_an_unknown_environment_names_the_ones_there_are():
    with pytest.raises(gym.UnknownEnvironmentError, match="gsm8k, gsm8k_multi_turn"):
        gym.make("gsm9k", SkyRLGymConfig(), {})


def test_an_environment_gets_its_own_settings_section():
    config = SkyRLGymConfig()
    assert gym.env_config(config, "search") is config.search
    assert gym.env_config(config, "gsm8k") == {}  # no section: SkyRL hands an empty dict
    assert gym.env_config(config, "max_env_workers") == {}  # a plain setting is not a section


def test_rlcs_scorers_step_as_single_turn_environments():
    env = make("arithmetic", {"prompt": [{"role": "user", "content": "2+3?"}], "answer": "5"})
    assert env.init([{"role": "user", "content": "2+3?"}])[0] == [{"role": "user", "content": "2+3?"}]
    out = env.step_finished("2 + 3 = 5", True)
    assert (out["reward"], out["done"], out["observations"]) == (1.0, True, [])
    cut_off = make("arithmetic", {"answer": "5"}).step_finished("2 + 3 = 5", False)
    assert cut_off["reward"] == 0.0  # arithmetic scores a completion that ran out of tokens 0
    assert make("synthetic", {"answer": "7"}).step("7")["reward"] == 1.0


def test_the_tables_right_or_wrong_environments_score_two_values_and_the_graded_ones_more():
    """`right_or_wrong` in core/environments.py, which the time estimate reads (a group of such rewards agrees by
    chance), against the environments' own scores: gsm8k and arithmetic give 1 or 0, aime 1 or -1; synthetic gives a
    quarter for the digit first and gsm8k_multi_turn a format score to a well-formed wrong answer."""
    from rlc.core.environments import BY_ID

    gsm8k = {"reward_spec": {"ground_truth": "5"}}
    answers = ("#### 5", "#### 6", "5", "no idea")
    assert {make("gsm8k", gsm8k).step(a)["reward"] for a in answers} == {0.0, 1.0}
    arithmetic = {make("arithmetic", {"answer": "5"}).step_finished(a, True)["reward"] for a in ("5", "6", "x")}
    assert arithmetic == {0.0, 1.0}
    aime = {"reward_model": {"ground_truth": "5"}}
    assert {make("aime", aime).step(a)["reward"] for a in ("Answer: 5", "Answer: 6", "no idea")} == {1.0, -1.0}
    assert make("synthetic", {"answer": "7"}).step("7 and more")["reward"] == 0.25
    assert 0 < make("gsm8k_multi_turn", gsm8k).step("#### 6")["reward"] < 1
    assert all(BY_ID[e].right_or_wrong for e in ("gsm8k", "arithmetic", "aime", "calculator"))
    assert not any(BY_ID[e].right_or_wrong for e in ("synthetic", "gsm8k_multi_turn", "llm_as_a_judge"))


# -- text2sql against SQLite databases built here -------------------------------------------------------------


@pytest.fixture
def sql_config(tmp_path):
    db_dir = tmp_path / "sql" / "spider" / "database" / "shop"
    db_dir.mkdir(parents=True)
    with sqlite3.connect(db_dir / "shop.sqlite") as db:
        db.execute("CREATE TABLE fruit (name TEXT, price INTEGER)")
        db.executemany("INSERT INTO fruit VALUES (?, ?)", [("apple", 3), ("pear", 5), ("plum", 2)])
    config = SkyRLGymConfig()
    config.text2sql.db_path = str(tmp_path / "sql")
    return config


def sql_row(gold: str = "SELECT name FROM fruit WHERE price > 2") -> dict:
    return {"prompt": [], "db_id": "shop", "data": "spider", "reward_spec": {"ground_truth": gold}}


def test_text2sql_runs_the_models_query_and_scores_its_answer(sql_config):
    env = make("text2sql", sql_row(), sql_config)
    first = env.step("<think>which fruit costs more than 2?</think><sql>SELECT name, price FROM fruit</sql>")
    assert not first["done"] and first["reward"] == 0
    seen = first["observations"][0]["content"]
    assert "apple" in seen and "pear" in seen and "plum" in seen  # the query really ran on the database
    last = env.step("<think>apple and pear</think><solution>SELECT name FROM fruit WHERE price >= 3</solution>")
    assert last["done"] and last["reward"] == 1.0  # same rows as the gold query
    wrong = make("text2sql", sql_row(), sql_config)
    assert wrong.step("<think>x</think><solution>SELECT name FROM fruit</solution>")["reward"] == 0.0


def test_the_models_sql_is_bounded_and_writes_nothing(sql_config, tmp_path):
    env = make("text2sql", sql_row(), sql_config)
    blob = env.step("<think>x</think><sql>SELECT zeroblob(100000000)</sql>")["observations"][0]["content"]
    assert "too big" in blob and len(blob) < 10_000  # not 800 million characters in the trainer
    attached = tmp_path / "attached.sqlite"
    env.step(f"<think>x</think><sql>ATTACH DATABASE '{attached}' AS e</sql>")
    assert not attached.exists()
    gold = sql_row("SELECT name FROM fruit WHERE price > 2; DROP TABLE fruit")  # one statement runs, none writes
    last = make("text2sql", gold, sql_config).step("<think>x</think><solution>DELETE FROM fruit</solution>")
    assert (
        last["reward"] == 0.0
        and make("text2sql", sql_row(), sql_config).step(
            "<think>x</think><solution>SELECT name FROM fruit WHERE price >= 3</solution>"
        )["reward"]
        == 1.0
    )


def test_a_malformed_tool_call_is_answered_not_raised(sql_config):
    env = make("text2sql", sql_row(), sql_config)
    out = env.step("I will query the table now")  # no <sql> block
    assert not out["done"] and "invalid" in out["observations"][0]["content"]
    broken = env.step("<think>x</think><sql>SELEC name FRM fruit</sql>")
    assert "Error executing SQL" in broken["observations"][0]["content"]


def test_a_query_that_hangs_is_stopped_at_the_tools_timeout(sql_config):
    env = make("text2sql", sql_row(), sql_config)
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    out = env.step(f"<think>count</think><sql>{endless}</sql>")  # the tool interrupts it after its 5 s
    assert "SQL Timeout" in out["observations"][0]["content"] and not out["done"]


def test_a_missing_database_fails_the_environment(sql_config):
    with pytest.raises(FileNotFoundError):
        make("text2sql", {**sql_row(), "db_id": "nowhere"}, sql_config)


# -- search against a retrieval server on 127.0.0.1 -----------------------------------------------------------


def test_search_calls_the_retrieval_server_and_scores_the_answer():
    with RetrievalServer() as server:
        config = SkyRLGymConfig()
        config.search.search_url = server.url
        row = {"prompt": [], "reward_spec": {"ground_truth": {"target": ["Paris"]}}}
        env = make("search", row, config, max_turns=3)
        out = env.step("<think>I need the capital of France</think><search>capital of France</search>")
        assert server.requests == 1 and not out["done"]
        result = json.loads(out["observations"][0]["content"].split("<information>")[1].split("</information>")[0])
        assert result["result"].startswith("Doc 1: Paris is the capital")
        assert env.step("<answer>Paris</answer>")["reward"] == 1.0
        assert make("search", row, config).step("<answer>Berlin</answer>")["reward"] == 0.0


# -- code, run in the sandbox ---------------------------------------------------------------------------------

ADD_TESTS = [
    {"input": "3 4\n", "output": "7\n", "testtype": "stdin"},
    {"input": "10 5\n", "output": "15\n", "testtype": "stdin"},
]


def lcb_row(tests=ADD_TESTS) -> dict:
    return {"prompt": [], "reward_spec": {"ground_truth": json.dumps(tests)}}


@pytest.mark.parametrize(
    "code, reward",
    [
        ("a, b = map(int, input().split())\nprint(a + b)", 1.0),
        ("a, b = map(int, input().split())\nprint(a - b)", 0.0),
        ("import os\nprint(os.environ['RLC_TEST_API_KEY'])", 0.0),  # no secret to print: a KeyError
    ],
)
def test_lcb_runs_the_code_against_its_test_cases(code, reward, monkeypatch):
    monkeypatch.setenv("RLC_TEST_API_KEY", "42")
    out = make("lcb", lcb_row()).step(f"Here it is:\n```python\n{code}\n```")
    assert (out["reward"], out["done"]) == (reward, True)


FORGERIES = {
    # E1 of the review: the old harness's nonce, then the verdict line for every case, then an exit
    "verdict": "import __main__, sys, json, os\n"
    "sys.__stdout__.write('\\n' + __main__.nonce + ' ' + json.dumps([True, True]) + '\\n')\n"
    "sys.__stdout__.flush()\nos._exit(0)",
    # E2: the answer key from the grader's request
    "answer key": "import __main__, sys, json\nio = json.loads(__main__.request['sample']['input_output'])\n"
    "print(io['outputs'][io['inputs'].index(sys.stdin.read())], end='')",
    # anything in its directory or its process that holds the expected output
    "search": "import os, sys, gc\nfor name in os.listdir('.'):\n    print(open(name).read())\n"
    "print([o for o in gc.get_objects() if isinstance(o, str) and o.strip() in ('7', '15')])",
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_lcb_code_cannot_forge_its_reward(forgery):
    assert make("lcb", lcb_row()).step(f"```python\n{FORGERIES[forgery]}\n```")["reward"] == 0.0


def test_lcb_grades_call_based_problems_by_the_value_returned():
    tests = [{"input": "[1, 2]\n3", "output": "[4, 5]", "testtype": "functional", "metadata": {"func_name": "add"}}]
    right = "class Solution:\n    def add(self, xs: List[int], k: int) -> List[int]:\n        print('noise')\n" + (
        "        return tuple(x + k for x in xs)"
    )
    assert make("lcb", lcb_row(tests)).step(f"```python\n{right}\n```")["reward"] == 1.0
    wrong = "class Solution:\n    def add(self, xs, k):\n        print([4, 5])\n        return xs"
    assert make("lcb", lcb_row(tests)).step(f"```python\n{wrong}\n```")["reward"] == 0.0


def test_the_python_tools_output_is_capped():
    env = make("searchcode", {"prompt": [], "reward_spec": {"ground_truth": "4"}}, max_turns=3)
    code = "import sys\nfor _ in range(200):\n    sys.stdout.write('A' * 2**20)"
    seen = env.step(f"<tool><python>{code}</python></tool>")["observations"][0]["content"]
    assert len(seen) < 10_000 and "output" in seen  # not 200 million characters


def test_the_calculator_evaluates_arithmetic_only(tmp_path):
    from rlc.runtime.envs.calculator import CalculatorEnv

    env = CalculatorEnv(extras={"answer": "6", "max_turns": 3})
    marker = tmp_path / "ran"
    out = env.step(f"<calc>__import__('os').system('touch {marker}')</calc>")
    assert "error" in out["observations"][0]["content"] and not marker.exists()
    assert env.step("<calc>2 * 3</calc>")["observations"][0]["content"] == "<result>6</result>"


def test_lcb_without_a_code_block_scores_nothing():
    assert make("lcb", lcb_row()).step("print(7)")["reward"] == 0.0


def test_searchcodes_python_tool_runs_in_the_sandbox(monkeypatch):
    monkeypatch.setenv("RLC_TEST_API_KEY", "s3cr3t")
    env = make("searchcode", {"prompt": [], "reward_spec": {"ground_truth": "4"}}, max_turns=3)
    out = env.step("<tool><python>import os; print(2 + 2, os.environ.get('RLC_TEST_API_KEY'))</python></tool>")
    assert out["observations"][0]["content"] == "4 None"
    bad = env.step("<tool><python>1/0</python></tool>")
    assert "ZeroDivisionError" in bad["observations"][0]["content"]


def test_an_extensions_environment_is_built_with_its_spec_section():
    from importlib.metadata import entry_points

    if not any(ep.name == "countdown" for ep in entry_points(group=gym.ENV_GROUP)):
        pytest.skip("the demo extension is not installed here (make venv installs it)")
    from rlc.spec.model import default_model

    spec = default_model().to_typed({"environment": {"skyrl_gym": {"countdown": {"allow_negative": True}}}})
    row = {"prompt": [], "numbers": [3, 4, 5], "target": 2}
    env = gym.make("countdown", spec.environment.skyrl_gym, gym_extras(row, 1))
    assert env.step("<answer>3 - 4 + 3</answer>")["reward"] == 0.0  # 3 is given once
    assert env.step("<answer>3 - 5 + 4</answer>")["reward"] == 1.0  # negative on the way: allowed by the section


# -- an LLM judge behind an OpenAI-compatible API on 127.0.0.1 ------------------------------------------------


@pytest.fixture
def judge_url():
    """A judge server: grades 1 when the student's `#### N` matches the reference's, after checking the key."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Judge(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions" or self.headers.get("Authorization") != "Bearer test-key":
                self.send_error(401)
                return
            text = body["messages"][0]["content"]
            reference, student = text.split("Reference solution:\n")[1].split("\n\nStudent's solution:\n")
            same = reference.split("####")[-1].strip() == student.split("####")[-1].strip() and "####" in student
            reply = json.dumps({"choices": [{"message": {"content": f"Checked.\nScore: {int(same)}"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_llm_as_a_judge_asks_the_judge_with_the_key(judge_url, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    config = SkyRLGymConfig()
    config.llm_as_a_judge.base_url = judge_url
    row = {"prompt": [], "reward_spec": {"ground_truth": "24 + 48 = 72\n#### 72"}}
    assert make("llm_as_a_judge", row, config).step("so 72 in all\n#### 72")["reward"] == 1.0
    assert make("llm_as_a_judge", row, config).step("#### 71")["reward"] == 0.0
    monkeypatch.setenv("OPENAI_API_KEY", "wrong-key")
    refused = make("llm_as_a_judge", row, config).step("#### 72")
    assert refused["reward"] == 0.0 and "401" in refused["metadata"]["judge_error"]
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        make("llm_as_a_judge", row, config)


# -- graders return a reward for whatever the program printed (issue 50) -------------------------------------------
# An exception from the graded output would count as an environment error (no loss), so a failing program would opt
# out of its negative advantage; tests/runtime/test_sandbox.py holds the call-based RecursionError of the review.

PRINTS = {
    "nested brackets": "import os\nos.write(1, b'[' * 200000 + b']' * 200000 + b'\\n')",
    "signalling NaN": "print('sNaN')",
    "huge exponent": "print('1e999999999999999999')",
    "no UTF-8": "import os\nos.write(1, b'\\xff\\xfe\\x00 7\\n')",
}


@pytest.mark.parametrize("printed", sorted(PRINTS))
def test_lcb_scores_any_output_of_a_stdio_program(printed):
    assert make("lcb", lcb_row()).step(f"```python\n{PRINTS[printed]}\n```")["reward"] == 0.0


@pytest.mark.parametrize("printed", sorted(PRINTS))
def test_lcb_scores_any_output_of_a_call_based_program(printed):
    tests = [{"input": "[1, 2]\n3", "output": "[4, 5]", "testtype": "functional", "metadata": {"func_name": "add"}}]
    body = "\n".join("        " + line for line in PRINTS[printed].splitlines())
    code = f"class Solution:\n    def add(self, xs, k):\n{body}\n        return 'x' * 10**6"
    assert make("lcb", lcb_row(tests)).step(f"```python\n{code}\n```")["reward"] == 0.0


@pytest.mark.parametrize("printed", sorted(PRINTS))
def test_the_python_tool_observes_any_output(printed):
    env = make("searchcode", {"prompt": [], "reward_spec": {"ground_truth": "4"}}, max_turns=3)
    seen = env.step(f"<tool><python>{PRINTS[printed]}</python></tool>")["observations"][0]["content"]
    assert isinstance(seen, str)


def test_text2sql_scores_any_rows_the_models_sql_returns(sql_config):
    hostile = "SELECT 1e999, -1e999, char(0), x'00ff', '{\"hex\": \"zz\"}', 9223372036854775807"
    env = make("text2sql", sql_row(), sql_config)
    seen = env.step(f"<think>x</think><sql>{hostile}</sql>")["observations"][0]["content"]
    assert isinstance(seen, str)
    last = make("text2sql", sql_row(), sql_config).step(f"<think>x</think><solution>{hostile}</solution>")
    assert last["reward"] == 0.0
