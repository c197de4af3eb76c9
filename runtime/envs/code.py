"""skyrl-gym's code environments with the model's code run in rlc's sandbox.

skyrl-gym runs generated code in a fork of the trainer (`lcb`: its test harness in a multiprocessing child) or as
`python -c` with the trainer's environment (`searchcode`'s python tool): either can read the job's secrets and
outlive its time limit. Here the same code and the same test harness run in `rlc.runtime.envs.sandbox` (own process,
time and memory limit, temporary directory, clean environment, nothing left running), so the rewards are SkyRL's
and the trainer is out of reach.
"""

from __future__ import annotations

import importlib.util
import json
import secrets
from typing import Any

from rlc.runtime.envs.sandbox import Limits, run_python
from skyrl_gym.envs.base_text_env import BaseTextEnvStepOutput
from skyrl_gym.envs.lcb.env import LCBEnv
from skyrl_gym.envs.lcb.livecodebench import extract_code_from_model, postprocess_lcb_sample
from skyrl_gym.envs.searchcode.env import SearchCodeEnv
from skyrl_gym.tools import SearchToolGroup
from skyrl_gym.tools.core import ToolGroup, tool

LCB_TEST_TIMEOUT_S = 6  # per test case, as skyrl-gym's lcb grader
PYTHON_TOOL_TIMEOUT_S = 10.0  # skyrl-gym's python tool default
MEMORY_MB = 1024

# Runs skyrl-gym's LiveCodeBench harness (loaded from its file, without the rest of the package) in the sandbox and
# prints the per-test results after a nonce the trainer sent on stdin, so the graded code cannot forge the line
# simply by printing. numpy and pandas are imported first, as they are in the trainer skyrl-gym forks its grader
# from: the harness's preamble imports them after its guard has disabled what their import needs.
_LCB_RUNNER = r"""
import importlib.util, json, sys
import numpy, pandas
request = json.loads(sys.stdin.readline())
spec = importlib.util.spec_from_file_location("rlc_lcb_grader", request["grader"])
grader = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grader)
nonce, write = request["nonce"], sys.__stdout__.write
results, _ = grader.run_test(request["sample"], test=request["code"], timeout=request["timeout"])
write("\n" + nonce + " " + json.dumps([r is True for r in results]) + "\n")
sys.__stdout__.flush()
"""


def _grader_path() -> str:
    found = importlib.util.find_spec("skyrl_gym.envs.lcb.livecodebench")
    assert found is not None and found.origin is not None, "skyrl-gym ships its lcb grader"
    return found.origin


def passes_tests(tests: list[dict], code: str, test_timeout_s: int = LCB_TEST_TIMEOUT_S) -> bool:
    """Whether `code` passes every LiveCodeBench test case (`tests` as in a row's reward_spec.ground_truth)."""
    if not tests:
        return False
    sample = postprocess_lcb_sample(tests)
    nonce = secrets.token_hex(16)
    request = {"grader": _grader_path(), "sample": sample, "code": code, "timeout": test_timeout_s, "nonce": nonce}
    # skyrl-gym's own global limit: every test's timeout plus a second, plus five.
    limit = Limits(seconds=(test_timeout_s + 1) * len(tests) + 5, memory_mb=MEMORY_MB)
    outcome = run_python(_LCB_RUNNER, stdin=json.dumps(request) + "\n", limits=limit)
    lines = outcome.stdout.rstrip("\n").rsplit("\n", 1)
    last = lines[-1] if lines else ""
    if outcome.timed_out or not last.startswith(nonce + " "):
        return False
    results = json.loads(last[len(nonce) + 1 :])
    return len(results) == len(tests) and all(results)


class SandboxedLCBEnv(LCBEnv):
    """skyrl-gym's `lcb`: reward 1 when the last code block of the response passes every test case."""

    def step(self, action: str) -> BaseTextEnvStepOutput:
        code = extract_code_from_model(action)
        reward = 1.0 if code is not None and passes_tests(self.tests, code) else 0.0
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={"parsed_code": code})


class SandboxedPythonToolGroup(ToolGroup):
    """skyrl-gym's python tool (same name, tool and messages), run in the sandbox."""

    def __init__(self, timeout: float = PYTHON_TOOL_TIMEOUT_S):
        self.timeout = timeout
        super().__init__(name="PythonCodeExecutorToolGroup")

    @tool
    def python(self, code: str) -> str:
        outcome = run_python(code, limits=Limits(seconds=self.timeout, memory_mb=MEMORY_MB))
        if outcome.timed_out:
            return f"Error executing Python code: Execution timed out after {self.timeout} seconds."
        if outcome.stderr:
            return f"Error executing Python code: {outcome.stderr.strip()}"
        return outcome.stdout.strip()


class SandboxedSearchCodeEnv(SearchCodeEnv):
    """skyrl-gym's `searchcode` (search and python tools) with the python tool in the sandbox."""

    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__(env_config, extras or {})
        self.init_tool_groups([SearchToolGroup(), SandboxedPythonToolGroup()])
