"""`llm_as_a_judge`: a GSM8K-style answer graded by another model behind an OpenAI-compatible API.

SkyRL ships this environment with its LLM-judge example (not in skyrl-gym); rlc registers its own under the same
id and settings (`environment.skyrl_gym.llm_as_a_judge`: `model`, `base_url`), so that example's jobs run. The key
is read from OPENAI_API_KEY on the node (the compiler refuses a job that does not pass it). One turn: the judge sees
the reference solution and the response and ends its reply with `Score: 1` or `Score: 0`; a judge that cannot be
reached, or answers otherwise, gives 0 and says why in the step's metadata.
"""

from __future__ import annotations

import os
import re
from typing import Any

import requests
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

OPENAI_URL = "https://api.openai.com/v1"
KEY_VARIABLE = "OPENAI_API_KEY"
TIMEOUT_S = 60
_SCORE = re.compile(r"score\s*:\s*([01])(?:\.0+)?\s*$", re.IGNORECASE)

INSTRUCTIONS = (
    "You grade a student's solution to a math word problem against the reference solution.\n"
    "Give 1 only if the student's last line has the form `#### <number>` and that number equals the final answer of "
    "the reference solution; otherwise give 0. Reason briefly if you need to, then end with a line that reads "
    "`Score: 1` or `Score: 0` and nothing after it."
)


def judge_score(reply: str) -> float | None:
    """The grade at the end of the judge's reply, or None when it gave none."""
    match = _SCORE.search(reply.strip())
    return float(match.group(1)) if match else None


class LLMJudgeEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__()
        extras = extras or {}
        if "ground_truth" not in (extras.get("reward_spec") or {}):
            raise ValueError("llm_as_a_judge needs the row's reward_spec.ground_truth (the reference solution)")
        self.reference = str(extras["reward_spec"]["ground_truth"])
        self.key = os.environ.get(KEY_VARIABLE)
        if not self.key:
            raise ValueError(f"llm_as_a_judge needs {KEY_VARIABLE} on the node (launch.secrets)")
        self.model = getattr(env_config, "model", "gpt-4o-mini")
        self.url = (getattr(env_config, "base_url", None) or OPENAI_URL).rstrip("/") + "/chat/completions"

    def step(self, action: str) -> BaseTextEnvStepOutput:
        question = f"{INSTRUCTIONS}\n\nReference solution:\n{self.reference}\n\nStudent's solution:\n{action}"
        body = {"model": self.model, "messages": [{"role": "user", "content": question}]}
        try:
            reply = requests.post(
                self.url, json=body, headers={"Authorization": f"Bearer {self.key}"}, timeout=TIMEOUT_S
            )
            reply.raise_for_status()
            text = reply.json()["choices"][0]["message"]["content"] or ""
        except (requests.RequestException, KeyError, IndexError, TypeError, ValueError) as exc:
            return BaseTextEnvStepOutput(observations=[], reward=0.0, done=True, metadata={"judge_error": str(exc)})
        score = judge_score(text)
        metadata = {} if score is not None else {"judge_error": f"no score in the judge's reply: {text[-200:]!r}"}
        return BaseTextEnvStepOutput(observations=[], reward=score or 0.0, done=True, metadata=metadata)
