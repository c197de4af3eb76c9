"""skyrl-gym's code environments with the model's code run in rlc's sandbox and judged outside it.

skyrl-gym runs generated code in a fork of the trainer (`lcb`: its test harness in a multiprocessing child) or as
`python -c` with the trainer's environment (`searchcode`'s python tool). Here the code runs in
`rlc.runtime.envs.sandbox`, once per test case with only that case's input, and the trainer compares what it printed
(or returned) with the expected output by skyrl-gym's own rules: the expected outputs, and the verdict, never
enter the process that runs the code, so nothing it prints or reads can change its own reward.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from rlc.runtime.envs.sandbox import Limits, default_limits, run_python, run_python_each
from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput
from skyrl_gym.envs.lcb.env import LCBEnv
from skyrl_gym.envs.lcb.livecodebench import (
    clean_if_name,
    extract_code_from_model,
    get_stripped_lines,
    import_string,
    make_function,
)
from skyrl_gym.envs.searchcode.env import SearchCodeEnv
from skyrl_gym.tools import SearchToolGroup
from skyrl_gym.tools.core import ToolGroup, tool

LCB_TEST_TIMEOUT_S = 6  # per test case, as skyrl-gym's lcb grader
PYTHON_TOOL_TIMEOUT_S = 10.0  # skyrl-gym's python tool default

# skyrl-gym's harness puts its imports before the solution; numpy and pandas among them take a second or two to
# import, once per test case here, so the runners import those two when the solution first names `np` or `pd`.
_EAGER = "import numpy as np\nimport pandas as pd\n"
assert _EAGER in import_string, "skyrl-gym's lcb prelude imports numpy and pandas"
_PRELUDE = import_string.replace(_EAGER, "")
_NAMESPACE = r"""
class Names(dict):
    def __missing__(self, key):
        if key in ("np", "pd"):
            self[key] = __import__({"np": "numpy", "pd": "pandas"}[key])
            return self[key]
        raise KeyError(key)
ns = Names(__name__="tmp_sol")
"""

# Runs one test case of a standard-input problem: the solution as skyrl-gym's harness wraps it (its imports, the
# body in a function, a `__main__` guard unwrapped), the case's input on stdin, SystemExit taken as the end.
_STDIO_RUNNER = (
    _NAMESPACE
    + r"""
exec(compile(open("solution.py").read(), "solution.py", "exec"), ns)
try:
    ns["wrapped_function"]()
except SystemExit:
    pass
"""
)

# Runs one test case of a call-based problem: the arguments (one JSON value a line) on stdin, the return value
# printed as JSON on the last line; what the solution itself prints goes nowhere.
_CALL_RUNNER = (
    _NAMESPACE
    + r"""
import json, os, sys
source = open("solution.py").read()
exec(compile(source, "solution.py", "exec"), ns)
name = open("fn_name").read()
method = getattr(ns["Solution"](), name) if "class Solution" in source else ns[name]
args = [json.loads(line) for line in sys.stdin.read().split("\n")]
real, sys.stdout = sys.stdout, open(os.devnull, "w")
result = method(*args)
real.write("\n" + json.dumps(list(result) if isinstance(result, tuple) else result) + "\n")
"""
)


# The graders below read what a hostile program printed: any exception it provokes there (200,000 nested brackets
# make json.loads raise RecursionError) is a wrong answer, reward 0, never an environment error, which would cost
# the sample nothing and let a failing program opt out of its negative advantage.


def _same_stdio(printed: str, expected: str) -> bool:
    """skyrl-gym's stdio rule: the same lines once stripped, or each line the same decimals."""
    want = get_stripped_lines(expected)
    try:
        got = get_stripped_lines(printed)
        if len(got) != len(want):
            return False
        for a, b in zip(got, want):
            if a != b and [Decimal(x) for x in a.split()] != [Decimal(x) for x in b.split()]:
                return False
        return True
    except Exception:
        return False


def _same_call(printed: str, expected: str) -> bool:
    """skyrl-gym's call-based rule: the returned value (a tuple as a list) equals the expected JSON value."""
    try:
        return json.loads(printed.rstrip("\n").rsplit("\n", 1)[-1]) == json.loads(expected)
    except Exception:
        return False


def passes_tests(tests: list[dict], code: str, test_timeout_s: int = LCB_TEST_TIMEOUT_S) -> bool:
    """Whether `code` passes every LiveCodeBench test case (`tests` as in a row's reward_spec.ground_truth)."""
    if not tests:
        return False
    functional = tests[0].get("testtype") == "functional"
    limits = Limits(**{**default_limits().__dict__, "seconds": float(test_timeout_s)})
    if functional:
        fn_name = (tests[0].get("metadata") or {}).get("func_name")
        if not fn_name:
            return False
        files = {"solution.py": _PRELUDE + "\n\n" + code, "fn_name": fn_name}
        runner, same = _CALL_RUNNER, _same_call
    else:
        files = {"solution.py": make_function(clean_if_name(code)).replace(import_string, _PRELUDE, 1)}
        runner, same = _STDIO_RUNNER, _same_stdio
    outcomes = run_python_each(runner, [str(t["input"]) for t in tests], limits=limits, files=files)
    return all(
        o.returncode == 0 and not o.timed_out and not o.truncated and same(o.stdout, str(t["output"]))
        for o, t in zip(outcomes, tests, strict=True)
    )


class SandboxedLCBEnv(LCBEnv):
    """skyrl-gym's `lcb`: reward 1 when the last code block of the response passes every test case."""

    def step(self, action: str) -> BaseTextEnvStepOutput:
        code = extract_code_from_model(action)
        reward = 1.0 if code is not None and passes_tests(self.tests, code) else 0.0
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={"parsed_code": code})


class SandboxedPythonToolGroup(ToolGroup):
    """skyrl-gym's python tool (same name, tool and messages), run in the sandbox; its output is capped."""

    def __init__(self, timeout: float = PYTHON_TOOL_TIMEOUT_S):
        self.timeout = timeout
        super().__init__(name="PythonCodeExecutorToolGroup")

    @tool
    def python(self, code: str) -> str:
        limits = Limits(**{**default_limits().__dict__, "seconds": self.timeout})
        outcome = run_python(code, limits=limits)
        if outcome.timed_out:
            return f"Error executing Python code: Execution timed out after {self.timeout} seconds."
        if outcome.truncated:
            return f"Error executing Python code: more than {limits.output_kb} KiB of output."
        if outcome.stderr:
            return f"Error executing Python code: {outcome.stderr.strip()}"
        return outcome.stdout.strip()


class SandboxedSearchCodeEnv(SearchCodeEnv):
    """skyrl-gym's `searchcode` (search and python tools) with the python tool in the sandbox."""

    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__(env_config, extras or {})
        self.init_tool_groups([SearchToolGroup(), SandboxedPythonToolGroup()])
