"""Context parallelism's pieces (`runtime/workers/megatron_cp.py`), without Megatron: the split of a row over
the ranks of a context group, the mask of each rank's queries, and the gather and sum whose gradients must
come back to the rank that owns each token. The whole step under cp=2 is checked in test_megatron.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import run_ranks  # noqa: E402
from rlc.runtime.workers import megatron_cp as cp_utils  # noqa: E402


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_ranks_hold_every_position_once_and_the_same_attention_work(cp):
    seq = cp_utils.padded_length(13, cp)
    assert seq % (2 * cp) == 0 and 13 <= seq < 13 + 2 * cp
    held = [cp_utils.local_positions(seq, cp, r) for r in range(cp)]
    assert sorted(torch.cat(held).tolist()) == list(range(seq))
    work = {int((h + 1).sum()) for h in held}  # a causal query at position p attends to p + 1 keys
    assert len(work) == 1
    assert torch.equal(cp_utils.gathered_positions(seq, cp), torch.cat(held))


def test_each_ranks_mask_is_its_rows_of_the_whole_mask():
    cp, seq = 2, 8
    attn = torch.ones(3, seq, dtype=torch.long)
    attn[1, :3] = 0  # left padding
    attn[2, 6:] = 0  # right padding
    whole = ~(torch.ones(seq, seq, dtype=torch.bool).tril()[None, None] & attn.bool()[:, None, None, :])
    keys = cp_utils.gathered_positions(seq, cp)
    for rank in range(cp):
        queries = cp_utils.local_positions(seq, cp, rank)
        mine = cp_utils.attention_mask(attn, cp, rank)
        assert mine.shape == (3, 1, seq // cp, seq)
        assert torch.equal(mine, whole[:, :, queries][:, :, :, keys])


def _attention_rank(rank: int, world: int, port: int, q, seq: int) -> None:
    """Causal attention over a context group of `world` ranks (keys gathered, log-probs summed) and its gradients."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x, w = _inputs(seq)
    mine = cp_utils.local_positions(seq, world, rank)
    xs = x[mine].detach().requires_grad_()
    keys = cp_utils.gather_sequence(xs @ w, dist.group.WORLD)
    allowed = cp_utils.gathered_positions(seq, world)[None, :] <= mine[:, None]
    out = (xs @ keys.T).masked_fill(~allowed, float("-inf")).softmax(-1) @ keys
    total = cp_utils.response_values(out.sum(-1)[None], mine, 0, seq, dist.group.WORLD)[0]
    (total**2).sum().backward()
    grads = [torch.empty_like(xs.grad) for _ in range(world)]
    dist.all_gather(grads, xs.grad)
    whole = torch.empty(seq, xs.shape[1])
    whole[cp_utils.gathered_positions(seq, world)] = torch.cat(grads)
    q.put((rank, {"total": total.detach().numpy(), "grad": whole.numpy()}))
    dist.destroy_process_group()


def _inputs(seq: int):
    g = torch.Generator().manual_seed(0)
    return torch.randn(seq, 4, generator=g), torch.randn(4, 4, generator=g)


def test_gathered_keys_and_summed_values_give_the_single_rank_gradients():
    seq = 8
    x, w = _inputs(seq)
    x.requires_grad_()
    keys = x @ w
    out = (x @ keys.T).masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf")).softmax(-1) @ keys
    total = out.sum(-1)
    (total**2).sum().backward()
    for rank, got in enumerate(run_ranks(_attention_rank, 2, seq)):
        torch.testing.assert_close(torch.from_numpy(got["total"]), total.detach(), msg=f"rank {rank}")
        torch.testing.assert_close(torch.from_numpy(got["grad"]), x.grad, msg=f"rank {rank}")
