"""`score_from_hidden` (trainer.fused_lm_head_logprob): log-probs from hidden states and the head's weight.

Values and gradients (hidden states and weight) must be the plain path's, scoring the whole logits `hidden @ W.T`
with `score_tokens`, for any chunk and temperature, on one rank and with the vocabulary split over two; equal to
SkyRL 0.4's own fused op where the installed package imports; and no [tokens, vocab] tensor may exist at once.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.algorithms.fused_head import score_from_hidden  # noqa: E402
from rlc.runtime.algorithms.losses import score_tokens  # noqa: E402
from test_chunked_logprobs import LargestTensor  # noqa: E402

TOKENS, HIDDEN, VOCAB = 10, 6, 12


def _inputs(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 5, HIDDEN, generator=g, dtype=torch.float64).to(dtype)
    weight = (torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64) * 0.7).to(dtype)
    ids = torch.randint(0, VOCAB, (2, 5), generator=g)
    return hidden, weight, ids


def _run(fn, hidden, weight, side: bool):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logp, extra = fn(h, w)
    g = torch.Generator().manual_seed(1)
    loss = (logp * torch.randn(logp.shape, generator=g, dtype=logp.dtype)).sum()
    loss.backward()
    return [logp.detach(), h.grad, w.grad] + ([extra] if side else [])


@pytest.mark.parametrize("chunk", [1, 3, 7, None])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("side", ["entropy", "sum_pi_squared"])
def test_values_and_gradients_match_scoring_the_whole_logits(chunk, temperature, side):
    hidden, weight, ids = _inputs()
    flags = {side: True}
    got = _run(lambda h, w: score_from_hidden(h, w, ids, temperature, chunk=chunk, **flags), hidden, weight, True)
    want = _run(lambda h, w: score_tokens(h @ w.t(), ids, temperature, chunk=None, **flags), hidden, weight, True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-12)


def test_rows_score_a_subset_and_padding_columns_get_no_probability():
    hidden, weight, ids = _inputs(seed=3)
    ids = ids.clamp(max=9)  # 10 real tokens, 2 padding columns
    rows = torch.tensor([1, 2, 4, 8])
    picked = ids.view(-1)[rows]
    got = _run(
        lambda h, w: score_from_hidden(h, w, picked, 0.9, rows=rows, chunk=3, vocab_size=10, entropy=True),
        hidden,
        weight,
        True,
    )
    want = _run(
        lambda h, w: score_tokens((h.reshape(-1, HIDDEN) @ w.t())[rows][:, :10], picked, 0.9, chunk=None, entropy=True),
        hidden,
        weight,
        True,
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-12)
    assert torch.all(got[2][10:] == 0)  # padding rows of the head learn nothing


def test_bfloat16_inputs_match_the_plain_path():
    hidden, weight, ids = _inputs(seed=5, dtype=torch.bfloat16)
    got = _run(lambda h, w: score_from_hidden(h, w, ids, 0.7, chunk=4), hidden, weight, False)
    want = _run(lambda h, w: score_tokens(h @ w.t(), ids, 0.7, chunk=None), hidden, weight, False)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


def test_the_whole_logits_never_exist():
    tokens, hidden_size, vocab, chunk = 96, 8, 64, 16
    g = torch.Generator().manual_seed(2)
    h = torch.randn(tokens, hidden_size, generator=g).requires_grad_()
    w = torch.randn(vocab, hidden_size, generator=g).requires_grad_()
    ids = torch.randint(0, vocab, (tokens,), generator=g)

    def largest(fn):
        with LargestTensor() as mode:
            fn().sum().backward()
        return mode.largest

    assert largest(lambda: score_from_hidden(h, w, ids, chunk=chunk)[0]) <= chunk * vocab
    # The plain path makes [tokens, vocab] logits: the check can fail.
    assert largest(lambda: score_tokens(h @ w.t(), ids, chunk=chunk)[0]) >= tokens * vocab


def test_bad_arguments_are_refused():
    hidden, weight, ids = _inputs()
    with pytest.raises(ValueError, match="not both"):
        score_from_hidden(hidden, weight, ids, entropy=True, sum_pi_squared=True)
    with pytest.raises(ValueError, match="temperature"):
        score_from_hidden(hidden, weight, ids, 0.0)
    with pytest.raises(ValueError, match="do not match"):
        score_from_hidden(hidden, weight, ids[:, :2])


def _skyrl_op(root: str):
    """SkyRL 0.4's torch backend (FusedLinearChunkedDistributedLogprob), read from its files: the package's start-up
    (skyrl.backends) needs Python 3.12 (pydantic's TypedDicts). Called in a rank's own process, so the module it
    registers is not left behind for other tests."""
    import importlib.util
    import sys

    def load(name: str, rel: str):
        spec = importlib.util.spec_from_file_location(name, f"{root}/backends/skyrl_train/{rel}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load("skyrl.backends.skyrl_train.utils.packed_tensor", "utils/packed_tensor.py")
    return load("skyrl_model_utils", "distributed/megatron/model_utils.py").FusedLinearChunkedDistributedLogprob


def _vocab_parallel_rank(rank, world, port, q, skyrl_root):
    """This rank's half of the head (6 rows of 12, the last 2 columns padding), the same hidden states on both; and
    SkyRL's op against rlc's on the same halves (no padding: SkyRL's vocabulary divides by tp)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group, half = dist.group.WORLD, slice(rank * 6, (rank + 1) * 6)
    hidden, weight, ids = _inputs(seed=8)
    ids = ids.clamp(max=9)
    h = hidden.clone().requires_grad_()
    w = weight[half].clone().requires_grad_()
    logp, ent = score_from_hidden(
        h, w, ids, 0.9, chunk=3, vocab_start=rank * 6, vocab_size=10, group=group, entropy=True
    )
    logp.sum().backward()
    result = {"rlc": (logp.detach().numpy(), ent.numpy(), h.grad.numpy(), w.grad.numpy())}
    if skyrl_root is not None:
        op = _skyrl_op(skyrl_root)
        hidden, weight, ids = _inputs(seed=4, dtype=torch.float32)  # SkyRL works in float32 whatever the inputs

        def skyrl(h, w):
            # SkyRL scores position i's target at i, and applies the temperature by dividing the weight
            return op.apply(h, w / 0.8, ids, rank * 6, rank * 6 + 6, 3, group, False), None

        def mine(h, w):
            return score_from_hidden(h, w, ids, 0.8, chunk=4, vocab_start=rank * 6, group=group)

        got, want = _run(mine, hidden, weight[half], False), _run(skyrl, hidden, weight[half], False)
        result["skyrl"] = [(a.numpy(), b.numpy()) for a, b in zip(got, want, strict=True)]
    q.put((rank, result))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks():
    import importlib.metadata
    import importlib.util

    from conftest import run_ranks

    try:
        root = str(importlib.metadata.distribution("skyrl").locate_file("skyrl"))
    except importlib.metadata.PackageNotFoundError:
        root = None
    if importlib.util.find_spec("megatron") is None:  # SkyRL's module imports Megatron-Core's parallel state
        root = None
    return run_ranks(_vocab_parallel_rank, 2, root)


def test_vocabulary_parallel_ranks_give_the_whole_vocabularys_scores_and_share_the_gradient(two_ranks):
    hidden, weight, ids = _inputs(seed=8)
    ids = ids.clamp(max=9)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    want_logp, want_ent = score_tokens(h @ w[:10].t(), ids, 0.9, entropy=True, chunk=None)
    want_logp.sum().backward()
    hidden_grad = 0
    for rank, result in enumerate(two_ranks):
        logp, ent, h_grad, w_grad = result["rlc"]
        torch.testing.assert_close(torch.from_numpy(logp), want_logp.detach())
        torch.testing.assert_close(torch.from_numpy(ent), want_ent.detach())
        torch.testing.assert_close(torch.from_numpy(w_grad), w.grad[rank * 6 : (rank + 1) * 6])
        hidden_grad = hidden_grad + torch.from_numpy(h_grad)
    torch.testing.assert_close(hidden_grad, h.grad)  # the output layer sums the ranks' shares


def test_equal_to_skyrls_fused_op_on_two_tensor_ranks(two_ranks):
    if "skyrl" not in two_ranks[0]:
        pytest.skip("skyrl or megatron-core is not installed")
    for result in two_ranks:
        for a, b in result["skyrl"]:  # log-probs, the hidden states' share of the gradient, the weight's
            torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), rtol=1e-5, atol=1e-6)
