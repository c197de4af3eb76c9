"""Multi-turn rollouts with SkyRL's semantics: a real (tiny) model sampling in-process, real SkyRL-Gym environments
(skyrl-gym's, rlc's and one registered here as a user would), and what each trajectory trains on."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("skyrl_gym")
pytest.importorskip("transformers")

import skyrl_gym  # noqa: E402
from rlc.core.job import GeneratorSettings, Sampling, seed_for  # noqa: E402
from rlc.runtime.chat import Templater  # noqa: E402
from rlc.runtime.envs import gym  # noqa: E402
from rlc.runtime.generator import Generator, rollout_metrics  # noqa: E402
from rlc.spec.generation import SkyRLGymConfig  # noqa: E402
from skyrl_gym.envs.base_text_env import BaseTextEnv  # noqa: E402

SAMPLING = Sampling(max_generate_length=6, temperature=1.0)


class Countdown(BaseTextEnv):
    """Answers turn k with the observation "obs k" and reward k/10, and is done after `turns` turns (a row's extra
    field). `fail_at` makes turn k raise; `sleep` makes every step wait; concurrent steps of a `tag` are counted."""

    active: dict = {}
    most: dict = {}
    lock = threading.Lock()

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        extras = extras or {}
        self.limit = int(extras.get("turns", 3))
        self.fail_at = extras.get("fail_at")
        self.sleep = float(extras.get("sleep", 0))
        self.tag = extras.get("tag")

    def step(self, action):
        with Countdown.lock:
            Countdown.active[self.tag] = Countdown.active.get(self.tag, 0) + 1
            Countdown.most[self.tag] = max(Countdown.most.get(self.tag, 0), Countdown.active[self.tag])
        try:
            time.sleep(self.sleep)
            self.turns += 1
            if self.fail_at == self.turns:
                raise RuntimeError("the tool broke")
            done = self.turns >= self.limit
            obs = [] if done else [{"role": "user", "content": f"obs {self.turns}"}]
            return {"observations": obs, "reward": self.turns / 10, "done": done, "metadata": {}}
        finally:
            with Countdown.lock:
                Countdown.active[self.tag] -= 1

    def get_metrics(self):
        return {"steps": self.turns}


@pytest.fixture(scope="module", autouse=True)
def countdown_registered():
    gym.ensure_registered()
    skyrl_gym.register(id="countdown_test", entry_point=Countdown)
    yield
    skyrl_gym.envs.registration.deregister("countdown_test")


class RecordingEngines:
    """The generator's engines: an in-process hf engine; every call and its completions are kept."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def submit(self, prompts, sampling, n, key, groups, count):
        step, draw, turn = key
        out = self.engine.generate(prompts, sampling, n, seed_for(7, step, draw * 1000 + turn * 100_000))
        self.calls.append((prompts, n, out))
        return out

    def result(self, handle):
        return handle


@pytest.fixture(scope="module")
def model(tiny_chat_model):
    from rlc.runtime.inference.hf import HFEngine
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    engine = HFEngine(tiny_chat_model, tokenizer=tok, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return tok, engine


def generator(model, *, custom: str | None = None, **settings):
    tok, engine = model
    engines = RecordingEngines(engine)
    defaults = dict(default_env="countdown_test", max_turns=5, max_input_length=4096)
    return (
        Generator(
            GeneratorSettings(**{**defaults, **settings}), SkyRLGymConfig(), tok, Templater(tok, custom), engines
        ),
        engines,
    )


def rows(tok, *extras: dict, prompt: str = "what is 2 plus 3?"):
    tpl = Templater(tok)
    out = []
    for extra in extras:
        row = {"prompt": [{"role": "user", "content": prompt}], **extra}
        out.append((row, tpl.prompt_ids(row["prompt"])))
    return out


def test_turns_are_appended_token_in_token_out_and_only_the_models_tokens_train(model):
    tok, _ = model
    gen, engines = generator(model)
    rollouts = gen.run(rows(tok, {"turns": 3}, {"turns": 2}), SAMPLING, 2, (1, 0))
    tpl = Templater(tok)
    assert [r.turns for r in rollouts] == [3, 3, 2, 2]
    first, later = engines.calls[0], engines.calls[1:]
    assert first[1] == 2 and len(first[0]) == 2  # the first turn samples each prompt's two trajectories at once
    outputs = [[c for group in first[2] for c in group]] + [[g[0] for g in call[2]] for call in later]
    for i, r in enumerate(rollouts):
        live = [i] + [sum(t.turns > k for t in rollouts[:i]) for k in range(1, r.turns)]
        turns = [outputs[k][live[k]] for k in range(r.turns)]
        response, mask, logprobs, rewards = [], [], [], []
        for k, c in enumerate(turns):
            done = k == r.turns - 1
            obs = [] if done else tpl.observation_ids([{"role": "user", "content": f"obs {k + 1}"}], False, True)
            if k:  # the context the engine continued is the prompt and everything so far, token for token
                assert later[k - 1][0][live[k]] == r.prompt_ids + response
            response += c.token_ids + obs
            mask += [1.0] * len(c.token_ids) + [0.0] * len(obs)
            logprobs += c.logprobs + [0.0] * len(obs)
            rewards += [0.0] * (len(c.token_ids) - 1) + [(k + 1) / 10] + [0.0] * len(obs)
        assert r.response_ids == response
        assert r.loss_mask == mask
        assert r.logprobs == pytest.approx(logprobs)
        assert r.token_rewards == pytest.approx(rewards)  # each turn's reward on its last model token
        assert r.reward == pytest.approx(sum(k / 10 for k in range(1, r.turns + 1)))
    assert rollout_metrics(rollouts)["env/turns"] == 2.5
    assert rollout_metrics(rollouts)["environment/steps"] == 2.5  # the environment's own metrics


def test_without_conversation_turns_continue_one_assistant_message(model):
    tok, _ = model
    gen, engines = generator(model, conversation=False)
    rollouts = gen.run(rows(tok, {"turns": 2}), SAMPLING, 4, (1, 0))
    obs = tok("obs 1", add_special_tokens=False).input_ids
    for k, r in enumerate(rollouts):
        one, two = engines.calls[0][2][0][k], engines.calls[1][2][k][0]
        out = one.token_ids[:-1] if one.token_ids[-1] == tok.eos_token_id else one.token_ids  # EOS taken out
        tail = two.token_ids
        expected = out + obs + tail
        if two.finish_reason == "stop" and tail[-1] != tok.eos_token_id:
            expected = expected + [tok.eos_token_id]
        assert r.response_ids == expected
        assert r.loss_mask == [1.0] * len(out) + [0.0] * len(obs) + [1.0] * (len(expected) - len(out) - len(obs))


def test_an_eos_follows_a_stop_string_and_does_not_train(model):
    tok, _ = model
    gen, engines = generator(model)
    stop = Sampling(max_generate_length=12, temperature=1.0, stop=("e",))
    rollouts = gen.run(rows(tok, *[{"turns": 2}] * 4), stop, 4, (2, 0))
    appended = 0
    for r in rollouts:
        for j, token in enumerate(r.response_ids):
            if token == tok.eos_token_id and r.loss_mask[j] == 0.0 and j and r.loss_mask[j - 1] == 1.0:
                appended += 1
                assert tok.decode(r.response_ids[:j], skip_special_tokens=True).endswith("e")
                assert r.logprobs[j] == 0.0
    assert appended > 0


def test_a_context_over_max_input_length_ends_the_trajectory(model):
    tok, _ = model
    prompt_len = len(rows(tok, {})[0][1])
    gen, _ = generator(model, max_input_length=prompt_len + 8)
    rollouts = gen.run(rows(tok, {"turns": 5}), SAMPLING, 2, (1, 0))
    assert all(r.turns == 1 and r.finish_reason == "length" for r in rollouts)


def test_max_turns_caps_an_environment_that_never_ends(model):
    tok, _ = model
    gen, _ = generator(model, max_turns=2)
    assert all(r.turns == 2 for r in gen.run(rows(tok, {"turns": 99}), SAMPLING, 2, (1, 0)))


def test_step_wise_rows_are_turns_whose_prompts_are_the_templated_conversation(model):
    tok, _ = model
    gen, engines = generator(model, step_wise=True)
    rollouts = gen.run(rows(tok, {"turns": 3}), SAMPLING, 1, (1, 0))
    assert [r.last_step for r in rollouts] == [False, False, True]
    tpl = Templater(tok)
    chat = [{"role": "user", "content": "what is 2 plus 3?"}]
    for k, r in enumerate(rollouts):
        c = engines.calls[k][2][0][0]
        assert r.prompt_ids == tpl.prompt_ids(chat)  # the conversation so far, templated again
        obs = [] if r.last_step else [{"role": "user", "content": f"obs {k + 1}"}]
        obs_ids = tpl.observation_ids(obs, r.last_step, True)
        assert r.response_ids == c.token_ids + obs_ids
        assert r.loss_mask == [1.0] * len(c.token_ids) + [0.0] * len(obs_ids)
        assert r.token_rewards[len(c.token_ids) - 1] == pytest.approx((k + 1) / 10) and r.reward == pytest.approx(
            (k + 1) / 10
        )
        chat = [*chat, {"role": "assistant", "content": tok.decode(c.token_ids, skip_special_tokens=True)}, *obs]


def test_a_custom_template_retemplates_the_conversation_and_masks_its_generation_blocks(model):
    from conftest import TINY_CHAT_TEMPLATE

    tok, _ = model
    gen, _ = generator(model, custom=TINY_CHAT_TEMPLATE)
    rollouts = gen.run(rows(tok, {"turns": 2}), SAMPLING, 2, (1, 0))
    tpl = Templater(tok, TINY_CHAT_TEMPLATE)
    for r in rollouts:
        assert r.prompt_ids == tpl.prompt_ids(rows(tok, {})[0][0]["prompt"], generation_prompt=False, custom=True)
        assert r.logprobs is None  # re-templated text has no engine log-probs
        assert sum(r.loss_mask) > 0 and r.loss_mask[0] == 0.0  # the turn's '<bos>assistant: ' is the template's
        assert r.token_rewards[-1] == pytest.approx(0.2) and sum(r.token_rewards) == pytest.approx(0.2)


def test_an_environment_that_raises_ends_only_its_trajectory(model):
    tok, _ = model
    gen, _ = generator(model)
    rollouts = gen.run(rows(tok, {"turns": 3, "fail_at": 2}, {"turns": 2}), SAMPLING, 2, (1, 0))
    broken, fine = rollouts[:2], rollouts[2:]
    assert all(r.env_error == "RuntimeError: the tool broke" and not any(r.loss_mask) for r in broken)
    assert all(r.env_error is None and r.turns == 2 and any(r.loss_mask) for r in fine)
    assert rollout_metrics(rollouts)["env/error_fraction"] == 0.5


def test_an_environment_that_hangs_times_out(model):
    tok, _ = model
    gen, _ = generator(model, env_timeout_s=0.3)
    rollouts = gen.run(rows(tok, {"turns": 1, "sleep": 5}, {"turns": 1}), SAMPLING, 1, (1, 0))
    assert rollouts[0].env_error == "TimeoutError: no answer within 0.3 s"
    assert rollouts[1].env_error is None and rollouts[1].reward == pytest.approx(0.1)


def test_environments_step_in_parallel_up_to_max_env_workers(model):
    tok, _ = model
    gen, _ = generator(model, env_workers=3)
    gen.run(rows(tok, {"turns": 1, "sleep": 0.2, "tag": "parallel"}), SAMPLING, 8, (1, 0))
    assert Countdown.most["parallel"] == 3


def test_each_row_steps_its_own_environment(model):
    tok, _ = model
    from rlc.runtime.envs.synthetic import CopyDigit

    gen, _ = generator(model)
    batch = [
        ({"prompt": "copy the digit 7:", "answer": "7", "env_class": "synthetic"}, tok("copy the digit 7:").input_ids),
        *rows(tok, {"env_class": "gsm8k", "reward_spec": {"ground_truth": "5"}}),
        *rows(tok, {"turns": 2}),  # no env_class: environment.env_class
    ]
    rollouts = gen.run(batch, SAMPLING, 2, (1, 0))
    assert [r.env_class for r in rollouts] == ["synthetic"] * 2 + ["gsm8k"] * 2 + ["countdown_test"] * 2
    assert [r.turns for r in rollouts] == [1, 1, 1, 1, 2, 2]
    for r in rollouts[:2]:
        text = tok.decode(r.response_ids, skip_special_tokens=True)
        assert r.reward == CopyDigit().reward({"answer": "7"}, text, r.finish_reason == "stop")


def test_zero_reward_on_non_stop_zeroes_every_turns_reward(model):
    tok, _ = model
    gen, _ = generator(model, zero_reward_on_non_stop=True)
    rollouts = gen.run(rows(tok, {"turns": 2}), Sampling(max_generate_length=2, temperature=1.0), 4, (1, 0))
    cut = [r for r in rollouts if r.finish_reason == "length"]
    assert cut and all(r.zeroed and not any(r.token_rewards) for r in cut)


def test_reward_clip_bounds_each_turns_reward_after_the_overlong_penalty(model):
    """trainer.algorithm.reward_clip (AReaL's): Countdown's turn rewards 0.1, 0.2, 0.3 become 0.1, 0.15, 0.15; with an
    overlong buffer as long as the response, the penalty comes first and the clip bounds what it leaves."""
    from rlc.core.job import OverlongBuffer

    tok, _ = model
    gen, _ = generator(model, reward_clip=0.15)
    rollouts = gen.run(rows(tok, {"turns": 3}), SAMPLING, 2, (1, 0))
    for r in rollouts:
        assert [x for x in r.token_rewards if x] == pytest.approx([0.1, 0.15, 0.15])
    short = Sampling(max_generate_length=2, temperature=1.0)
    penalised, _ = generator(model, reward_clip=0.15, overlong_buffer=OverlongBuffer(2, 5.0, 2))
    for r in penalised.run(rows(tok, {"turns": 1}), short, 4, (2, 0)):
        assert r.reward == pytest.approx(max(0.1 - 5.0 * len(r.response_ids) / 2, -0.15))


def test_the_engines_prompt_cache_changes_no_trajectory(model, tiny_chat_model):
    from rlc.runtime.inference.hf import HFEngine

    tok, plain = model
    cached = HFEngine(
        tiny_chat_model,
        tokenizer=tok,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        prompt_cache_bytes=1 << 26,
    )
    batch = rows(tok, {"turns": 3}, {"turns": 2}, {"turns": 4})
    want = generator((tok, plain))[0].run(batch, SAMPLING, 2, (3, 0))
    continued, whole = [], cached._prefill_continuing
    cached._prefill_continuing = lambda prompts, found: continued.append(len(prompts)) or whole(prompts, found)
    gen, engines = generator((tok, cached))
    got = gen.run(batch, SAMPLING, 2, (3, 0))
    assert continued == [len(call[0]) for call in engines.calls[1:]]  # every later turn ran only its new tokens
    for g, w in zip(got, want, strict=True):
        assert (g.response_ids, g.loss_mask, g.turns) == (w.response_ids, w.loss_mask, w.turns)
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_a_greedy_baseline_is_each_prompts_greedy_trajectory_scored_by_its_environment(model):
    """remax: beside each prompt's samples, one greedy response, over as many turns as its environment takes; its
    reward (every turn's) is the baseline of each of the prompt's samples."""
    tok, _ = model
    gen, engines = generator(model, greedy_baseline=True)
    rollouts = gen.run(rows(tok, {"turns": 3}, {"turns": 2}), SAMPLING, 2, (1, 0))
    assert [r.baseline for r in rollouts] == pytest.approx([0.6, 0.6, 0.3, 0.3])  # 0.1 + 0.2 + 0.3; 0.1 + 0.2
    greedy_first = engines.calls[3]  # after the samples' three turns, the greedy trajectories' first
    assert greedy_first[1] == 1 and len(greedy_first[0]) == 2  # one response per prompt
    # Greedy: another step's seed gives the same responses
    again, again_engines = generator(model)
    repeat = again.greedy_rewards(rows(tok, {"turns": 3}, {"turns": 2}), SAMPLING, (9, 4))
    assert repeat == pytest.approx([0.6, 0.3])
    responses = [[g[0].token_ids for g in call[2]] for call in (greedy_first, again_engines.calls[0])]
    assert responses[0] == responses[1]
    plain, _ = generator(model)
    assert all(r.baseline is None for r in plain.run(rows(tok, {"turns": 1}), SAMPLING, 2, (1, 0)))
    evaluated = gen.run(rows(tok, {"turns": 1}), SAMPLING, 2, (1, 0), evaluation=True)  # nothing trains on these
    assert all(r.baseline is None for r in evaluated)
