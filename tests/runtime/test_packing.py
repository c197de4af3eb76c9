"""Sample packing: bookkeeping, and packed forward/backward equal to the padded one on tiny random models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from rlc.runtime.algorithms.losses import token_log_probs  # noqa: E402
from rlc.runtime.batch import Rollout, TrainBatch, to_batch  # noqa: E402
from rlc.runtime.workers.fsdp import ValueModel  # noqa: E402
from rlc.runtime.workers.packing import pack, packed_forward, packed_kwargs, packing_unsupported, unpack  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config  # noqa: E402

PAD = 0
SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def _model(family: str, attn: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "llama":
        cfg = LlamaConfig(**SIZES)
    elif family == "qwen2":
        cfg = Qwen2Config(**SIZES)
    else:  # qwen2 with every layer a short sliding window: the packed sliding-window mask path
        cfg = Qwen2Config(**SIZES, use_sliding_window=True, sliding_window=3, max_window_layers=0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32).eval()


def _batch(shape: list[tuple[int, int]], seed: int = 1) -> TrainBatch:
    """A padded batch of rows with (prompt length, response length) each, random tokens in 1..63."""
    g = torch.Generator().manual_seed(seed)
    rows = [
        Rollout(
            prompt_ids=torch.randint(1, 64, (p,), generator=g).tolist(),
            response_ids=torch.randint(1, 64, (n,), generator=g).tolist(),
            logprobs=None,
            finish_reason="stop",
            reward=0.0,
            group=i,
        )
        for i, (p, n) in enumerate(shape)
    ]
    return to_batch(rows, PAD)


def _padded_logp(model, b: TrainBatch) -> torch.Tensor:
    """The FSDP worker's padded forward (`_outputs`)."""
    ids, attn = b.input_ids, b.attention_mask
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    start, length = b.prompt_len - 1, b.response_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits[:, start : start + length]
    return token_log_probs(logits, b.response_ids)


def _packed_logp(model, b: TrainBatch, **kwargs) -> torch.Tensor:
    packed = pack(b.input_ids, b.attention_mask, b.prompt_len)
    logits = unpack(packed_forward(model, packed, **kwargs).logits, packed, b.response_ids.shape[1])
    return token_log_probs(logits, b.response_ids)


MIXED = [(3, 4), (6, 1), (1, 6), (5, 2)]  # left padding of 3, 0, 5, 1 and right padding of 2, 5, 0, 4
MODELS = [(f, a) for f in ("llama", "qwen2", "qwen2-sliding") for a in ("sdpa", "eager")]


def test_pack_unpack_bookkeeping():
    b = _batch([(2, 3), (4, 0), (1, 2)])  # P = 4, R = 3; the middle response is empty
    ids = b.input_ids
    packed = pack(ids, b.attention_mask, b.prompt_len)
    assert packed.input_ids.tolist() == [ids[0, 2:7].tolist() + ids[1, 0:4].tolist() + ids[2, 3:6].tolist()]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]]
    assert packed.starts.tolist() == [0, 5, 9]
    assert packed.lengths.tolist() == [5, 4, 3]
    assert packed.prompt_lens.tolist() == [2, 4, 1]
    assert packed.cu_seqlens.tolist() == [0, 5, 9, 12] and packed.cu_seqlens.dtype == torch.int32
    assert packed.max_len == 5
    # Unpacking the packed positions themselves shows which position predicts each response token.
    where = torch.arange(12.0).view(1, 12, 1).expand(1, 12, 2)
    out = unpack(where, packed, 3, fill=-1.0)
    assert out.shape == (3, 3, 2)
    assert out[..., 0].tolist() == [[1, 2, 3], [-1, -1, -1], [9, 10, -1]]
    assert torch.equal(out[..., 0], out[..., 1])
    # The predicted token is the one after the predicting position: the response token itself.
    flat = packed.input_ids[0]
    for i in range(3):
        for j in range(3):
            if out[i, j, 0] >= 0:
                assert flat[int(out[i, j, 0]) + 1] == b.response_ids[i, j]
    # (1, T) in -> (rows, R) out, and the padded worker's positions are the packed ones at real tokens.
    assert unpack(torch.arange(12.0).view(1, 12), packed, 3).shape == (3, 3)
    positions = (b.attention_mask.cumsum(-1) - 1).clamp(min=0)
    assert torch.equal(positions[b.attention_mask.bool()], packed.position_ids[0])


def test_unpack_is_differentiable_and_fills_with_zero_gradient():
    b = _batch([(2, 3), (4, 0), (1, 2)])
    packed = pack(b.input_ids, b.attention_mask, b.prompt_len)
    per_token = torch.randn(1, 12, 5, requires_grad=True)
    unpack(per_token, packed, 3, fill=7.0).sum().backward()
    used = torch.zeros(12)
    used[[1, 2, 3, 9, 10]] = 1  # the predicting positions; nothing else (fills included) gets a gradient
    assert torch.equal(per_token.grad[0], used[:, None].expand(12, 5))


@pytest.mark.parametrize("family,attn", MODELS)
def test_packed_log_probs_match_padded(family, attn):
    model = _model(family, attn)
    b = _batch(MIXED)
    with torch.no_grad():
        padded, packed = _padded_logp(model, b), _packed_logp(model, b)
        varlen = _packed_logp(model, b, varlen=True)  # flash kwargs are ignored by sdpa/eager
    mask = torch.arange(b.response_ids.shape[1]) < torch.tensor([n for _, n in MIXED])[:, None]
    assert torch.allclose(packed[mask], padded[mask], atol=1e-5, rtol=0)
    assert torch.equal(varlen, packed)
    assert packing_unsupported(model.config) is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_critic_path_matches_padded(attn):
    """The decoder (last_hidden_state) with the same kwargs, and the worker's ValueModel as it is built there."""
    lm = _model("qwen2", attn)
    decoder = lm.get_decoder()
    b = _batch(MIXED)
    ids, attn_mask, P, R = b.input_ids, b.attention_mask, b.prompt_len, b.response_ids.shape[1]
    positions = (attn_mask.cumsum(-1) - 1).clamp(min=0)
    mask = torch.arange(R) < torch.tensor([n for _, n in MIXED])[:, None]
    packed = pack(ids, attn_mask, P)
    with torch.no_grad():
        padded = decoder(input_ids=ids, attention_mask=attn_mask, position_ids=positions).last_hidden_state
        hidden = unpack(decoder(**packed_kwargs(packed)).last_hidden_state, packed, R)
        assert torch.allclose(hidden[mask], padded[:, P - 1 : P - 1 + R][mask], atol=1e-5, rtol=0)
        assert (hidden[~mask] == 0).all()

        lm.config.use_cache = False  # as FSDPWorker._build_model does; ValueModel.forward takes no use_cache
        critic = ValueModel(lm, "value_head")
        torch.nn.init.normal_(critic.value_head.weight)
        padded_values = critic(input_ids=ids, attention_mask=attn_mask, position_ids=positions)[:, P - 1 : P - 1 + R]
        values = unpack(packed_forward(critic, packed, no_cache=False), packed, R)
    assert torch.allclose(values[mask], padded_values[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family,attn", [("llama", "sdpa"), ("qwen2", "eager")])
def test_packed_gradients_match_padded(family, attn):
    model = _model(family, attn)
    b = _batch(MIXED)
    weights = torch.rand(b.response_ids.shape, generator=torch.Generator().manual_seed(2))
    weights = weights * (torch.arange(weights.shape[1]) < torch.tensor([n for _, n in MIXED])[:, None])

    def grads(logp_fn) -> dict[str, torch.Tensor]:
        model.zero_grad()
        (logp_fn(model, b) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    padded, packed = grads(_padded_logp), grads(_packed_logp)
    assert padded.keys() == packed.keys()
    for name in padded:
        assert torch.allclose(packed[name], padded[name], atol=1e-5, rtol=1e-5), name
    assert any(g.abs().sum() > 0 for g in packed.values())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_without_packing_kwargs_sequences_attend_to_each_other(attn):
    """The test above can fail: dropping the restarting positions or the None mask lets rows see each other."""
    model = _model("llama", attn)
    b = _batch(MIXED)
    packed = pack(b.input_ids, b.attention_mask, b.prompt_len)
    R = b.response_ids.shape[1]
    mask = torch.arange(R) < torch.tensor([n for _, n in MIXED])[:, None]
    with torch.no_grad():
        reference = _padded_logp(model, b)

        def logp(**kwargs) -> torch.Tensor:
            logits = unpack(model(input_ids=packed.input_ids, **kwargs).logits, packed, R)
            return token_log_probs(logits, b.response_ids)

        right = logp(attention_mask=None, position_ids=packed.position_ids, use_cache=False)
        one_sequence = logp(
            attention_mask=None, position_ids=torch.arange(packed.input_ids.shape[1])[None], use_cache=False
        )
        full_mask = logp(
            attention_mask=torch.ones_like(packed.input_ids), position_ids=packed.position_ids, use_cache=False
        )
        with_cache = logp(attention_mask=None, position_ids=packed.position_ids, use_cache=True)
    assert torch.allclose(right[mask], reference[mask], atol=1e-5, rtol=0)
    for wrong in (one_sequence, full_mask, with_cache):
        # The first row attends only to itself either way; every later row sees the rows before it.
        assert torch.allclose(wrong[0][mask[0]], reference[0][mask[0]], atol=1e-5, rtol=0)
        for i in range(1, len(MIXED)):
            assert (wrong[i][mask[i]] - reference[i][mask[i]]).abs().max() > 1e-3


def test_packing_unsupported_flags_unsafe_configs():
    cfg = LlamaConfig(**SIZES)
    cfg._attn_implementation = "sdpa"
    assert packing_unsupported(cfg) is None
    cfg._attn_implementation = "paged|sdpa"
    assert "attention implementation" in packing_unsupported(cfg)
    cfg = Qwen2Config(**SIZES)
    cfg._attn_implementation = "flash_attention_2"
    assert packing_unsupported(cfg) is None
    cfg.layer_types = ["linear_attention", "full_attention"]
    assert "linear_attention" in packing_unsupported(cfg)
    cfg.layer_types = ["full_attention", "full_attention"]
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, 1, 2]}
    assert "RoPE" in packing_unsupported(cfg)
