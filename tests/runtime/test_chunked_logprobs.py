"""`score_tokens`: chunked log-probs and entropy against the full log-softmax they replace.

Values and gradients must be the full computation's (`log_softmax(logits.float() / T)` gathered at the ids, and
its entropy) for any chunk size, temperature, -inf logits and scored subset of rows; and no [tokens, vocab]
float32 tensor may be created or saved for backward, which the full computation does.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.algorithms.losses import (  # noqa: E402
    entropy_from_logits,
    score_tokens,
    token_log_probs,
)
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

NINF = float("-inf")


def full_scores(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0):
    """What the runtime computed before chunking: a whole float32 (or wider) log-softmax over the vocabulary."""
    x = logits if logits.dtype == torch.float64 else logits.float()
    log_p = torch.log_softmax(x / temperature, dim=-1)
    logp = log_p.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    # p log p is 0 at banned tokens. (The runtime's old form, p * clamp(log p), gave them a NaN gradient once the
    # entropy's incoming gradient times the lowest float overflowed.)
    entropy = -(log_p.exp() * torch.where(log_p > NINF, log_p, 0.0)).sum(-1)
    return logp, entropy


def _inputs(shape, vocab, dtype, seed=0, banned=True):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, vocab, generator=g, dtype=torch.float64) * 3).to(dtype)
    if banned:  # a few banned tokens per position, never the chosen one
        logits[..., :3] = NINF
    ids = torch.randint(3, vocab, shape, generator=g)
    return logits, ids


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_match_the_full_log_softmax(chunk, temperature):
    logits, ids = _inputs((2, 5), 11, torch.float64)  # 10 tokens: chunks of 3, 4 and 7 leave a remainder
    weights = torch.randn(2, 5, dtype=torch.float64)
    ent_weights = torch.randn(2, 5, dtype=torch.float64)

    def run(fn):
        x = logits.clone().requires_grad_()
        logp, ent = fn(x)
        ((logp * weights).sum() + (ent * ent_weights).sum()).backward()
        return logp.detach(), ent.detach(), x.grad

    got = run(lambda x: score_tokens(x, ids, temperature, entropy=True, chunk=chunk))
    want = run(lambda x: full_scores(x, ids, temperature))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert torch.all(got[2][..., :3] == 0)  # banned tokens get no gradient


@pytest.mark.parametrize("entropy", [False, True])
def test_gradcheck(entropy):
    logits, ids = _inputs((7,), 6, torch.float64, seed=1, banned=False)
    logits[2, 1] = NINF  # gradcheck perturbs it to -inf +- eps: still -inf, so the gradient there stays 0

    def fn(x):
        logp, ent = score_tokens(x, ids, 1.3, entropy=entropy, chunk=3)
        return (logp, ent) if entropy else logp

    assert torch.autograd.gradcheck(fn, (logits.requires_grad_(),))


def test_only_the_log_probs_or_the_entropy_carry_a_gradient():
    logits, ids = _inputs((9,), 8, torch.float64, seed=2)
    full_logp, full_ent = full_scores(logits, ids)
    for pick in (0, 1):
        x = logits.clone().requires_grad_()
        score_tokens(x, ids, entropy=True, chunk=4)[pick].sum().backward()
        y = logits.clone().requires_grad_()
        full_scores(y, ids)[pick].sum().backward()
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-10, atol=1e-12)
    # without the entropy asked for, its input gradient is log-probs' only
    x = logits.clone().requires_grad_()
    logp, ent = score_tokens(x, ids, chunk=4)
    assert ent is None
    torch.testing.assert_close(logp, full_logp)
    del full_ent


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_half_and_single_precision_inputs_match_the_upcast_reference(dtype):
    logits, ids = _inputs((3, 37), 50, dtype, seed=3)
    weights = torch.randn(3, 37)
    x = logits.clone().requires_grad_()
    logp, ent = score_tokens(x, ids, 0.9, entropy=True, chunk=16)
    assert logp.dtype == ent.dtype == torch.float32
    ((logp * weights).sum() + ent.sum()).backward()
    y = logits.clone().requires_grad_()
    want_logp, want_ent = full_scores(y, ids, 0.9)
    ((want_logp * weights).sum() + want_ent.sum()).backward()
    torch.testing.assert_close(logp, want_logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, want_ent, rtol=1e-5, atol=1e-5)
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad, y.grad)  # both rounded once to `dtype` from float32


def test_a_banned_chosen_token_scores_minus_infinity():
    logits = torch.tensor([[0.0, NINF, 1.0], [2.0, 0.0, NINF]], dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([1, 0])
    logp, ent = score_tokens(logits, ids, entropy=True)
    want_logp, want_ent = full_scores(logits.detach(), ids)
    assert logp[0].item() == NINF
    torch.testing.assert_close(logp, want_logp)
    torch.testing.assert_close(ent, want_ent)


def test_rows_score_a_subset_without_copying_it_out():
    """`rows` scores positions of a model's output in place; the gradient lands on those rows only."""
    logits, ids = _inputs((4, 6), 9, torch.float64, seed=4)
    rows = torch.tensor([[1, 2, 3], [13, 14, 22]])  # flat positions of [4 * 6, vocab]
    targets = ids.view(-1)[rows]
    x = logits.clone().requires_grad_()
    logp, ent = score_tokens(x, targets, 1.5, entropy=True, rows=rows, chunk=4)
    (logp.sum() + ent.sum()).backward()
    y = logits.clone().requires_grad_()
    picked = y.view(-1, 9)[rows]
    want_logp, want_ent = full_scores(picked, targets, 1.5)
    (want_logp.sum() + want_ent.sum()).backward()
    torch.testing.assert_close(logp, want_logp)
    torch.testing.assert_close(ent, want_ent)
    torch.testing.assert_close(x.grad, y.grad)
    assert x.grad.view(-1, 9)[0].abs().sum() == 0


@pytest.mark.parametrize("scored", ["all", "rows"])
def test_inplace_backward_writes_the_same_gradient_over_the_logits(scored):
    """The workers' mode: the head's logits become their own gradient, so training holds one [tokens, vocab] tensor."""
    logits, ids = _inputs((4, 6), 9, torch.bfloat16, seed=9)
    rows = torch.tensor([[1, 2, 3], [13, 14, 22]]) if scored == "rows" else None
    targets = ids.view(-1)[rows] if rows is not None else ids
    grads = []
    for inplace in (False, True):
        leaf = logits.clone().requires_grad_()
        head = leaf * 1  # a non-leaf, as a model head's output is
        logp, ent = score_tokens(head, targets, 0.7, entropy=True, rows=rows, chunk=4, inplace_backward=inplace)
        (logp.sum() + 0.1 * ent.sum()).backward()
        grads.append((leaf.grad, head))
    (reference, untouched), (grad, overwritten) = grads
    torch.testing.assert_close(grad, reference, rtol=0, atol=0)
    torch.testing.assert_close(overwritten.detach(), reference, rtol=0, atol=0)  # the logits' memory holds it
    assert torch.equal(untouched.detach(), logits)
    if rows is not None:
        assert grad.view(-1, 9)[0].abs().sum() == 0  # an unscored row's old logits are not left as its gradient


def test_inplace_backward_on_logits_another_node_saved_fails_loudly():
    logits, ids = _inputs((5,), 7, torch.float32, seed=10)
    leaf = logits.clone().requires_grad_()
    head = leaf * 1
    squared = head.pow(2).sum()  # pow saves the logits; its backward runs after the scorer's (created earlier)
    logp, _ = score_tokens(head, ids, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (logp.sum() + squared).backward()


def test_strided_slices_and_the_old_entry_points():
    logits, ids = _inputs((2, 8), 12, torch.float32, seed=5)
    part = logits[:, 3:]  # not viewable as [tokens, vocab]
    want_logp, want_ent = full_scores(part, ids[:, 3:], 2.0)
    torch.testing.assert_close(token_log_probs(part, ids[:, 3:], 2.0), want_logp)
    torch.testing.assert_close(entropy_from_logits(part, 2.0), want_ent)


def test_bad_arguments_are_refused():
    logits, ids = _inputs((4,), 5, torch.float32)
    with pytest.raises(ValueError, match="temperature"):
        score_tokens(logits, ids, 0.0)
    with pytest.raises(ValueError, match="chunk"):
        score_tokens(logits, ids, chunk=0)
    with pytest.raises(ValueError, match="do not match"):
        score_tokens(logits, ids[:3])


def test_vocabulary_padding_columns_get_no_probability():
    """Megatron pads the vocabulary to divide by tp: columns at or past vocab_size are not tokens."""
    logits, ids = _inputs((6,), 10, torch.float64, seed=6, banned=False)
    ids = ids.clamp(max=7)
    x = logits.clone().requires_grad_()
    logp, ent = score_tokens(x, ids, entropy=True, vocab_size=8, chunk=4)
    (logp.sum() + ent.sum()).backward()
    y = logits[:, :8].clone().requires_grad_()
    want_logp, want_ent = full_scores(y, ids)
    (want_logp.sum() + want_ent.sum()).backward()
    torch.testing.assert_close(logp, want_logp)
    torch.testing.assert_close(ent, want_ent)
    torch.testing.assert_close(x.grad[:, :8], y.grad)
    assert torch.all(x.grad[:, 8:] == 0)


# ---- memory: nothing [tokens, vocab] in float32 -------------------------------------------------------------


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (of `dtype`, or any) any operation creates, forward and backward, in elements."""

    def __init__(self, dtype=None):
        super().__init__()
        self.dtype, self.largest = dtype, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and self.dtype in (None, t.dtype):
                self.largest = max(self.largest, t.numel())
        return out


def _saved_float32(fn):
    """The largest float32 tensor saved for backward while `fn` runs its forward."""
    sizes = [0]

    def pack(t):
        if t.dtype == torch.float32:
            sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return max(sizes), out


@pytest.mark.parametrize("entropy", [False, True])
def test_float32_work_space_is_a_chunk_not_the_whole_micro_batch(entropy):
    tokens, vocab, chunk = 96, 64, 16
    logits, ids = _inputs((tokens,), vocab, torch.bfloat16, seed=7)

    def measure(fn):
        x = logits.clone().requires_grad_()
        with LargestTensor(torch.float32) as mode:
            saved, (logp, ent) = _saved_float32(lambda: fn(x))
            (logp.sum() + (ent.sum() if entropy else 0)).backward()
        return mode.largest, saved

    largest, saved = measure(lambda x: score_tokens(x, ids, 0.8, entropy=entropy, chunk=chunk))
    assert largest <= chunk * vocab
    assert saved <= tokens  # only per-token values: the log-sum-exp and the entropy
    # The full log-softmax this replaces makes and saves [tokens, vocab] float32 tensors: the check can fail.
    full_largest, full_saved = measure(lambda x: full_scores(x, ids, 0.8))
    assert full_largest >= tokens * vocab and full_saved >= tokens * vocab


def _vocab_parallel_rank(rank, world, port, q):
    """This rank's half of a 10-column vocabulary padded to 12 (the last 2 columns are not tokens)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    logits, ids = _inputs((2, 5), 12, torch.float64, seed=8)
    ids = ids.clamp(max=9)
    x = logits[..., rank * 6 : (rank + 1) * 6].clone().requires_grad_()
    logp, ent = score_tokens(
        x,
        ids.view(-1)[torch.tensor([1, 2, 4, 8])],
        0.9,
        entropy=True,
        rows=torch.tensor([1, 2, 4, 8]),
        chunk=3,
        vocab_start=rank * 6,
        vocab_size=10,
        group=dist.group.WORLD,
    )
    (logp.sum() + 0.3 * ent.sum()).backward()
    q.put((rank, (logp.detach().numpy(), ent.detach().numpy(), x.grad.numpy())))
    dist.destroy_process_group()


def test_vocabulary_parallel_ranks_give_the_whole_vocabularys_scores_and_their_slice_of_the_gradient():
    from conftest import run_ranks

    results = run_ranks(_vocab_parallel_rank, 2)
    logits, ids = _inputs((2, 5), 12, torch.float64, seed=8)
    ids = ids.clamp(max=9)
    rows = torch.tensor([1, 2, 4, 8])
    y = logits[..., :10].clone().requires_grad_()
    want_logp, want_ent = full_scores(y.view(-1, 10)[rows], ids.view(-1)[rows], 0.9)
    (want_logp.sum() + 0.3 * want_ent.sum()).backward()
    for rank, (logp, ent, grad) in enumerate(results):
        torch.testing.assert_close(torch.from_numpy(logp), want_logp)
        torch.testing.assert_close(torch.from_numpy(ent), want_ent)
        grad = torch.from_numpy(grad)
        cols = slice(rank * 6, min(rank * 6 + 6, 10))
        torch.testing.assert_close(grad[..., : cols.stop - cols.start], y.grad[..., cols])
        assert torch.all(grad[..., cols.stop - cols.start :] == 0)
