"""The embedded model, the `hf` inference engine, and the training-batch layout the trainer reads.

The engine is checked against a plain transformers forward pass of the same saved model: what it
samples and the log-probabilities it reports are what the trainer will recompute.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlc.core import algorithms  # noqa: E402
from rlc.runtime.algorithms.losses import reduce_loss, token_weights  # noqa: E402
from rlc.runtime.batch import Rollout, mini_batches, shards, to_batch, totals  # noqa: E402
from rlc.runtime.inference.base import Sampling  # noqa: E402
from rlc.runtime.inference.hf import HFEngine, _draw, _filter_logits  # noqa: E402
from rlc.runtime.models import ModelPathError, local_path  # noqa: E402
from rlc.spec.algorithm import LOSS_REDUCTIONS  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

TEXTS = ("copy the digit 7:", "what is 3 plus 4?", "Question: how many apples")


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model, local_files_only=True)


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The saved model loaded the ordinary way, for full forward passes without padding or a cache."""
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, local_files_only=True).eval()


@pytest.fixture(scope="module")
def engine(tiny_model, tokenizer):
    return HFEngine(tiny_model, dtype="float32", device="cpu", tokenizer=tokenizer)


@pytest.fixture
def own_engine(tiny_model, tokenizer):
    """An engine a test may put to sleep or overwrite."""
    return HFEngine(tiny_model, dtype="float32", device="cpu", tokenizer=tokenizer)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    assert len({len(p) for p in ids}) == len(ids), "prompts of different lengths exercise the left padding"
    return ids


def plain_logits(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Logits that predicted each completion token, from one unpadded forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]


def flat(out):
    return [(c.token_ids, c.logprobs, c.finish_reason) for group in out for c in group]


# -- the embedded model -----------------------------------------------------------------------------


def test_tiny_model_loads_offline_with_its_tokenizer(tiny_model, tokenizer, reference):
    assert (Path(tiny_model) / "config.json").exists()
    text = "copy the digit 7:"
    assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    assert reference.config.vocab_size == len(tokenizer)
    assert reference.config.eos_token_id == tokenizer.eos_token_id
    assert reference.config.pad_token_id == tokenizer.pad_token_id
    assert tokenizer.padding_side == "left"


def test_tiny_model_is_built_once(tiny_model, rlc_cache):
    weights = sorted(Path(tiny_model).iterdir())
    before = {p.name: p.stat().st_mtime_ns for p in weights}
    again = local_path("rlc:tiny")
    assert again == tiny_model
    assert Path(again).is_relative_to(Path(rlc_cache))
    assert {p.name: p.stat().st_mtime_ns for p in sorted(Path(again).iterdir())} == before
    assert not [p.name for p in Path(again).parent.iterdir() if p.name.startswith(".")]  # no staging leftovers


def test_unknown_embedded_model_is_refused():
    with pytest.raises(ModelPathError, match="rlc:tiny"):
        local_path("rlc:nope")


def test_other_model_paths_pass_through():
    assert local_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert local_path("/models/q") == "/models/q"
    assert local_path("~/models/q") == os.path.join(os.path.expanduser("~"), "models/q")


# -- generation ---------------------------------------------------------------------------------------


def test_n_completions_per_prompt_in_prompt_order(engine, prompts):
    out = engine.generate(prompts, Sampling(max_generate_length=6), n=3, seed=0)
    assert [len(group) for group in out] == [3, 3, 3]
    # Greedy decoding gives each prompt its own fixed answer, so the order is visible.
    greedy = engine.generate(prompts, Sampling(max_generate_length=6, temperature=0), n=2)
    for p, group in zip(prompts, greedy):
        alone = engine.generate([p], Sampling(max_generate_length=6, temperature=0), n=1)[0][0]
        assert [c.token_ids for c in group] == [alone.token_ids, alone.token_ids]
    assert engine.generate([], Sampling(), n=4) == []


def test_length_limit_and_finish_reasons(engine, prompts):
    eos = engine.eos_token_id
    out = engine.generate(prompts[1:], Sampling(max_generate_length=12), n=16, seed=1)
    reasons = set()
    for c in (c for group in out for c in group):
        reasons.add(c.finish_reason)
        assert 1 <= len(c.token_ids) <= 12
        assert len(c.logprobs) == len(c.token_ids)
        if c.finish_reason == "stop":
            assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
        else:
            assert c.finish_reason == "length"
            assert len(c.token_ids) == 12 and eos not in c.token_ids
    assert reasons == {"stop", "length"}


def test_eos_ends_a_completion_and_is_its_last_token(tiny_model, engine, prompts):
    greedy = engine.generate([prompts[1]], Sampling(max_generate_length=8, temperature=0))[0][0].token_ids
    k = next(i for i in range(1, len(greedy)) if greedy[i] not in greedy[:i])
    # An engine whose end-of-sequence token is the k-th greedy token must stop right after it.
    stopping = HFEngine(tiny_model, eos_token_id=greedy[k])
    c = stopping.generate([prompts[1]], Sampling(max_generate_length=8, temperature=0))[0][0]
    assert (c.token_ids, c.finish_reason) == (greedy[: k + 1], "stop")


def test_same_seed_same_completions_other_seed_differs(engine, prompts):
    s = Sampling(max_generate_length=10)
    first = engine.generate(prompts, s, n=4, seed=7)
    assert flat(engine.generate(prompts, s, n=4, seed=7)) == flat(first)
    assert [t for t, _, _ in flat(engine.generate(prompts, s, n=4, seed=8))] != [t for t, _, _ in flat(first)]


def test_temperature_zero_is_greedy_and_equals_top_k_one(engine, reference, prompts):
    greedy = engine.generate(prompts, Sampling(max_generate_length=10, temperature=0), n=2, seed=0)
    top1 = engine.generate(prompts, Sampling(max_generate_length=10, temperature=1.0, top_k=1), n=2, seed=3)
    assert flat(top1) == flat(greedy)
    for p, group in zip(prompts, greedy):
        c = group[0]
        assert c.token_ids == plain_logits(reference, p, c.token_ids).argmax(-1).tolist()


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(max_generate_length=10, temperature=0.7),
        Sampling(max_generate_length=10, temperature=1.3, top_k=8, top_p=0.9, min_p=0.05, repetition_penalty=1.5),
    ],
    ids=["plain", "filtered"],
)
def test_logprobs_are_the_trainers_log_softmax(engine, reference, prompts, sampling):
    """log_softmax(logits / T) of the whole vocabulary, before filters and penalty, despite left padding."""
    out = engine.generate(prompts, sampling, n=3, seed=11)
    assert max(len(c.token_ids) for group in out for c in group) > 3
    for p, group in zip(prompts, out):
        for c in group:
            logits = plain_logits(reference, p, c.token_ids)
            expected = torch.log_softmax(logits / sampling.temperature, -1)
            expected = expected.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_prompts_of_one_length_decode_without_a_mask(own_engine, reference, prompts):
    """No padding, no mask: the model builds none at any step, and the log-probs are still the trainer's."""
    sampling = Sampling(max_generate_length=10, temperature=0.7)
    same = [prompts[0], prompts[0][::-1], [prompts[0][0]] * len(prompts[0])]
    own_engine.lean_decode = False  # the transformers forward's own decode steps (LeanDecoder has no mask here)
    masks = []
    own_engine.model.register_forward_hook(
        lambda m, args, kwargs, out: masks.append(kwargs.get("attention_mask")), with_kwargs=True
    )
    out = own_engine.generate(same, sampling, n=3, seed=5)
    assert len(masks) > 3 and all(m is None for m in masks)
    for p, group in zip(same, out):
        for c in group:
            expected = torch.log_softmax(plain_logits(reference, p, c.token_ids) / sampling.temperature, -1)
            expected = expected.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    masks.clear()
    own_engine.generate(prompts, sampling, n=2, seed=5)  # left-padded prompts keep their mask
    assert all(m is not None for m in masks)


# -- decode steps without the transformers forward (inference/decode.py) ---------------------------------------------


def _random_model(tmp_path_factory, kind: str) -> str:
    """A random model of another shape than rlc:tiny, saved: grouped-query attention (Llama), projections with
    biases (Qwen2), or SmolLM2-135M's layout at a tiny width (30 layers, 9 query heads sharing 3 key-value heads,
    output projection tied to the embedding, rope theta 100000)."""
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if kind == "smollm2-shape":
        common.update(
            hidden_size=72, intermediate_size=192, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3
        )
        config = LlamaConfig(**common, head_dim=8, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)
    elif kind == "llama-gqa":
        config = LlamaConfig(**common, rope_theta=500.0)
    else:
        config = Qwen2Config(**common, use_sliding_window=False)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    if kind == "smollm2-shape":
        assert model.lm_head.weight is model.model.embed_tokens.weight
    if kind == "qwen2-bias":
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)  # biases of 0 would not show whether they are applied
    path = tmp_path_factory.mktemp(kind)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module", params=["rlc-tiny", "llama-gqa", "qwen2-bias", "smollm2-shape"])
def decode_model(request, tiny_model, tmp_path_factory):
    return tiny_model if request.param == "rlc-tiny" else _random_model(tmp_path_factory, request.param)


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "one-length"])
def test_lean_decode_steps_are_the_models_forward(decode_model, prompts, padded):
    """Same seed, same tokens and log-probs whether decode steps run on LeanDecoder or on the model's forward: with
    left-padded prompts, rows that end early (EOS is made likely), grouped-query heads and projection biases."""
    lean = HFEngine(decode_model, dtype="float32", device="cpu", eos_token_id=5)
    model_forward = HFEngine(decode_model, dtype="float32", device="cpu", eos_token_id=5)
    assert lean.lean_decode and lean.lean_decode_off is None
    model_forward.lean_decode = False
    with torch.no_grad():
        # EOS now and then: its logit about 2 above the others' (near 0 in a random model) where the final hidden
        # state is near its mean over the prompts.
        for engine in (lean, model_forward):
            h = torch.cat(
                [engine.model(torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0] for p in prompts]
            )
            mean = h.mean(0)
            engine.model.lm_head.weight[5] = 2.0 * mean / mean.dot(mean)
    batch = prompts if padded else [prompts[0], prompts[0][::-1]]
    sampling = Sampling(max_generate_length=12, temperature=1.0)
    got = lean.generate(batch, sampling, n=4, seed=9)
    want = model_forward.generate(batch, sampling, n=4, seed=9)
    lengths = [len(c.token_ids) for group in got for c in group]
    # An eighth of the rows or more end by step 10: the batch is compacted while others still decode.
    assert sum(n <= 10 for n in lengths) * 8 >= len(lengths) and max(lengths) == 12, lengths
    for a, b in zip(flat(got), flat(want)):
        assert a[0] == b[0] and a[2] == b[2]
        torch.testing.assert_close(torch.tensor(a[1]), torch.tensor(b[1]), atol=1e-5, rtol=0)
    # And each row's log-probs are those of one unpadded forward over its own prompt and tokens: the rows that
    # finished, kept in the batch until the compaction, left the others' keys and values alone.
    for p, group in zip(batch, got):
        for c in group:
            expected = torch.log_softmax(plain_logits(lean.model, p, c.token_ids), -1)
            expected = expected.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == 5) and 5 not in c.token_ids[:-1]


def test_a_groups_prompt_runs_once_and_each_sample_keeps_its_own_cache(decode_model, prompts):
    """The prompt pass sees each prompt once (not once per sample); the n samples then decode from copies of its keys
    and values, and each one's log-probs are those of an unpadded forward over its own prompt and tokens."""
    engine = HFEngine(decode_model, dtype="float32", device="cpu", eos_token_id=-1)
    batches = []
    hook = engine.model.register_forward_pre_hook(
        lambda m, args, kwargs: batches.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    out = engine.generate(prompts, Sampling(max_generate_length=6, temperature=1.5), n=5, seed=4)
    hook.remove()
    assert batches[0][0] == len(prompts) and batches[0][1] == max(len(p) for p in prompts)
    if engine.lean_decode:
        assert len(batches) == 1  # every decode step on LeanDecoder
    for p, group in zip(prompts, out):
        assert len({tuple(c.token_ids) for c in group}) > 1  # the samples went their own ways
        for c in group:
            expected = torch.log_softmax(plain_logits(engine.model, p, c.token_ids) / 1.5, -1)
            expected = expected.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_draw_follows_the_weights_and_never_picks_a_zero():
    weights = torch.tensor([[0.0, 0.1, 0.0, 0.2, 0.7, 0.0]]).expand(40000, 6) * 3.0  # unnormalized
    picked = _draw(weights, torch.Generator().manual_seed(0))
    freq = torch.bincount(picked, minlength=6).double() / len(picked)
    assert freq[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(
        freq, torch.tensor([0.0, 0.1, 0.0, 0.2, 0.7, 0.0], dtype=torch.float64), atol=0.01, rtol=0
    )
    one_hot = torch.zeros(3, 50)
    one_hot[0, 0], one_hot[1, 49], one_hot[2, 17] = 1.0, 1.0, 1.0  # the first and last entries can be drawn
    assert _draw(one_hot, torch.Generator().manual_seed(1)).tolist() == [0, 49, 17]


def test_lean_decode_follows_weight_updates(own_engine, reference, prompts):
    """It reads the modules' current parameters: after an update its log-probs are the updated model's."""
    assert own_engine.lean_decode
    changed = {k: v * 1.3 for k, v in own_engine.model.state_dict().items()}
    own_engine.update_weights(changed)
    reference = type(reference)(reference.config).eval()
    reference.load_state_dict(changed)
    out = own_engine.generate(prompts, Sampling(max_generate_length=8), n=2, seed=1)
    for p, group in zip(prompts, out):
        for c in group:
            expected = torch.log_softmax(plain_logits(reference, p, c.token_ids), -1)
            expected = expected.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_models_lean_decode_does_not_know_keep_the_transformers_forward(tiny_model, tmp_path):
    from rlc.runtime.inference.decode import unsupported
    from transformers import GPT2Config, LlamaConfig

    scaled = LlamaConfig.from_pretrained(tiny_model)
    scaled.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    cases = {
        "rotary embedding other than the default": AutoModelForCausalLM.from_config(scaled),
        "model type 'gpt2'": AutoModelForCausalLM.from_config(
            GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
        ),
    }
    for reason, model in cases.items():
        assert reason in (unsupported(model) or ""), unsupported(model)
    lora = SimpleNamespace(
        rank=4, alpha=8, dropout=0.0, target_modules="all-linear", exclude_modules=None, init_method="kaiming"
    )
    engine = HFEngine(tiny_model, lora=lora)
    assert "adapters" in engine.lean_decode_off and not engine.lean_decode


def test_sampled_tokens_stay_in_the_top_k(engine, reference, prompts):
    out = engine.generate(prompts, Sampling(max_generate_length=10, temperature=2.0, top_k=3), n=4, seed=2)
    for p, group in zip(prompts, out):
        for c in group:
            top = plain_logits(reference, p, c.token_ids).topk(3, dim=-1).indices
            assert all(t in row for t, row in zip(c.token_ids, top.tolist()))


def test_logprobs_can_be_left_out(engine, prompts):
    out = engine.generate(prompts, Sampling(max_generate_length=4, logprobs=False), n=1)
    assert all(c.logprobs is None for group in out for c in group)


def kept(logits: torch.Tensor, **params) -> list[set[int]]:
    probs = torch.softmax(_filter_logits(logits, Sampling(**params)), dim=-1)
    return [set(torch.nonzero(row > 0).flatten().tolist()) for row in probs]


# Probabilities 0.5, 0.3, 0.15, 0.05, listed out of order so the filters cannot rely on the layout.
HAND = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3], [0.05, 0.3, 0.5, 0.15]]))


@pytest.mark.parametrize(
    "params, expected",
    [
        ({}, [{0, 1, 2, 3}, {0, 1, 2, 3}]),
        ({"top_k": 1}, [{1}, {2}]),
        ({"top_k": 3}, [{0, 1, 3}, {1, 2, 3}]),
        ({"top_k": 4}, [{0, 1, 2, 3}, {0, 1, 2, 3}]),
        ({"top_p": 0.4}, [{1}, {2}]),
        ({"top_p": 0.75}, [{1, 3}, {1, 2}]),
        ({"top_p": 0.9}, [{0, 1, 3}, {1, 2, 3}]),
        ({"min_p": 0.25}, [{0, 1, 3}, {1, 2, 3}]),
        ({"min_p": 0.5}, [{1, 3}, {1, 2}]),
        ({"min_p": 0.9}, [{1}, {2}]),
        # top-k first, then min-p on what is left: 0.5 / 0.8 and 0.3 / 0.8 stay above 0.5 * 0.625.
        ({"top_k": 2, "min_p": 0.5}, [{1, 3}, {1, 2}]),
        ({"top_k": 3, "top_p": 0.6}, [{1, 3}, {1, 2}]),
    ],
)
def test_filters_keep_the_expected_tokens(params, expected):
    assert kept(HAND, **params) == expected


def test_huge_repetition_penalty_stops_greedy_repeats(engine, prompts):
    plain = engine.generate(prompts, Sampling(max_generate_length=20, temperature=0))
    assert any(len(set(c.token_ids)) < len(c.token_ids) for group in plain for c in group)
    penalized = engine.generate(prompts, Sampling(max_generate_length=20, temperature=0, repetition_penalty=1e6))
    for group in penalized:
        ids = group[0].token_ids
        assert len(set(ids)) == len(ids), ids


def test_stop_string_ends_a_completion(engine, tokenizer, prompts):
    greedy = engine.generate([prompts[1]], Sampling(max_generate_length=12, temperature=0))[0][0].token_ids
    stop = tokenizer.decode(greedy[:4], skip_special_tokens=True)[-2:]
    assert stop.strip() and stop not in tokenizer.decode(greedy[:3], skip_special_tokens=True)
    c = engine.generate([prompts[1]], Sampling(max_generate_length=12, temperature=0, stop=[stop]))[0][0]
    assert (c.token_ids, c.finish_reason) == (greedy[:4], "stop")


# -- sleep, wake-up and weight sync ---------------------------------------------------------------


SYNC = Sampling(max_generate_length=12, temperature=0.8)


def test_level_one_sleep_keeps_the_weights(own_engine, prompts):
    before = own_engine.generate(prompts, SYNC, n=2, seed=4)
    own_engine.sleep(level=1)
    own_engine.wake_up(["weights"])
    assert flat(own_engine.generate(prompts, SYNC, n=2, seed=4)) == flat(before)


@pytest.mark.parametrize("wake_first", [False, True], ids=["sync", "wake-then-sync"])
def test_level_two_sleep_drops_weights_until_update(own_engine, prompts, wake_first):
    before = own_engine.generate(prompts, SYNC, n=2, seed=4)
    saved = {k: v.clone() for k, v in own_engine.model.state_dict().items()}
    own_engine.sleep(level=2)
    with pytest.raises(RuntimeError, match="asleep"):
        own_engine.generate(prompts, SYNC)
    if wake_first:
        own_engine.wake_up(["weights"])
    assert own_engine.update_weights(saved, version=7) == 7
    assert flat(own_engine.generate(prompts, SYNC, n=2, seed=4)) == flat(before)


def test_update_weights_changes_then_restores_the_output(own_engine, prompts):
    before = own_engine.generate(prompts, SYNC, n=2, seed=4)
    saved = {k: v.clone() for k, v in own_engine.model.state_dict().items()}
    own_engine.update_weights({k: v * 1.5 for k, v in saved.items()})
    assert flat(own_engine.generate(prompts, SYNC, n=2, seed=4)) != flat(before)
    own_engine.update_weights(saved)
    assert flat(own_engine.generate(prompts, SYNC, n=2, seed=4)) == flat(before)


def test_update_weights_with_a_missing_tensor_is_refused(own_engine, prompts):
    before = own_engine.generate(prompts, SYNC, n=1, seed=4)
    partial = {k: v * 2 for k, v in own_engine.model.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match="missing"):
        own_engine.update_weights(partial)
    assert flat(own_engine.generate(prompts, SYNC, n=1, seed=4)) == flat(before)


# -- the training batch -----------------------------------------------------------------------------

PAD = 99
ROLLOUTS = [
    Rollout([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], "stop", 1.0, group=0),
    Rollout([5, 6, 7, 8], [9], None, "length", 0.5, group=0),
    Rollout([4], [], None, "length", 0.0, group=1),
]


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_batch_layout(mask_truncated):
    b = to_batch(ROLLOUTS, PAD, mask_truncated=mask_truncated)
    assert b.prompt_len == 4
    assert b.input_ids.tolist() == [
        [PAD, PAD, 5, 6, 7, 8, 9],
        [5, 6, 7, 8, 9, PAD, PAD],
        [PAD, PAD, PAD, 4, PAD, PAD, PAD],
    ]
    assert b.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0, 0]]
    assert b.response_ids.tolist() == [[7, 8, 9], [9, PAD, PAD], [PAD, PAD, PAD]]
    truncated_row = [0, 0, 0] if mask_truncated else [1, 0, 0]
    assert b.loss_mask.tolist() == [[1, 1, 1], truncated_row, [0, 0, 0]]
    assert b.token_rewards.tolist() == [[0, 0, 1.0], [0.5, 0, 0], [0, 0, 0]]
    torch.testing.assert_close(b.rollout_logprobs, torch.tensor([[-0.1, -0.2, -0.3], [0, 0, 0], [0, 0, 0]]))
    assert b.group.tolist() == [0, 0, 1]


def _rows(count: int):
    rollouts = [
        Rollout([1] * (1 + i % 3), [2] * (1 + i % 4), None, "stop", float(i), group=i // 2) for i in range(count)
    ]
    return to_batch(rollouts, PAD)


def test_shards_are_equal_contiguous_blocks():
    b = _rows(6)
    parts = shards(b, 3)
    assert [p.group.tolist() for p in parts] == [[0, 0], [1, 1], [2, 2]]
    assert all(p.prompt_len == b.prompt_len for p in parts)
    assert torch.equal(torch.cat([p.input_ids for p in parts]), b.input_ids)
    with pytest.raises(ValueError, match="6 rows do not split over 4"):
        shards(b, 4)


def test_mini_batches_and_totals():
    b = _rows(5)
    minis = mini_batches(b, 2)
    assert [m.token_rewards.sum(-1).tolist() for m in minis] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    assert totals(b) == {"tokens": float(1 + 2 + 3 + 4 + 1), "sequences": 5.0}


SPLITS = [[8], [4, 4], [2, 2, 2, 2], [1, 3, 4], [5, 3], [1] * 8]


# A reduction over the whole mini-batch is weighed by the driver, not from totals: the ranks' shares of those add up
# in test_skyrl_algorithms.py (test_the_driver_weights_of_a_mini_batch_reduction_add_up_over_ranks).
@pytest.mark.parametrize("reduction", [r for r in LOSS_REDUCTIONS if not algorithms.REDUCTIONS[r].over_mini_batch])
def test_token_weights_add_up_to_the_whole_batch_loss(reduction):
    g = torch.Generator().manual_seed(0)
    rows, length, max_len = 8, 6, 10
    token_loss = torch.randn(rows, length, generator=g)
    mask = (torch.rand(rows, length, generator=g) < 0.6).float()
    mask[3] = 0  # a row without loss tokens still counts as a sequence
    whole = {"loss_mask": mask, "response_ids": torch.zeros(rows, length, dtype=torch.long), "loss": token_loss}
    t = {"tokens": float(mask.sum()), "sequences": float(rows)}  # what `totals` counts of a whole mini-batch
    expected = reduce_loss(token_loss, mask, reduction, max_seq_len=max_len)
    for split in SPLITS:
        total, start = torch.tensor(0.0), 0
        for size in split:
            piece = {k: v[start : start + size] for k, v in whole.items()}
            w = token_weights(
                piece["loss_mask"],
                reduction,
                total_tokens=t["tokens"],
                total_sequences=t["sequences"],
                max_seq_len=max_len,
            )
            total = total + (piece["loss"] * w).sum()
            start += size
        torch.testing.assert_close(total, expected, atol=1e-6, rtol=1e-5, msg=f"{reduction} over {split}")


def test_a_prompt_continuing_the_last_calls_prompt_runs_only_its_new_tokens(tiny_model, tokenizer, prompts, engine):
    cached = HFEngine(tiny_model, dtype="float32", device="cpu", tokenizer=tokenizer, prompt_cache_bytes=1 << 26)
    greedy = Sampling(max_generate_length=8, temperature=0.0)
    first = cached.generate(prompts, greedy, 1, 0)
    observation = tokenizer("so then", add_special_tokens=False).input_ids
    turns = [p + c[0].token_ids + observation for p, c in zip(prompts, first)]
    fresh = [tokenizer.pad_token_id, *prompts[0]]  # continues none of them
    assert [cached.prompts.lookup(p) is not None for p in [*turns, fresh]] == [True] * len(turns) + [False]
    # The next turn (a trajectory's context) samples what a whole prompt pass samples, with the same log-probs.
    got, want = (
        flat(cached.generate([*turns, fresh], greedy, 1, 0)),
        flat(engine.generate([*turns, fresh], greedy, 1, 0)),
    )
    assert [(ids, end) for ids, _, end in got] == [(ids, end) for ids, _, end in want]
    for (_, logprobs, _), (_, expected, _) in zip(got, want):
        assert logprobs == pytest.approx(expected, abs=1e-4)
    cached.finish_weight_update(1)  # keys and values of the old weights are of no use
    assert cached.prompts.lookup(turns[0]) is None
