"""Routing replay (R3): the hf engine records which experts every token was routed to, and the training batch
carries those routes aligned with its tokens through micro-batching and packing.

The model is a tiny random Qwen3-MoE built here (two MoE layers, eight experts, top-2), saved with
`save_pretrained` beside the embedded tokenizer (with the chat template multi-turn conversations take). What the engine records is checked against the routes a plain
unpadded forward pass over the prompt and completion chooses.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlc.runtime.batch import (  # noqa: E402
    Rollout,
    filler,  # noqa: E402
    to_batch,
)
from rlc.runtime.inference.base import Sampling  # noqa: E402
from rlc.runtime.inference.hf import HFEngine  # noqa: E402
from rlc.runtime.inference.routes import RouteRecorder  # noqa: E402
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
        num_key_value_heads=2,  # tensor parallelism over 2 ranks splits them
        head_dim=32,  # a head size vLLM's CPU attention has
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
        Rollout(
            prompt_ids=p,
            response_ids=c.token_ids,
            logprobs=None,
            finish_reason=c.finish_reason,
            reward=1.0,
            group=i,
            routed_experts=c.routed_experts,
        )
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
            return {
                "observations": [] if done else [{"role": "user", "content": "again"}],
                "reward": 1.0,
                "done": done,
                "metadata": {},
            }

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


# -- the Megatron worker's replay (runtime/workers/megatron_replay.py) ----------------------------------------------
# Megatron-Core runs in a subprocess (this file as a script), so its global parallel state never leaks into other
# tests. The model is a Megatron-Core MoE GPTModel built directly (two MoE layers of eight experts, top-2, full
# activation recompute, so the backward pass routes every token again).


def _megatron_check(port: int) -> dict:
    import torch.distributed as dist
    from rlc.runtime.workers import megatron_cpu
    from rlc.runtime.workers.megatron import _CPU_OFF
    from rlc.runtime.workers.megatron_replay import RoutingReplay

    torch.manual_seed(0)
    megatron_cpu.enable()
    with megatron_cpu.active():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel
        from megatron.core.models.gpt import GPTModel, gpt_layer_specs
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.enums import AttnMaskType
        from megatron.core.transformer.moe import moe_utils
        from megatron.core.transformer.moe.router import TopKRouter
        from megatron.core.transformer.moe.router_replay import RouterReplayAction
        from megatron.core.transformer.transformer_config import TransformerConfig

        # Megatron-Core 0.16 without TransformerEngine reads a name its failed import never bound (router gating)
        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None
        ps.initialize_model_parallel(1, 1)
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        config = TransformerConfig(
            num_layers=LAYERS, hidden_size=32, num_attention_heads=2, ffn_hidden_size=64, num_moe_experts=EXPERTS,
            moe_router_topk=TOP_K, moe_ffn_hidden_size=16, moe_enable_routing_replay=True,
            moe_token_dispatcher_type="allgather", moe_router_load_balancing_type="none", moe_grouped_gemm=False,
            add_bias_linear=False, use_cpu_initialization=True, params_dtype=torch.float32,
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1, **_CPU_OFF,
        )  # fmt: skip
        spec = gpt_layer_specs.get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=False)
        spec.submodules.self_attention.params["attn_mask_type"] = AttnMaskType.padding_causal
        model = GPTModel(config, spec, vocab_size=64, max_sequence_length=64)
        with torch.no_grad():
            for layer in model.decoder.layers:
                layer.mlp.router.weight.normal_(0.0, 0.5)
        replay = RoutingReplay([model], config)

        seen: list = []  # each router call's chosen experts, (tokens, experts) bool, in layer order per pass
        order: list = []  # the layer of each call (a recompute in the backward pass runs the layers backwards)

        def noting(n):
            def hook(module, args, out):
                order.append(n)
                seen.append(out[1].detach().clone())

            return hook

        for n, m in enumerate(x for x in model.modules() if isinstance(x, TopKRouter)):
            m.register_forward_hook(noting(n))

        rows, width = 3, 9
        ids = torch.randint(1, 64, (rows, width))
        attention = torch.ones(rows, width, dtype=torch.long)
        attention[0, :3] = 0  # left-padded prompts
        attention[2, :5] = 0
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        def mask_of(att):  # Megatron's: True = masked (causal and padding)
            causal = torch.ones(att.shape[1], att.shape[1], dtype=torch.bool).triu(1)
            return (causal[None] | ~att.bool()[:, None, :])[:, None]

        def run(i, a, p):
            return model(i, p, mask_of(a))

        # The routes each row takes alone (one row: no question of token order), as an engine would report them.
        alone = []
        with torch.no_grad():
            for r in range(rows):
                seen.clear()
                run(ids[r : r + 1], attention[r : r + 1], positions[r : r + 1])
                alone.append(torch.stack([s.nonzero()[:, 1].view(width, TOP_K) for s in seen], dim=1))
        routes = torch.stack(alone).to(torch.uint8)  # (rows, width, layers, k)

        # Routers perturbed: routing anew moves some tokens to other experts.
        with torch.no_grad():
            for layer in model.decoder.layers:
                layer.mlp.router.weight.add_(torch.randn_like(layer.mlp.router.weight))
            seen.clear()
            run(ids, attention, positions)
        real = attention.bool().transpose(0, 1).reshape(-1)
        anew = torch.stack([s.nonzero()[:, 1].view(-1, TOP_K) for s in seen], dim=1)[real]
        expected = routes.transpose(0, 1).reshape(-1, LAYERS, TOP_K)[real].long()
        moved = int((anew.sort(-1).values != expected.sort(-1).values).any(-1).any(-1).sum())

        # Replayed, forward and backward over two micro-batches, the recompute included.
        micro = [(slice(0, 2)), (slice(2, 3))]
        seen.clear()
        order.clear()

        def step(iterator, m):
            part = next(iterator)
            replay.forward(routes[part], attention[part], 1, 0, "cpu")
            out = run(ids[part], attention[part], positions[part])
            replay.after_forward()
            return out, lambda o: (o.float().mean(), {})

        with replay.schedule():
            get_forward_backward_func()(
                forward_step_func=step, data_iterator=iter(micro), model=[model], num_microbatches=len(micro),
                seq_length=width, micro_batch_size=2, forward_only=False,
            )  # fmt: skip
            queued = [len(r.replay_backward_list) for _, r in replay.routers]
        calls = []
        for i in range(0, len(seen), LAYERS):
            layers = sorted(range(i, i + LAYERS), key=lambda j: order[j])
            calls.append(torch.stack([seen[j] for j in layers], dim=1))
        replayed = []
        for part, call in zip([micro[0], micro[0], micro[1], micro[1]], calls):  # forward, recompute, per micro-batch
            att = attention[part].bool().transpose(0, 1).reshape(-1)
            got = call.nonzero()  # (token, layer, expert)
            chosen = got[:, 2].view(call.shape[0], LAYERS, TOP_K)[att]
            want = routes[part].transpose(0, 1).reshape(-1, LAYERS, TOP_K)[att].long()
            replayed.append(bool(torch.equal(chosen.sort(-1).values, want.sort(-1).values)))
        left = [r.router_replay_action for _, r in replay.routers]
        return {
            "moved": moved,
            "calls": len(calls),
            "replayed": replayed,
            "queued": queued,
            "cleared": all(a is None for a in left) and all(not r.replay_backward_list for _, r in replay.routers),
            "backward_action": RouterReplayAction.REPLAY_BACKWARD.value,
        }


@pytest.fixture(scope="module")
def megatron_result() -> dict:
    pytest.importorskip("megatron.core")
    return _script("megatron")


def test_megatron_routers_take_the_replayed_routes_forward_and_in_the_recompute(megatron_result):
    assert megatron_result["moved"] > 0, "perturbed routers must route some tokens elsewhere, or the test shows nothing"
    # each micro-batch's forward, then its recompute in the backward pass
    assert megatron_result["calls"] == 4
    assert megatron_result["replayed"] == [True] * 4
    assert megatron_result["queued"] == [0] * LAYERS  # every route a forward queued was taken by its recompute
    assert megatron_result["cleared"]


# -- end to end: the hf engine's routes replayed in rlc's Megatron worker ------------------------------------------


def _worker_check(port: int, model_path: str, batch_path: str, dense_path: str) -> dict:
    """The policy's Megatron worker on the engine's checkpoint: its log-probs with the engine's routes replayed; then
    with its routers perturbed, the experts it picks replaying and routing anew, in forward passes and a training
    step. Last, a worker of a dense model asked to replay."""
    from megatron.core.transformer.moe.router import TopKRouter
    from rlc.core.job import WorkerSettings
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model

    batch = torch.load(batch_path, weights_only=False)
    megatron = {"moe_enable_routing_replay": True}
    spec = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": "megatron", "policy": {"megatron_config": megatron}}}
    )
    settings = WorkerSettings("policy", model_path, strategy="megatron", micro_train_batch_size=2,
                              micro_forward_batch_size=2)  # fmt: skip
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)
    worker.setup("127.0.0.1", port)
    seen: list = []  # (layer, the experts the router chose per token) of every router call
    routers = [m for c in worker.chunks for m in c.modules() if isinstance(m, TopKRouter)]

    def noting(n):
        def hook(module, args, out):
            seen.append((n, out[1].detach().clone()))

        return hook

    for n, r in enumerate(routers):
        r.register_forward_hook(noting(n))

    def picked() -> list:
        """Each pass's experts per token, (tokens, layers, k) sorted, as the routers chose them (a recompute in the
        backward pass runs the layers last to first)."""
        out = []
        for i in range(0, len(seen), LAYERS):
            call = torch.stack([m for _, m in sorted(seen[i : i + LAYERS], key=lambda x: x[0])], dim=1)
            out.append(call.nonzero()[:, 2].view(call.shape[0], LAYERS, TOP_K).sort(-1).values)
        seen.clear()
        return out

    def agree(got: list, parts=(0, 1)) -> list[bool]:
        """Whether each pass's routers (over micro-batch `parts[i]`, two rows each) took the engine's routes on
        every token the engine ran (Megatron's [sequence, batch] token order)."""
        same = []
        for g, k in zip(got, parts, strict=True):
            part = batch.select(slice(2 * k, 2 * k + 2))
            ran = part.attention_mask.bool().clone()
            for r in range(ran.shape[0]):  # a row's last token was sampled, never run by the engine
                ran[r, int(ran[r].nonzero().max())] = False
            want = part.routed_experts.transpose(0, 1).reshape(-1, LAYERS, TOP_K).long().sort(-1).values
            ran = ran.transpose(0, 1).reshape(-1)
            same.append(bool(torch.equal(g[ran], want[ran])))
        return same

    mask = batch.loss_mask.bool()
    replayed = worker.forward(batch)
    same = agree(picked())
    engine_gap = float((replayed - batch.rollout_logprobs)[mask].abs().max())
    _perturb(worker)
    perturbed = worker.forward(batch)
    perturbed_same = agree(picked())
    anew = worker.forward(dataclasses.replace(batch, routed_experts=None))
    anew_same = agree(picked())
    step = dataclasses.replace(batch, old_logprobs=perturbed, advantages=torch.randn_like(batch.loss_mask))
    metrics = worker.train_mini_batch(step, totals(batch))
    train_same = agree(picked(), parts=(0, 0, 1, 1))  # each micro-batch's forward, then its recompute
    try:
        MegatronWorker(dataclasses.replace(settings, model_path=dense_path), spec.trainer.policy,
                       spec.trainer.algorithm, 0, 1).setup("127.0.0.1", port)  # fmt: skip
        dense = ""
    except RuntimeError as exc:
        dense = str(exc)
    worker.shutdown()
    return {
        "dense": dense,
        "same": same,
        "engine_gap": engine_gap,
        "perturbed_same": perturbed_same,
        "anew_same": anew_same,
        "anew_gap": float((anew - perturbed)[mask].abs().max()),
        "train_same": train_same,
        "finite": all(v == v for v in metrics.values()),
        "perturbed": perturbed.tolist(),
    }


def _perturb(worker) -> None:
    """Every router's weights moved by noise seeded with its layer's number: alike whichever rank holds the layer."""
    with torch.no_grad():
        for chunk in worker.chunks:
            for layer in chunk.decoder.layers:
                weight = layer.mlp.router.weight
                noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(100 + layer.layer_number))
                weight.add_(noise.to(weight.dtype))


def _layout_check(port: int, model_path: str, batch_path: str, rank: str, sizes: str) -> dict:
    """One rank of a worker over several ranks (`sizes`: tensor, pipeline, expert parallel and world sizes), routers
    perturbed as `_worker_check` perturbs them: its data-parallel shard's log-probs replaying and routing anew."""
    from rlc.core.job import WorkerSettings
    from rlc.runtime.batch import shards
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model

    tp, pp, ep, world = (int(x) for x in sizes.split(","))
    batch = torch.load(batch_path, weights_only=False)
    megatron = {"moe_enable_routing_replay": True, "tensor_model_parallel_size": tp,
                "pipeline_model_parallel_size": pp, "expert_model_parallel_size": ep}  # fmt: skip
    spec = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": "megatron", "policy": {"megatron_config": megatron}}}
    )
    settings = WorkerSettings("policy", model_path, strategy="megatron", micro_forward_batch_size=2)
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, int(rank), world)
    worker.setup("127.0.0.1", port)
    _perturb(worker)
    layout = worker.layout()
    mine = shards(batch, layout["dp_size"])[layout["dp_rank"]]
    perturbed = worker.forward(mine)
    anew = worker.forward(dataclasses.replace(mine, routed_experts=None))
    worker.shutdown()
    return {**layout, "perturbed": perturbed.tolist(), "anew": anew.tolist()}


@pytest.fixture(scope="module")
def worker_result(engine, prompts, moe_model, tiny_model, tmp_path_factory) -> dict:
    pytest.importorskip("megatron.core")
    out = engine.generate(prompts[:2], Sampling(temperature=1.0, max_generate_length=6, logprobs=True), n=2, seed=5)
    rollouts = [
        Rollout(p, c.token_ids, c.logprobs, c.finish_reason, 1.0, i, routed_experts=c.routed_experts)
        for i, (p, group) in enumerate(zip(prompts, out))
        for c in group
    ]
    path = tmp_path_factory.mktemp("replay") / "batch.pt"
    torch.save(to_batch(rollouts, pad_id=0), path)
    result = _script("worker", moe_model, str(path), tiny_model)
    mask = torch.load(path, weights_only=False).loss_mask.bool()
    return {**result, "model": moe_model, "batch": str(path), "mask": mask.tolist()}


def test_the_workers_routers_replay_the_engines_routes_and_its_log_probs_are_the_engines(worker_result):
    # the checkpoint the engine sampled with: the same experts, and the engine's log-probs
    assert worker_result["same"] == [True, True]
    assert worker_result["engine_gap"] < 1e-4
    # routers perturbed: replay still takes the engine's experts, in forward passes and in a training step ...
    assert worker_result["perturbed_same"] == [True, True]
    # SkyRL's default recomputes every layer in the backward pass: each forward's routes are replayed there too
    assert worker_result["train_same"] == [True] * 4 and worker_result["finite"]
    # ... where routing anew picks others, and gives other log-probs
    assert worker_result["anew_same"] != [True, True]
    assert worker_result["anew_gap"] > 1e-3


def test_a_dense_model_asked_to_replay_is_refused_at_start_up(worker_result):
    assert "has no mixture-of-experts router" in worker_result["dense"]


# -- vLLM's routes (enable_return_routed_experts), on its CPU build --------------------------------------------------


def _vllm_check(port: int, model_path: str) -> dict:
    """vLLM started with the engine arguments the compiler decides for a CPU job that captures routes; its completions
    as the vllm engine reads them."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process (as the engine actor runs it)
    import vllm
    from rlc.compiler.decide import vllm_args
    from rlc.runtime.inference.vllm import completions, engine_kwargs
    from rlc.spec.model import default_model

    spec = default_model().to_typed(
        {"version": 1, "cluster": {"accelerator": "none", "gpus_per_node": 1},
         "trainer": {"strategy": "megatron", "policy": {"model": {"path": model_path},
                     "megatron_config": {"moe_enable_routing_replay": True}}, "max_prompt_length": 32},
         "generator": {"inference_engine": {"backend": "vllm", "model_dtype": "float32",
                                            "enable_return_routed_experts": True},
                       "sampling_params": {"max_generate_length": 6}}}
    )  # fmt: skip
    llm = vllm.LLM(**engine_kwargs(vllm_args(spec, "cpu", [0]), model=model_path))
    prompts = json.loads(os.environ["RLC_TEST_PROMPTS"])
    params = vllm.SamplingParams(max_tokens=6, temperature=1.0, n=2, seed=3)
    out = completions(llm.generate([{"prompt_token_ids": p} for p in prompts], params), logprobs=False)
    return {"completions": [[(c.token_ids, c.routed_experts.tolist(), str(c.routed_experts.dtype)) for c in g]
                            for g in out]}  # fmt: skip


@pytest.mark.slow
def test_vllm_returns_the_routes_a_plain_forward_chooses(moe_model, prompts):
    pytest.importorskip("vllm")
    reference = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32, local_files_only=True).eval()
    result = _script("vllm", moe_model, env={"RLC_TEST_PROMPTS": json.dumps(prompts)})
    for prompt, group in zip(prompts, result["completions"], strict=True):
        for ids, routes, dtype in group:
            routes = torch.tensor(routes)
            # every token vLLM ran: the prompt, and each generated token but the last
            assert tuple(routes.shape) == (len(prompt) + len(ids) - 1, LAYERS, TOP_K) and dtype == "torch.uint8"
            expected = plain_routes(reference, prompt + ids)[: routes.shape[0]]
            assert torch.equal(routes.sort(-1).values, expected.long().sort(-1).values)


# two pipeline stages, two expert ranks (tensor parallelism on MoE: test_megatron_moe's tp2 step)
@pytest.mark.parametrize("sizes", ["1,2,1", "1,1,2"])
def test_replay_over_pipeline_stages_and_expert_parallel_ranks_is_the_single_ranks(sizes, worker_result):
    """Routers perturbed alike: what two ranks compute replaying the engine's routes is what one rank computes."""
    results = _ranks(2, "layout", worker_result["model"], worker_result["batch"], sizes=f"{sizes},2")
    collected = sorted((r for r in results if r["collect"]), key=lambda r: r["dp_rank"])
    perturbed = torch.cat([torch.tensor(r["perturbed"]) for r in collected])
    anew = torch.cat([torch.tensor(r["anew"]) for r in collected])
    single = torch.tensor(worker_result["perturbed"])
    mask = torch.tensor(worker_result["mask"])
    assert (perturbed - single)[mask].abs().max() < 1e-5
    assert (anew - single)[mask].abs().max() > 1e-3  # routing anew would differ: the replay is what agrees


def _ranks(world: int, what: str, *args: str, sizes: str) -> list[dict]:
    """`world` ranks of this file run as a script, each its last line of output as JSON."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, what, str(port), *args, str(rank), sizes],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        for rank in range(world)
    ]
    outs = [p.communicate(timeout=400) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-3000:] for _, err in outs]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def _script(*args: str, env: dict | None = None) -> dict:
    """This file run as a script (`what`, a free port, its arguments): its last line of output, as JSON."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **(env or {})}
    command = [sys.executable, __file__, args[0], str(port), *args[1:]]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    import sys

    what, port = sys.argv[1], int(sys.argv[2])
    checks = {"megatron": _megatron_check, "worker": _worker_check, "vllm": _vllm_check, "layout": _layout_check}
    print(json.dumps(checks[what](port, *sys.argv[3:])))
