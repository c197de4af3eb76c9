"""Routing replay (R3): the hf engine records which experts every token was routed to, and the training batch
carries those routes aligned with its tokens through micro-batching and packing.

The model is a tiny random Qwen3-MoE built here (two MoE layers, eight experts, top-2), saved with
`save_pretrained` beside the embedded tokenizer (with the chat template multi-turn conversations take). What the engine records is checked against the routes a plain
unpadded forward pass over the prompt and completion chooses.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlc.runtime.batch import Rollout, to_batch  # noqa: E402
from rlc.runtime.inference.base import Sampling  # noqa: E402
from rlc.runtime.inference.hf import HFEngine  # noqa: E402
from rlc.runtime.inference.routes import RouteRecorder, filler  # noqa: E402
from rlc.runtime.workers.micro_batches import trimmed  # noqa: E402
from rlc.runtime.workers.packing import pack  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

TEXTS = ("copy the digit 7:", "what is 3 plus 4?", "Question: how many apples")
LAYERS, EXPERTS, TOP_K = 2, 8, 2


@pytest.fixture(scope="module")
def moe_model(tiny_chat_model, tmp_path_factory) -> str:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_chat_model, local_files_only=True)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3MoeForCausalLM(config)
        with torch.no_grad():  # routers spread widely, so that a small change of weights moves some routes
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0.0, 0.5)
    path = tmp_path_factory.mktemp("qwen3_moe") / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(moe_model):
    return AutoTokenizer.from_pretrained(moe_model, local_files_only=True)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    assert len({len(p) for p in ids}) == len(ids), "prompts of different lengths exercise the left padding"
    return ids


@pytest.fixture(scope="module")
def engine(moe_model, tokenizer):
    return HFEngine(moe_model, dtype="float32", device="cpu", tokenizer=tokenizer, routed_experts=True)


def plain_routes(model, ids: list[int]) -> torch.Tensor:
    """(tokens, layers, top_k) routes of one unpadded forward pass over `ids`."""
    recorder = RouteRecorder(model)
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
        return recorder.take(1, len(ids))[0]
    finally:
        recorder.close()


def test_routes_are_those_of_a_plain_forward_over_prompt_and_completion(moe_model, engine, prompts):
    reference = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32, local_files_only=True).eval()
    sampling = Sampling(temperature=1.0, max_generate_length=6, logprobs=True)
    out = engine.generate(prompts, sampling, n=2, seed=3)
    for prompt, group in zip(prompts, out):
        for c in group:
            routes = c.routed_experts
            assert routes is not None and routes.dtype == torch.uint8
            # every token the engine ran: the prompt, and each generated token but the last
            assert tuple(routes.shape) == (len(prompt) + len(c.token_ids) - 1, LAYERS, TOP_K)
            expected = plain_routes(reference, prompt + c.token_ids)[: routes.shape[0]]
            assert torch.equal(routes.long().sort(-1).values, expected.long().sort(-1).values)


def test_an_engine_without_capture_returns_no_routes(moe_model, tokenizer, prompts):
    plain = HFEngine(moe_model, dtype="float32", device="cpu", tokenizer=tokenizer)
    [[c]] = plain.generate(prompts[:1], Sampling(max_generate_length=3), n=1)
    assert c.routed_experts is None


def test_capture_on_a_dense_model_is_refused_by_name(tiny_model):
    with pytest.raises(ValueError, match="no mixture-of-experts router"):
        HFEngine(tiny_model, dtype="float32", device="cpu", routed_experts=True)


def _rollouts(engine, prompts) -> list[Rollout]:
    out = engine.generate(prompts, Sampling(temperature=1.0, max_generate_length=5), n=1, seed=1)
    return [
        Rollout(prompt_ids=p, response_ids=c.token_ids, logprobs=None, finish_reason=c.finish_reason, reward=1.0,
                group=i, routed_experts=c.routed_experts)
        for i, (p, [c]) in enumerate(zip(prompts, out))
    ]


def test_the_batch_carries_routes_aligned_with_input_ids(engine, prompts):
    rollouts = _rollouts(engine, prompts)
    batch = to_batch(rollouts, pad_id=0)
    routes = batch.routed_experts
    assert routes is not None
    assert tuple(routes.shape) == (*batch.input_ids.shape, LAYERS, TOP_K)
    pad = filler(LAYERS, TOP_K)
    for i, r in enumerate(rollouts):
        start = batch.prompt_len - len(r.prompt_ids)
        ran = len(r.prompt_ids) + len(r.response_ids) - 1
        assert torch.equal(routes[i, start : start + ran], r.routed_experts)
        # left padding, the last token (never fed back) and right padding get the filler route
        for j in [*range(start), *range(start + ran, routes.shape[1])]:
            assert torch.equal(routes[i, j], pad)


def test_micro_batches_and_packing_keep_routes_with_their_tokens(engine, prompts):
    rollouts = _rollouts(engine, prompts)
    batch = to_batch(rollouts, pad_id=0)
    for rows in (slice(0, 1), slice(1, 3)):
        part = trimmed(batch.select(rows))
        assert part.routed_experts.shape[:2] == part.input_ids.shape
        packed = pack(part.input_ids, part.attention_mask, part.prompt_len)
        packed_routes = part.routed_experts[part.attention_mask.bool()]
        assert packed_routes.shape[0] == packed.input_ids.shape[1]
        for k, r in enumerate(rollouts[rows]):
            start = int(packed.starts[k])
            ran = len(r.prompt_ids) + len(r.response_ids) - 1
            assert torch.equal(packed_routes[start : start + ran], r.routed_experts)


def test_a_multi_turn_trajectory_carries_its_last_calls_routes(engine, moe_model, tokenizer):
    """The last turn's prompt is the whole conversation so far, so its routes cover the trajectory's tokens up to
    the last but one, observations included: each token's route is the one the last call's prompt pass chose."""
    import skyrl_gym
    from rlc.core.job import GeneratorSettings
    from rlc.runtime.chat import Templater
    from rlc.runtime.envs import gym
    from rlc.runtime.generator import Generator
    from rlc.spec.generation import SkyRLGymConfig
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    class TwoTurns(BaseTextEnv):
        def __init__(self, env_config=None, extras=None):
            super().__init__()

        def step(self, action):
            self.turns += 1
            done = self.turns >= 2
            return {"observations": [] if done else [{"role": "user", "content": "again"}], "reward": 1.0,
                    "done": done, "metadata": {}}

    class Engines:
        def submit(self, prompts, sampling, n, key, groups, count):
            return engine.generate(prompts, sampling, n, seed=sum(key))

        def result(self, handle):
            return handle

    gym.ensure_registered()
    skyrl_gym.register(id="two_turns_routes", entry_point=TwoTurns)
    try:
        settings = GeneratorSettings(default_env="two_turns_routes", max_turns=3, max_input_length=4096)
        gen = Generator(settings, SkyRLGymConfig(), tokenizer, Templater(tokenizer), Engines())
        row = {"prompt": [{"role": "user", "content": "what is 2 plus 3?"}]}
        prompt = Templater(tokenizer).prompt_ids(row["prompt"])
        rollouts = gen.run([(row, prompt)], Sampling(temperature=1.0, max_generate_length=4), 2, (1, 0))
    finally:
        skyrl_gym.envs.registration.deregister("two_turns_routes")
    reference = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32, local_files_only=True).eval()
    for r in rollouts:
        assert r.env_error is None and r.turns == 2 and r.routed_experts is not None
        ids = r.prompt_ids + r.response_ids
        assert r.routed_experts.shape[0] == len(ids) - 1
        expected = plain_routes(reference, ids)[: len(ids) - 1]
        assert torch.equal(r.routed_experts.long().sort(-1).values, expected.long().sort(-1).values)
