"""Rollouts on SkyRL-Gym environments, over as many turns as the environment takes (SkyRL's generator).

Per trajectory: its environment is made for its dataset row and `init` gives the first prompt; then, turn by turn,
the engine samples a response, the environment's `step(text)` answers with observations, a reward and whether it
is done, and the observations join the context; until done, `generator.max_turns` turns, or a context longer than
`generator.max_input_length`. All trajectories take a turn together: one batched `generate` call per engine per
turn (the first samples each prompt's n trajectories at once, as single-turn rollouts always have), and the
environments step in parallel on `environment.skyrl_gym.max_env_workers` threads. An environment that raises, or
does not answer within `env_timeout_s`, ends its trajectory with an `env_error` (and no loss), not the run.

What a trajectory trains on (token in, token out: the sampled ids are kept, never re-tokenized text):
- the response is everything after the prompt up to the last model token: the model's turns and the observations;
- the loss mask is 1 on the model's tokens only (0 on observations, and on an EOS appended after a stop string);
- each turn's reward sits on the turn's last model token; the engine's log-probs are kept per token (0 elsewhere);
- with `step_wise_trajectories` every turn is a row of its own (prompt = the context before the turn);
- with a custom chat template the conversation is re-templated every turn and the loss mask is the template's
  `{% generation %}` blocks (no log-probs, the last turn's reward), as SkyRL does.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import skyrl_gym
from rlc.core.job import GeneratorSettings
from rlc.runtime.algorithms.shaping import overlong_penalty
from rlc.runtime.batch import Rollout, trajectory_reward
from rlc.runtime.chat import Templater
from rlc.runtime.envs import gym

ERROR_CHARS = 300


class Engines(Protocol):
    """Where the generator's turns are sampled: the job's engines, behind one call."""

    def submit(
        self, prompts: list[list[int]], sampling: Any, n: int, key: tuple[int, int, int], groups: list[int], count: int
    ) -> Any:
        """Start sampling `n` completions of each prompt; `key` (step, draw, turn) seeds it, and `groups` (each
        prompt's group among `count`) keeps a trajectory's turns on one engine (its cached prefix). Returns a
        handle."""
        ...

    def result(self, handle: Any) -> list[list[Any]]:
        """The completions (token_ids, logprobs, finish_reason) of a submitted call, in prompt order."""
        ...


@dataclass
class _Step:
    """One turn as its own training row (step_wise_trajectories)."""

    prompt_ids: list[int]
    response_ids: list[int]
    mask: list[float]
    logprobs: list[float] | None
    reward: float
    reward_at: int
    finish_reason: str
    routes: Any = None  # the turn's routed experts: its prompt's, then its response's (routing replay)


@dataclass
class _Turn:
    """A sampled turn on its way through the environment."""

    trajectory: _Trajectory
    out: list[int]
    logprobs: list[float] | None
    text: str
    added_eos: bool
    finish_reason: str
    result: dict = field(default_factory=dict)
    correct: bool | None = None
    routes: Any = None  # the completion's routed experts (routing replay): the call's prompt, then the turn


@dataclass
class _Trajectory:
    group: int
    row: dict
    env_class: str
    prompt_ids: list[int]
    env: Any = None
    chat: list = field(default_factory=list)  # the conversation (messages), for the custom-template path
    first_chat: int = 0  # messages of the prompt
    ids: list[int] = field(default_factory=list)  # the whole context: prompt, then every turn and observation
    mask: list[float] = field(default_factory=list)  # aligned with ids[len(prompt_ids):]
    logprobs: list[float] | None = field(default_factory=list)
    rewards: list[tuple[float, int]] = field(default_factory=list)  # (turn reward, index in ids of its last token)
    end: int = -1  # index in ids of the last model token
    finish_reason: str = "stop"
    turns: int = 0
    done: bool = False
    error: str | None = None
    correct: bool | None = None
    last_observations: list = field(default_factory=list)
    steps: list[_Step] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    components: dict = field(default_factory=dict)  # the last step's numeric metadata
    # The last turn's routed experts (routing replay): its prompt is the whole context so far, so they cover every
    # token of the trajectory up to that turn's last but one
    routes: Any = None


def _numbers(metadata: Any) -> dict[str, float]:
    """A step's metadata entries that are numbers (a reward function's components: gdpo_reward_keys)."""
    if not isinstance(metadata, dict):
        return {}
    return {str(k): float(v) for k, v in metadata.items() if isinstance(v, (int, float))}


class Generator:
    """Trajectories for a batch of rows: `start` samples the first turn, `finish` takes the remaining turns."""

    def __init__(self, settings: GeneratorSettings, gym_config, tokenizer, templater: Templater, engines: Engines):
        self.s, self.tok, self.tpl, self.engines = settings, tokenizer, templater, engines
        self.gym_config = gym_config  # environment.skyrl_gym, which every environment takes whole
        self.eos = tokenizer.eos_token_id
        self.workers = EnvWorkers(settings.env_workers, settings.env_timeout_s)
        self.retokenize = settings.conversation and templater.custom is not None
        # Held while tokenizing: fully async runs `finish` on other threads than the driver's.
        self.tokenizing = threading.Lock()

    def run(
        self, rows: Sequence[tuple[dict, list[int]]], sampling, n: int, key: tuple[int, int], evaluation: bool = False
    ) -> list[Rollout]:
        """`rows`' trajectories, n each; a training batch's with their greedy baselines when the job's estimator
        reads them (an evaluation's train nothing)."""
        rollouts = self.finish(self.start(rows, sampling, n, key))
        if self.s.greedy_baseline and not evaluation:
            baselines = self.greedy_rewards(rows, sampling, key)
            for r in rollouts:
                r.baseline = baselines[r.group]
        return rollouts

    def greedy_rewards(self, rows: Sequence[tuple[dict, list[int]]], sampling, key: tuple[int, int]) -> list[float]:
        """Each row's reward for one greedy response (temperature 0), on its environment over as many turns as it
        takes: the baseline ReMax measures the sampled responses against (`greedy_baseline`)."""
        rewards = [0.0] * len(rows)
        for r in self.finish(self.start(rows, dataclasses.replace(sampling, temperature=0.0), 1, key)):
            if r.last_step:
                rewards[r.group] = trajectory_reward(r)
        return rewards

    def start(self, rows: Sequence[tuple[dict, list[int]]], sampling, n: int, key: tuple[int, int]) -> _Pending:
        """Make each trajectory's environment and submit the first turn (every prompt's n samples in one call)."""
        trajs = [
            _Trajectory(group, row, row.get("env_class") or self.s.default_env, list(ids))
            for group, (row, ids) in enumerate(rows)
            for _ in range(n)
        ]
        opened = self.workers.map(self._open, trajs)
        with self.tokenizing:
            for t, (_, err) in zip(trajs, opened):
                if err is not None:
                    self._fail(t, err)
                else:
                    self._first_context(t)
        first = [trajs[i * n].ids if not trajs[i * n].error else rows[i][1] for i in range(len(rows))]
        shared = all(t.error or t.ids == first[t.group] for t in trajs)
        count = len(rows)
        if shared:  # the usual case: init left the prompt as it was, or changed it alike for every sample
            handle = self.engines.submit([list(p) for p in first], sampling, n, (*key, 0), list(range(count)), count)
        else:
            handle = self.engines.submit(
                [t.ids for t in trajs], sampling, 1, (*key, 0), [t.group for t in trajs], count
            )
        return _Pending(trajs, handle, shared, n, sampling, key, count)

    def finish(self, pending: _Pending) -> list[Rollout]:
        trajs, sampling = pending.trajectories, pending.sampling
        outputs = self.engines.result(pending.handle)
        completions = [c for group in outputs for c in group] if pending.shared else [g[0] for g in outputs]
        live = trajs
        number = 0  # of the turn being taken
        while True:
            with self.tokenizing:
                turns = [self._sampled(t, c, sampling) for t, c in zip(live, completions) if not t.done]
            answered = self.workers.map(self._step, turns)
            with self.tokenizing:
                for turn, (_, err) in zip(turns, answered):
                    if err is not None:
                        self._fail(turn.trajectory, err)
                    else:
                        self._advance(turn)
            number += 1
            live = [t for t in trajs if not t.done]
            with self.tokenizing:
                for t in live:
                    if t.turns >= (1 if self.s.batched else self.s.max_turns):
                        t.done = True
                        continue
                    if self.retokenize or self.s.step_wise:  # the next input is the conversation, templated again
                        t.ids = self.tpl.prompt_ids(t.chat, custom=self.retokenize)
                    if len(t.ids) > self.s.max_input_length:
                        t.done, t.finish_reason = True, "length"
            live = [t for t in live if not t.done]
            if not live:
                break
            groups = [t.group for t in live]
            handle = self.engines.submit(
                [t.ids for t in live], sampling, 1, (*pending.key, number), groups, pending.count
            )
            completions = [g[0] for g in self.engines.result(handle)]
        for t in trajs:
            t.metrics = self._env_metrics(t)
        self.workers.map(_close, [t for t in trajs if t.env is not None])
        with self.tokenizing:
            return [r for t in trajs for r in self._rollouts(t)]

    # -- one trajectory ------------------------------------------------------------------------------------

    def _open(self, t: _Trajectory) -> None:
        """Make the trajectory's environment and let it give the first prompt (on a worker thread)."""
        t.env = gym.make(t.env_class, self.gym_config, gym_extras(t.row, self.s.max_turns))
        chat, _ = t.env.init(_copy(t.row.get("prompt")))
        if (self.retokenize or self.s.step_wise) and not isinstance(chat, list):
            raise ValueError("step_wise_trajectories and a custom chat template need chat prompts (lists of messages)")
        t.chat = chat

    def _first_context(self, t: _Trajectory) -> None:
        """The first turn's input ids: the row's own unless `init` changed the prompt."""
        chat = t.chat
        t.chat = list(chat) if isinstance(chat, list) else []
        t.first_chat = len(t.chat)
        if self.retokenize:
            t.prompt_ids = self.tpl.prompt_ids(t.chat, generation_prompt=False, custom=True)
            t.ids = self.tpl.prompt_ids(t.chat, custom=True)
            return
        if chat != t.row.get("prompt"):
            t.prompt_ids = self.tpl.prompt_ids(chat)
        t.ids = list(t.prompt_ids)

    def _sampled(self, t: _Trajectory, c, sampling) -> _Turn:
        """A turn's completion as the environment gets it, with the EOS appended after a stop string."""
        out = list(c.token_ids)
        logprobs = list(c.logprobs) if c.logprobs is not None else None
        text = self.tok.decode(out, skip_special_tokens=True)
        added_eos = False
        if (
            sampling.stop
            and self.s.conversation
            and self.s.append_eos_after_stop
            and not self.s.batched
            and text.endswith(tuple(sampling.stop))
            and (not out or out[-1] != self.eos)
        ):
            out.append(self.eos)
            if logprobs is not None:
                logprobs.append(0.0)
            added_eos = True
        return _Turn(t, out, logprobs, text, added_eos, c.finish_reason, routes=c.routed_experts)

    @staticmethod
    def _step(turn: _Turn) -> None:
        """The environment's answer to a turn (on a worker thread: environments may wait on tools and services)."""
        env = turn.trajectory.env
        step = getattr(env, "step_finished", None)
        turn.result = step(turn.text, turn.finish_reason == "stop") if step is not None else env.step(turn.text)
        if turn.result.get("done"):
            judge = getattr(env, "correct", None)
            turn.correct = bool(judge(turn.text)) if judge is not None else None

    def _advance(self, turn: _Turn) -> None:
        """The trajectory after a turn: its context, loss mask, log-probs and rewards (tokenizing happens here, on
        one thread)."""
        t, out, logprobs = turn.trajectory, turn.out, turn.logprobs
        observations = list(turn.result.get("observations") or [])
        reward, t.done = float(turn.result.get("reward") or 0.0), bool(turn.result.get("done"))
        t.components = _numbers(turn.result.get("metadata"))
        t.turns += 1
        t.finish_reason = turn.finish_reason
        t.last_observations = observations
        t.routes = turn.routes
        t.correct = turn.correct
        if t.first_chat:  # chat prompts: the conversation goes on with the response and the observations
            t.chat = [*t.chat, {"role": "assistant", "content": turn.text}, *observations]
        if self.retokenize:
            t.rewards.append((reward, -1))
            return
        obs = self.tpl.observation_ids(observations, t.done, self.s.conversation)
        turn_mask = [1.0] * len(out)
        if turn.added_eos:
            turn_mask[-1] = 0.0
        if not self.s.conversation and out and out[-1] == self.eos:
            out, turn_mask = out[:-1], turn_mask[:-1]  # the turn continues in the same assistant message
            logprobs = logprobs[: len(out)] if logprobs is not None else None
        if self.s.step_wise:
            t.steps.append(
                _Step(
                    list(t.ids),
                    out + obs,
                    turn_mask + [0.0] * len(obs),
                    logprobs + [0.0] * len(obs) if logprobs is not None else None,
                    reward,
                    len(out) - 1,
                    turn.finish_reason,
                    turn.routes,
                )
            )
        t.end = len(t.ids) + len(out) - 1
        t.ids = t.ids + out + obs
        t.mask += turn_mask + [0.0] * len(obs)
        if t.logprobs is not None and logprobs is not None:
            t.logprobs += logprobs + [0.0] * len(obs)
        else:
            t.logprobs = None
        t.rewards.append((reward, t.end))

    def _fail(self, t: _Trajectory, error: str) -> None:
        t.done, t.error = True, error
        if t.finish_reason == "stop":
            t.finish_reason = "error"

    # -- what trains ----------------------------------------------------------------------------------------

    @staticmethod
    def _env_metrics(t: _Trajectory) -> dict:
        if t.env is None or t.error is not None:
            return {}
        try:
            return dict(t.env.get_metrics() or {})
        except Exception:  # metrics are a report: an environment failing to give them costs nothing else
            return {}

    def _rollouts(self, t: _Trajectory) -> list[Rollout]:
        if self.s.step_wise and t.steps:
            return self._step_rows(t)
        if self.retokenize and t.turns:
            tail = len(t.chat) - len(t.last_observations)
            templated, generated = self.tpl.assistant_tokens(t.chat[t.first_chat : tail])
            rewards = [0.0] * len(templated)
            if templated:
                rewards[-1] = t.rewards[-1][0]
            return [self._rollout(t, t.prompt_ids, templated, [float(m) for m in generated], None, rewards)]
        plen = len(t.prompt_ids)
        cut = max(t.end + 1, plen)
        response, mask = t.ids[plen:cut], t.mask[: cut - plen]
        logprobs = t.logprobs[: cut - plen] if t.logprobs is not None else None
        appended = False
        ended = t.finish_reason not in ("length", "error")
        if not self.s.conversation and ended and response and response[-1] != self.eos:
            response, mask = response + [self.eos], mask + [1.0]
            logprobs = logprobs + [0.0] if logprobs is not None else None
            appended = True
        rewards = [0.0] * len(response)
        for i, (reward, at) in enumerate(t.rewards):
            at = max(at - plen, 0)
            if at >= len(response):
                break
            rewards[len(response) - 1 if appended and i == len(t.rewards) - 1 else at] += reward
        return [self._rollout(t, t.prompt_ids, response, mask, logprobs, rewards, routes=t.routes)]

    def _step_rows(self, t: _Trajectory) -> list[Rollout]:
        rows = []
        for k, s in enumerate(t.steps):
            rewards = [0.0] * len(s.response_ids)
            if s.response_ids:
                rewards[max(s.reward_at, 0)] = s.reward
            row = self._rollout(
                t, s.prompt_ids, s.response_ids, s.mask, s.logprobs, rewards, s.finish_reason, routes=s.routes
            )
            row.last_step = k == len(t.steps) - 1
            rows.append(row)
        return rows

    def _rollout(self, t, prompt_ids, response, mask, logprobs, rewards, finish_reason=None, routes=None) -> Rollout:
        """A training row; `routes` (routing replay) are the routed experts of its first tokens, or None."""
        finish_reason = finish_reason or t.finish_reason
        zeroed = self.s.zero_reward_on_non_stop and finish_reason != "stop" and any(rewards)
        if zeroed:
            rewards = [0.0] * len(rewards)
        buffer = self.s.overlong_buffer
        if buffer is not None and response:  # after the zeroing, as SkyRL's main_dapo shapes the generator's output
            rewards = list(rewards)
            rewards[-1] += overlong_penalty(
                len(response), buffer.max_response_length, buffer.length, buffer.penalty_factor
            )
        clip = self.s.reward_clip
        if clip is not None:  # after the penalty, as AReaL's actor clips after its overlong penalty
            rewards = [min(max(r, -clip), clip) for r in rewards]
        if t.error is not None:
            mask = [0.0] * len(mask)  # the environment failed, not the model: nothing of it trains
        return Rollout(
            prompt_ids=list(prompt_ids),
            response_ids=list(response),
            logprobs=list(logprobs) if logprobs is not None else None,
            finish_reason=finish_reason,
            reward=sum(rewards),
            group=t.group,
            zeroed=zeroed,
            loss_mask=list(mask),
            token_rewards=rewards,
            turns=t.turns,
            env_class=t.env_class,
            env_error=t.error,
            correct=t.correct,
            env_metrics=t.metrics,
            reward_components=dict(t.components),
            routed_experts=_routes_within(routes, len(prompt_ids) + len(response)),
        )


@dataclass
class _Pending:
    trajectories: list[_Trajectory]
    handle: Any
    shared: bool  # the first turn was submitted as one prompt per group with n samples
    n: int
    sampling: Any
    key: tuple[int, int]
    count: int  # groups (rows) in the batch


def _routes_within(routes, tokens: int):
    """A row's routes cut to its tokens: a trajectory cut short (max_input_length) ends before its last call's
    prompt does."""
    return routes[:tokens] if routes is not None and routes.shape[0] > tokens else routes


def gym_extras(row: dict, max_turns: int) -> dict:
    """What SkyRL hands an environment besides its config: every column of the row but the prompt and env_class,
    and `max_turns`. A row in rlc's short form ({prompt, answer}) gets its answer as `reward_spec.ground_truth`."""
    extras = {k: _copy(v) for k, v in row.items() if k not in ("prompt", "env_class")}
    if extras.get("reward_spec") is None and extras.get("answer") is not None:
        extras["reward_spec"] = {"method": "rule", "ground_truth": str(extras["answer"])}
    extras["max_turns"] = max_turns
    return extras


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _close(t: _Trajectory) -> None:
    t.env.close()


def describe(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:ERROR_CHARS]


class EnvWorkers:
    """Environment calls on daemon threads, at most `workers` at a time, each given `timeout_s` seconds.

    A call that runs past its time is reported and its slot given to the next; its thread cannot be stopped and
    runs on in the background (a daemon, so it never holds up the process's exit).
    """

    def __init__(self, workers: int, timeout_s: float):
        self.slots = threading.Semaphore(max(1, workers))
        self.timeout_s = timeout_s

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[tuple[Any, str | None]]:
        count = len(items)
        out: list[Any] = [None] * count
        errors: list[str | None] = [None] * count
        started: list[float | None] = [None] * count
        finished = [threading.Event() for _ in range(count)]
        released = [False] * count
        lock = threading.Lock()

        def release(i: int) -> None:
            with lock:
                if not released[i]:
                    released[i] = True
                    self.slots.release()

        def work(i: int) -> None:
            self.slots.acquire()
            started[i] = time.monotonic()
            try:
                out[i] = fn(items[i])
            except Exception as exc:
                errors[i] = describe(exc)
            finally:
                release(i)
                finished[i].set()

        for i in range(count):
            threading.Thread(target=work, args=(i,), daemon=True, name=f"rlc-env-{i}").start()
        results: list[tuple[Any, str | None]] = []
        for i in range(count):
            while not finished[i].wait(0.05):
                begun = started[i]
                if begun is not None and time.monotonic() - begun > self.timeout_s:
                    release(i)
                    break
            if finished[i].is_set():
                results.append((out[i], errors[i]))
            else:
                results.append((None, f"TimeoutError: no answer within {self.timeout_s:g} s"))
        return results


def rollout_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """Per-step figures of the trajectories (a step-wise trajectory counted once, on its last row): turns, the
    share whose environment failed, and each environment's own metrics (`environment/<key>`, aggregated by the
    environment class as SkyRL does)."""
    last = [r for r in rollouts if r.last_step]
    if not last:
        return {}
    out = {
        "env/turns": sum(r.turns for r in last) / len(last),
        "env/error_fraction": sum(r.env_error is not None for r in last) / len(last),
    }
    by_env: dict[str, list[dict]] = {}
    for r in last:
        if r.env_error is None:
            by_env.setdefault(r.env_class, []).append(r.env_metrics or {})
    for env_class, metrics in sorted(by_env.items()):
        try:
            creator = skyrl_gym.registry[env_class].entry_point
            cls = skyrl_gym.envs.registration.load_env_creator(creator) if isinstance(creator, str) else creator
            aggregated = cls.aggregate_metrics(metrics) if hasattr(cls, "aggregate_metrics") else {}
        except Exception:
            aggregated = {}
        for k, v in aggregated.items():
            if isinstance(v, (int, float)):
                out[f"environment/{k}"] = float(v)
    return out
