"""trainer.logprobs_chunk_size and the Megatron entropy chunks (vocab_entropy_chunk_size, _memory_mb): the workers
score in those chunks and give the unchunked values; the automatic entropy chunk is SkyRL's own size."""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import run_ranks  # noqa: E402
from rlc.core.runtime_facts import LOGPROB_CHUNK_TOKENS, score_chunk  # noqa: E402

NINF = float("-inf")


def _skyrls_entropy_chunk(tokens: int, vocab: int, element_size: int, memory_mb: int) -> int:
    """SkyRL 0.4's automatic entropy chunk (vocab_entropy_chunk_size 0), as its model_utils documents it: the
    tokens whose logits, four times over, fit in the budget, rounded down to a power of two; the whole sequence
    when that is not shorter. (Its module does not import here: its pydantic models need a newer pydantic.)"""
    fit = max(1, min(tokens, memory_mb * 1024 * 1024 // (vocab * element_size * 4)))
    power = 1
    while power * 2 <= fit:
        power *= 2
    return power if power < tokens else tokens


@pytest.mark.parametrize("vocab", [1000, 151936, 37])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("memory_mb", [1, 512])
def test_the_automatic_entropy_chunk_is_skyrls(vocab, dtype, memory_mb):
    """vocab_entropy_chunk_size 0: SkyRL's size of the chunk on the same logits."""
    size = torch.empty(0, dtype=dtype).element_size()
    for tokens in (1, 7, 300, 5000):
        # within rlc's own bound on the scorer's chunks
        assert score_chunk(tokens, None, 0, memory_mb, vocab, size) == min(
            _skyrls_entropy_chunk(tokens, vocab, size, memory_mb), LOGPROB_CHUNK_TOKENS
        ), tokens
        assert score_chunk(tokens, 4096, 0, memory_mb, vocab, size) == score_chunk(
            tokens, None, 0, memory_mb, vocab, size
        )
        # a positive size is its own bound, null is none; the log-prob chunk bounds both
        assert score_chunk(tokens, 64, 5, memory_mb, vocab) == min(5, tokens)
        assert score_chunk(tokens, 64, None, memory_mb, vocab) == min(64, tokens)
        assert score_chunk(tokens, None, None) == min(tokens, LOGPROB_CHUNK_TOKENS)
    assert score_chunk(5000, None, 0, 1, 151936, 2) == 1  # a budget below one token's logits: one at a time


def _fsdp_rank(rank: int, world: int, port: int, q, model_path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model
    from test_fsdp import _batch_and_noise

    spec = default_model().to_typed({"version": 1, "trainer": {"algorithm": {"use_entropy_loss": True}}})
    settings = WorkerSettings("policy", model_path, micro_forward_batch_size=4, micro_train_batch_size=4)
    worker = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    batch, noise = _batch_and_noise(worker.model.config.vocab_size)
    before = {k: v.clone() for k, v in worker.model.state_dict().items()}
    out = {}
    for chunk in (1024, 2, 1):  # 1024: every token of a micro-batch at once; 2 and 1 split them
        worker.s = dataclasses.replace(settings, logprobs_chunk_size=chunk)
        logp = worker.forward(batch)
        batch.old_logprobs = logp + noise
        step = worker.train_mini_batch(batch, totals(batch))
        grads = {k: v.clone() for k, v in worker.model.state_dict().items()}  # the weights after the step
        worker.model.load_state_dict(before)
        out[chunk] = (logp, step, grads)
    q.put((rank, out))
    worker.shutdown()


def test_fsdp_chunks_give_the_unchunked_log_probs_entropy_and_step(tiny_model):
    out = run_ranks(_fsdp_rank, 1, tiny_model)[0]
    logp, step, weights = out[1024]
    for chunk in (2, 1):
        other_logp, other_step, other_weights = out[chunk]
        torch.testing.assert_close(other_logp, logp, rtol=1e-6, atol=1e-6)
        for key in ("policy_loss", "entropy", "grad_norm"):
            assert other_step[key] == pytest.approx(step[key], rel=1e-5, abs=1e-7), key
        for k in weights:
            torch.testing.assert_close(other_weights[k], weights[k], rtol=1e-5, atol=1e-6)
    assert step["entropy"] > 0 and step["grad_norm"] > 0  # the entropy and the gradient are there to compare


def _megatron_rank(rank: int, world: int, port: int, q) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from rlc.runtime.workers import megatron_cpu
    from rlc.runtime.workers.megatron import vocab_parallel_logprobs

    megatron_cpu.enable()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    g = torch.Generator().manual_seed(3)
    vocab, padded, rows, seq = 23, 24, 3, 9  # the vocabulary padded to divide by tp: a column no token gets
    logits = torch.randn(rows, seq, padded, generator=g, dtype=torch.float64) * 3
    logits[..., 2] = NINF  # a banned token
    targets = torch.randint(3, vocab, (rows, seq - 2), generator=g)
    positions = torch.arange(1, seq - 1)
    local = padded // world
    mine = logits[..., rank * local : (rank + 1) * local].contiguous()
    weights = torch.randn(rows, seq - 2, generator=g, dtype=torch.float64)
    out = {}
    for chunks in ((None, None, 512), (4, None, 512), (None, 2, 512), (1024, 0, 1), (3, 0, 512)):
        x = mine.clone().requires_grad_(True)
        logp, entropy = vocab_parallel_logprobs(x, targets, 0.7, vocab, True, positions=positions, chunks=chunks)
        ((logp * weights).sum() + entropy.sum()).backward()
        out[chunks] = (logp.detach(), entropy.detach(), x.grad)
    full = logits.clone().requires_grad_(True)
    log_p = torch.log_softmax(full[..., :vocab][:, positions] / 0.7, -1)
    exp_logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    exp_ent = -(log_p.exp() * torch.where(log_p > NINF, log_p, 0.0)).sum(-1)
    ((exp_logp * weights).sum() + exp_ent.sum()).backward()
    expected = (exp_logp.detach(), exp_ent.detach(), full.grad[..., rank * local : (rank + 1) * local])
    q.put((rank, (out, expected)))
    dist.destroy_process_group()


def test_megatron_chunks_give_the_full_log_softmax_over_a_split_vocabulary():
    """Two tensor ranks, each a half of the vocabulary: every chunking (log-probs, entropy, both, SkyRL's
    automatic entropy chunk on a budget of 1 MB) gives the values and gradients of one log-softmax."""
    pytest.importorskip("megatron.core")
    for out, expected in run_ranks(_megatron_rank, 2):
        for chunks, got in out.items():
            for a, b in zip(got, expected):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=str(chunks))


class _Passes:
    """The driver's split of a role's pass, each part's rows recorded where the workers would run them."""

    def __init__(self, **loop):
        from rlc.runtime.driver import Driver

        self.loop = dataclasses.make_dataclass("Loop", loop.keys())(**loop)
        self.parts: list[list[int]] = []
        self.split = Driver._forward.__get__(self)

    def _apply(self, ray, actions) -> None:
        pass

    class colocation:  # noqa: N801 - the driver's attribute
        @staticmethod
        def before_forward(role):
            return ()

    def _forward_rows(self, ray, role, batch, **options):
        self.parts.append(batch.input_ids[:, 0].tolist())
        return batch.input_ids[:, :1].float()


@pytest.mark.parametrize("per_mini_batch", [True, False])
def test_the_old_pass_runs_per_mini_batch_as_the_updates_split_the_batch(per_mini_batch):
    from rlc.runtime.batch import TrainBatch

    rows = 12
    batch = TrainBatch(
        input_ids=torch.arange(rows)[:, None].repeat(1, 3),
        attention_mask=torch.ones(rows, 3, dtype=torch.long),
        response_ids=torch.ones(rows, 1, dtype=torch.long),
        loss_mask=torch.ones(rows, 1),
        rollout_logprobs=torch.zeros(rows, 1),
        token_rewards=torch.zeros(rows, 1),
        group=torch.arange(rows) // 2,
        prompt_len=2,
    )
    passes = _Passes(
        old_pass_per_mini_batch=per_mini_batch,
        policy_mini_batch_size=2,
        critic_mini_batch_size=3,
        n_samples_per_prompt=2,
        step_wise=False,
    )
    for role, mini in (("policy", 4), ("ref", 4), ("critic", 6)):
        passes.parts.clear()
        out = passes.split(None, role, batch)
        assert out[:, 0].tolist() == list(range(rows))  # in the batch's order
        expected = [list(range(i, i + mini)) for i in range(0, rows, mini)] if per_mini_batch else [list(range(rows))]
        assert passes.parts == expected, role
