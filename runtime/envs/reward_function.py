"""`reward_function`: each row scored by the user's own function, in verl's signature
(`compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)`, a float or a dict holding the
float under "score"), named by `environment.skyrl_gym.reward_function` as verl's `custom_reward_function` names it.

The function is the user's code, trusted as the trainer is: it runs in the trainer's process, not the sandbox. The
file is loaded once per process, from the text the compiler wrote into resolved.yaml (`source`) when there is one,
so a node needs no copy of it; tracebacks still name the file's own path and lines. A function that raises fails
the row with an error naming the file, the line and the exception.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class RewardFunctionError(RuntimeError):
    """The user's reward file does not load, lacks the function, or the function failed on a row."""


_LOADED: dict[tuple[str, str, int], Callable[..., Any]] = {}
_LOADING = threading.Lock()  # environments step on several threads


def load(path: str, name: str, source: str | None = None) -> Callable[..., Any]:
    """The function `name` of the file at `path` (its text `source` when given), loaded once per process."""
    key = (path, name, hash(source))
    with _LOADING:
        if key not in _LOADED:
            _LOADED[key] = _load(path, name, source)
        return _LOADED[key]


def _load(path: str, name: str, source: str | None) -> Callable[..., Any]:
    shown = str(Path(path).expanduser())
    if source is None:
        try:
            source = Path(shown).read_text(encoding="utf-8")
        except OSError as exc:
            raise RewardFunctionError(f"reward function file {shown}: {exc.strerror or exc}") from None
    namespace: dict[str, Any] = {"__name__": "rlc_reward_function", "__file__": shown}
    try:
        exec(compile(source, shown, "exec"), namespace)  # the user's own file, run as an import would run it
    except Exception as exc:
        raise RewardFunctionError(f"reward function file {_where(exc, shown)} failed to load: {_what(exc)}") from None
    fn = namespace.get(name)
    if not callable(fn):
        found = sorted(k for k, v in namespace.items() if callable(v) and not k.startswith("_"))
        raise RewardFunctionError(
            f"reward function file {shown} has no function {name!r} (it defines {', '.join(found) or 'none'})"
        )
    return fn


def score(
    fn: Callable[..., Any], path: str, row: dict, response: str, kwargs: dict, experiment_name: str | None = None
) -> tuple[float, dict]:
    """The reward of `response` for `row` (a verl row), and the dict's other entries when the function gives one;
    `experiment_name` joins the row's extra_info, as verl's gdpo reward manager adds it."""
    reward_model = row.get("reward_model") or row.get("reward_spec") or {}
    extra_info = row.get("extra_info")
    if experiment_name is not None:
        extra_info = {**(extra_info or {}), "experiment_name": experiment_name}
    try:
        result = fn(
            data_source=row.get("data_source", ""),
            solution_str=response,
            ground_truth=reward_model.get("ground_truth"),
            extra_info=extra_info,
            **kwargs,
        )
    except Exception as exc:
        shown = str(Path(path).expanduser())
        raise RewardFunctionError(f"the reward function raised at {_where(exc, shown)}: {_what(exc)}") from None
    extra = {}
    if isinstance(result, dict):
        if "score" not in result:
            raise RewardFunctionError(f"the reward function of {path} returned a dict without 'score': {result!r}")
        extra = {k: v for k, v in result.items() if k != "score"}
        result = result["score"]
    try:
        return float(result), extra
    except (TypeError, ValueError):
        raise RewardFunctionError(
            f"the reward function of {path} returned {result!r}: a number, or a dict with one under 'score'"
        ) from None


def _where(exc: BaseException, path: str) -> str:
    """`path:LINE`, the deepest line of the user's file in the exception's traceback (the file alone if none)."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if isinstance(exc, SyntaxError) and exc.filename == path and exc.lineno:
        lines.append(exc.lineno)
    return f"{path}:{lines[-1]}" if lines else path


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class RewardFunctionEnv(BaseTextEnv):
    """One turn: the response scored by the user's function against the row's reward_model.ground_truth."""

    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__()
        self.row = dict(extras or {})
        path = getattr(env_config, "path", None)
        if not path:
            raise RewardFunctionError("env_class reward_function needs environment.skyrl_gym.reward_function.path")
        self.path = str(path)
        self.kwargs = dict(getattr(env_config, "kwargs", None) or {})
        self.experiment_name = getattr(env_config, "experiment_name", None)
        self.fn = load(self.path, getattr(env_config, "name", "compute_score"), getattr(env_config, "source", None))

    def step(self, action: str) -> BaseTextEnvStepOutput:
        reward, extra = score(self.fn, self.path, self.row, action, self.kwargs, self.experiment_name)
        metadata = {"data_source": self.row.get("data_source", ""), **extra}
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)
