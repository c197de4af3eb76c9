"""FSDP2 workers: two gloo ranks that really shard give the same step as one rank on the same batch."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import run_ranks  # noqa: E402

ROWS, PROMPT, RESPONSE = 8, 5, 3


def _batch(vocab: int):
    return _batch_and_noise(vocab)[0]


def _batch_and_noise(vocab: int):
    """A policy batch, and noise for old log-probs that differ from the current ones."""
    from rlc.runtime.batch import TrainBatch

    g = torch.Generator().manual_seed(0)
    # Pairs of rows share a prompt, as a GRPO group does (micro-batches of two run each prompt once).
    prompt = torch.randint(4, vocab, (ROWS // 2, PROMPT), generator=g).repeat_interleave(2, dim=0)
    response = torch.randint(4, vocab, (ROWS, RESPONSE), generator=g)
    mask = torch.ones(ROWS, RESPONSE)
    mask[1, 2:] = 0  # rows of different lengths, so the weighting of tokens matters
    mask[5, 1:] = 0
    attention = torch.cat([torch.ones(ROWS, PROMPT, dtype=torch.long), mask.long()], dim=1)
    attention[2:4, :2] = 0  # left-padded prompts, as the driver makes them
    attention[6:8, :1] = 0
    batch = TrainBatch(
        input_ids=torch.cat([prompt, response], dim=1),
        attention_mask=attention,
        response_ids=response,
        loss_mask=mask,
        rollout_logprobs=torch.zeros(ROWS, RESPONSE),
        token_rewards=torch.zeros(ROWS, RESPONSE),
        group=torch.arange(ROWS) // 2,
        prompt_len=PROMPT,
        advantages=torch.randn(ROWS, RESPONSE, generator=g) * mask,
        ref_logprobs=-torch.rand(ROWS, RESPONSE, generator=g) * 5,
    )
    return batch, torch.randn(ROWS, RESPONSE, generator=g) * 0.05


def _rank(rank: int, world: int, port: int, q, model_path: str, out: str, fsdp_size: int = -1) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model

    spec = default_model().to_typed(
        {
            "version": 1,
            "trainer": {
                "policy": {"optimizer_config": {"lr": 1e-2}, "fsdp_config": {"fsdp_size": fsdp_size}},
                "algorithm": {
                    "use_kl_loss": True,
                    "kl_loss_coef": 0.1,
                    "use_entropy_loss": True,
                    "policy_loss_type": "dual_clip",
                },
            },
        }
    )
    settings = WorkerSettings(
        "policy", model_path, micro_train_batch_size=2, micro_forward_batch_size=3, total_optimizer_steps=4
    )
    worker = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    batch, noise = _batch_and_noise(worker.model.config.vocab_size)
    mine = shards(batch, world)[rank]
    old = worker.forward(mine)
    mine.old_logprobs = old + noise.chunk(world)[rank]  # ratios != 1, so the clipping is exercised
    metrics = worker.train_mini_batch(mine, totals(batch))
    full = worker.full_state_dict()
    if rank == 0:
        torch.save({"weights": full}, out)
    q.put((rank, metrics))
    worker.shutdown()


def _run(world: int, model_path: str, out: str, fsdp_size: int = -1) -> list[dict]:
    return run_ranks(_rank, world, model_path, out, fsdp_size)


@pytest.fixture(scope="module")
def steps(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("fsdp")
    # fsdp_size 1 of 2 ranks: hybrid sharding, each rank a whole replica (a 2-D replicate x shard mesh).
    return (
        _run(1, tiny_model, str(d / "one.pt")),
        {
            "two": _run(2, tiny_model, str(d / "two.pt")),
            "hybrid": _run(2, tiny_model, str(d / "hybrid.pt"), fsdp_size=1),
        },
        d,
    )


@pytest.mark.parametrize("layout", ["two", "hybrid"])
def test_two_ranks_match_one_rank(steps, layout):
    one, layouts, tmp_path = steps
    two = layouts[layout]
    for key in ("policy_loss", "kl", "entropy", "clip_fraction"):
        assert sum(m[key] for m in two) == pytest.approx(one[0][key], rel=1e-4, abs=1e-6), key
    assert two[0]["grad_norm"] == pytest.approx(one[0]["grad_norm"], rel=1e-4)
    w1 = torch.load(tmp_path / "one.pt")["weights"]
    w2 = torch.load(tmp_path / f"{layout}.pt")["weights"]
    assert w1.keys() == w2.keys()
    # AdamW's first step moves a weight by lr * g / (|g| + eps): where a gradient is float32 cancellation noise
    # (rlc:tiny has one of -1.8e-9 in layer 1's q_proj, under eps = 1e-8), the layouts' different summation orders
    # (~3e-11 apart there) move it lr * 3e-11 / eps ~ 2e-5 apart. The step's scale is checked by grad_norm above.
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=5e-5, msg=name)


def test_the_step_changes_the_weights(steps, tiny_model):
    from transformers import AutoModelForCausalLM

    tmp_path = steps[2]
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    after = torch.load(tmp_path / "one.pt")["weights"]
    changed = [n for n in after if not torch.equal(after[n], before[n])]
    assert len(changed) > len(after) // 2


def _packed_rank(rank: int, world: int, port: int, q, model_path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model

    spec = default_model().to_typed({"version": 1})
    worker = FSDPWorker(
        WorkerSettings("policy", model_path, micro_forward_batch_size=4, sample_packing=True),
        spec.trainer.policy,
        spec.trainer.algorithm,
        rank,
        world,
    )
    worker.setup("127.0.0.1", port)
    batch, noise = _batch_and_noise(worker.model.config.vocab_size)
    padded = worker.forward(batch)
    # The sum of squared probabilities the optimal token baselines read, from the model's own logits.
    with torch.no_grad():
        ids, attn = batch.input_ids[:, :-1], batch.attention_mask[:, :-1]
        logits = worker.model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0))
        probs = torch.softmax(logits.logits[:, PROMPT - 1 :].double(), -1)
    squares = {"expected": (probs**2).sum(-1).float(), "padded": worker.forward(batch, sum_pi_squared=True)}
    chosen = worker.packing  # sdpa on a CPU: packing is not chosen (it would cost more than it saves)
    worker.packing = True  # the packed path, as flash attention takes it
    packed = worker.forward(batch)
    squares["packed"] = worker.forward(batch, sum_pi_squared=True)
    batch.old_logprobs = padded + noise
    steps = []
    for packing in (False, True):  # a training step each way, from the same weights
        worker.packing = packing
        before = {k: v.clone() for k, v in worker.model.state_dict().items()}
        steps.append(worker.train_mini_batch(batch, totals(batch)))
        worker.model.load_state_dict(before)
    q.put((rank, (chosen, padded, packed, steps, squares)))
    worker.shutdown()


def test_packed_micro_batches_give_the_padded_log_probs_and_step(tiny_model):
    chosen, padded, packed, (padded_step, packed_step), squares = run_ranks(_packed_rank, 1, tiny_model)[0]
    assert not chosen
    mask = _batch(64).loss_mask.bool()
    torch.testing.assert_close(packed[mask], padded[mask], rtol=1e-5, atol=1e-5)
    # The policy's pass for the optimal token baselines: the same log-probs, and each token's sum of squares.
    for layout, logp in (("padded", padded), ("packed", packed)):
        both = squares[layout]
        torch.testing.assert_close(both[..., 0][mask], logp[mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(both[..., 1][mask], squares["expected"][mask], rtol=1e-4, atol=1e-5)
    for key in ("policy_loss", "entropy", "grad_norm"):
        assert packed_step[key] == pytest.approx(padded_step[key], rel=1e-4, abs=1e-6), key


def _shared_rank(rank: int, world: int, port: int, q, model_path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model

    spec = default_model().to_typed(
        {
            "version": 1,
            "trainer": {"policy": {"optimizer_config": {"lr": 1e-2}}, "algorithm": {"use_entropy_loss": True}},
        }
    )
    results = []
    for share in (True, False):
        # Micro-batches of 2 rows: rows 0-1 and 4-5 have no padded prompt (no mask at all), rows 2-3 and 6-7 do.
        worker = FSDPWorker(
            WorkerSettings("policy", model_path, micro_train_batch_size=2, micro_forward_batch_size=2),
            spec.trainer.policy,
            spec.trainer.algorithm,
            rank,
            world,
        )
        worker.setup("127.0.0.1", port)
        worker.share_prompts = share
        batch = _batch(worker.model.config.vocab_size)
        calls = []
        worker.model.register_forward_hook(
            lambda module, args, kwargs, out, calls=calls: calls.append(kwargs["input_ids"].shape), with_kwargs=True
        )
        logp = worker.forward(batch)
        reference = torch.zeros_like(logp)
        with torch.no_grad():  # each row alone, its padding cut off
            for i in range(ROWS):
                real = batch.attention_mask[i].bool()
                start = int(real[:PROMPT].sum()) - 1
                count = int(real[PROMPT:].sum())
                logits = worker.model(input_ids=batch.input_ids[i][real][None]).logits[0, start : start + count]
                reference[i, :count] = (
                    torch.log_softmax(logits, -1).gather(-1, batch.response_ids[i, :count, None]).squeeze(-1)
                )
        calls.clear()
        logp = worker.forward(batch)
        metrics = worker.train_mini_batch(batch, totals(batch))
        results.append((logp * batch.loss_mask, metrics, worker.full_state_dict(), calls, reference))
    q.put((rank, results))
    worker.shutdown()


def test_shared_prompts_give_the_whole_rows_loss_and_gradient(tiny_model):
    """Each distinct prompt of a micro-batch runs once and the rows attend to its gathered keys and values:
    the same log-probs, loss and updated weights as running every row whole."""
    (shared, whole) = run_ranks(_shared_rank, 1, tiny_model)[0]
    # Shared: a pass over a micro-batch's one distinct prompt, then one over its 2 responses; whole rows: one
    # pass of 2 rows, each without its last token (no response is scored at it).
    assert shared[3][:2] == [(1, PROMPT), (2, RESPONSE - 1)]
    assert whole[3][0] == (2, PROMPT + RESPONSE - 1)
    torch.testing.assert_close(shared[0], whole[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[0], shared[4], rtol=1e-5, atol=1e-5)  # = each row run alone, unpadded
    for key in ("policy_loss", "entropy", "grad_norm"):
        assert shared[1][key] == pytest.approx(whole[1][key], rel=1e-4, abs=1e-6), key
    # Adam's first step moves a weight by about lr * g / (|g| + eps): an element whose gradient is at rounding
    # level (near eps) moves by a rounding-dependent fraction of lr, so the bound is lr / 100, not 1e-5.
    for name, value in whole[2].items():
        torch.testing.assert_close(shared[2][name], value, rtol=1e-4, atol=1e-4, msg=name)


def _policy_worker(trainer: dict, settings, rank: int, world: int, port: int):
    """A set-up policy worker of a spec with these trainer settings."""
    from rlc.runtime.workers.fsdp import FSDPWorker
    from rlc.spec.model import default_model

    spec = default_model().to_typed({"version": 1, "trainer": trainer})
    worker = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    return worker


def _schedule_rank(rank: int, world: int, port: int, q, model_path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.fsdp import WorkerSettings

    optimizer = {"lr": 1e-2, "num_warmup_steps": 3, "scheduler": "linear"}
    settings = WorkerSettings("policy", model_path, micro_train_batch_size=4, total_optimizer_steps=6)
    worker = _policy_worker({"policy": {"optimizer_config": optimizer}}, settings, rank, world, port)
    batch = _batch(worker.model.config.vocab_size)
    poisoned = batch.select(slice(None))
    poisoned.advantages = batch.advantages.clone()
    poisoned.advantages[0, 0] = float("nan")  # a token in the loss: the gradient is NaN
    steps = []
    for b in (batch, poisoned, batch, batch):
        metrics = worker.train_mini_batch(b, totals(b))
        steps.append((metrics["lr"], metrics["skipped"], worker.full_state_dict()))
    q.put((rank, steps))
    worker.shutdown()


def test_warmup_starts_at_zero_and_a_skipped_step_does_not_advance_the_schedule(tiny_model):
    """As SkyRL (Hugging Face's linear schedule): the first step's lr is 0, so it moves nothing; a step whose
    gradient is not finite changes nothing and leaves the schedule where it was."""
    from transformers import AutoModelForCausalLM

    steps = run_ranks(_schedule_rank, 1, tiny_model)[0]
    assert [lr for lr, _, _ in steps] == pytest.approx([0.0, 1e-2 / 3, 1e-2 / 3, 2e-2 / 3])
    assert [skipped for _, skipped, _ in steps] == [0.0, 1.0, 0.0, 0.0]
    before = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    first, second, third = (s[2] for s in steps[:3])
    assert all(torch.equal(first[n], before[n]) for n in first)  # lr 0
    assert all(torch.equal(second[n], first[n]) for n in first)  # skipped
    assert any(not torch.equal(third[n], second[n]) for n in first)


def _deterministic_rank(rank: int, world: int, port: int, q, model_path: str, deterministic: bool) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model

    spec = default_model().to_typed({"version": 1, "trainer": {"deterministic": deterministic}})
    settings = WorkerSettings("policy", model_path, micro_train_batch_size=2, deterministic=deterministic)
    worker = FSDPWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    batch, noise = _batch_and_noise(worker.model.config.vocab_size)
    mine = shards(batch, world)[rank]
    steps = []
    for _ in range(2):  # two optimizer steps, the second from the weights the first left
        mine.old_logprobs = worker.forward(mine) + noise.chunk(world)[rank]
        steps.append(worker.train_mini_batch(mine, totals(batch)))
    weights = worker.full_state_dict()
    q.put((rank, (torch.are_deterministic_algorithms_enabled(), steps, weights if rank == 0 else None)))
    worker.shutdown()


def test_trainer_deterministic_makes_two_runs_of_two_steps_equal_bit_for_bit(tiny_model):
    """trainer.deterministic turns on torch's deterministic algorithms in the rank, and two runs of two steps give
    the same metrics and weights exactly (the engines' sampling is seeded either way)."""
    first = run_ranks(_deterministic_rank, 1, tiny_model, True)
    second = run_ranks(_deterministic_rank, 1, tiny_model, True)
    assert all(flag for flag, _, _ in first)
    assert [steps for _, steps, _ in first] == [steps for _, steps, _ in second]
    for name, tensor in first[0][2].items():
        assert torch.equal(tensor, second[0][2][name]), name
