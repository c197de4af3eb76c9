"""Ulysses sequence parallelism and token-budget micro-batches in the fsdp2 workers: gloo ranks that split every
row over a sequence-parallel group (and cut micro-batches by tokens) give the policy, the critic and the ref the
same outputs, losses and step as one rank with fixed-size micro-batches on the same batch."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import run_ranks  # noqa: E402

ROWS, PROMPT, RESPONSE = 8, 7, 6
LR = 1e-2
PROMPT_PADDING = [0, 0, 3, 3, 0, 1, 4, 0]  # left padding of each row's prompt
RESPONSES = [6, 1, 4, 6, 2, 6, 5, 1]  # real response tokens: rows of very different lengths


def _batch(vocab: int):
    """A policy and critic batch of uneven rows; pairs of rows share a prompt, as a GRPO group does."""
    from rlc.runtime.batch import TrainBatch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, vocab, (ROWS // 2, PROMPT), generator=g).repeat_interleave(2, dim=0)
    response = torch.randint(4, vocab, (ROWS, RESPONSE), generator=g)
    mask = (torch.arange(RESPONSE)[None] < torch.tensor(RESPONSES)[:, None]).float()
    prompt_real = (torch.arange(PROMPT)[None] >= torch.tensor(PROMPT_PADDING)[:, None]).long()
    attention = torch.cat([prompt_real, mask.long()], dim=1)
    ids = torch.cat([prompt * prompt_real, response * mask.long()], dim=1)
    return TrainBatch(
        input_ids=ids,
        attention_mask=attention,
        response_ids=response * mask.long(),
        loss_mask=mask,
        rollout_logprobs=torch.zeros(ROWS, RESPONSE),
        token_rewards=torch.zeros(ROWS, RESPONSE),
        group=torch.arange(ROWS) // 2,
        prompt_len=PROMPT,
        advantages=torch.randn(ROWS, RESPONSE, generator=g) * mask,
        ref_logprobs=-torch.rand(ROWS, RESPONSE, generator=g) * 5,
        returns=torch.randn(ROWS, RESPONSE, generator=g) * mask,
        old_values=torch.zeros(ROWS, RESPONSE),
    )


def _rank(rank: int, world: int, port: int, q, model_path: str, sp: int, budget: int, packing: bool, recompute: bool):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.fsdp import FSDPWorker, WorkerSettings
    from rlc.spec.model import default_model

    spec = default_model().to_typed(
        {
            "version": 1,
            "trainer": {
                "policy": {"optimizer_config": {"lr": LR}},
                "critic": {"optimizer_config": {"lr": LR}},
                "algorithm": {"use_kl_loss": True, "kl_loss_coef": 0.1, "use_entropy_loss": True},
            },
        }
    )
    out: dict = {}
    for role in ("policy", "critic", "ref"):
        settings = WorkerSettings(
            role,
            model_path,
            micro_train_batch_size=2,
            micro_forward_batch_size=3,
            total_optimizer_steps=4,
            sequence_parallel_size=sp,
            max_tokens_per_microbatch=budget,
            gradient_checkpointing=recompute,
        )
        worker = FSDPWorker(settings, getattr(spec.trainer, role), spec.trainer.algorithm, rank, world)
        worker.setup("127.0.0.1", port)  # the first role's set-up starts the process group; the others reuse it
        worker.packing = packing  # the packed path, as flash attention takes it (sdpa on a CPU: not chosen)
        out["layout"] = worker.layout()
        batch = _batch(worker.model.config.vocab_size)
        mine = shards(batch, out["layout"]["dp_size"])[out["layout"]["dp_rank"]]
        if role == "policy":
            out["logp"] = worker.forward(mine)
            out["squares"] = worker.forward(mine, sum_pi_squared=True)[..., 1]  # the optimal token baselines' pass
            noise = 0.05 * torch.sin(torch.arange(ROWS * RESPONSE, dtype=torch.float32)).view(ROWS, RESPONSE)
            # Old log-probs off the current ones: ratios != 1, so the clipping is exercised.
            mine.old_logprobs = out["logp"] + noise.chunk(out["layout"]["dp_size"])[out["layout"]["dp_rank"]]
            out["policy"] = worker.train_mini_batch(mine, totals(batch))
            out["weights"] = worker.full_state_dict()
        elif role == "critic":  # the value head starts at zero: values and the backbone's gradient show from step 2
            out["critic"] = [worker.train_mini_batch(mine, totals(batch))]
            out["values"] = worker.forward(mine)
            out["critic"].append(worker.train_mini_batch(mine, totals(batch)))
        else:
            out["ref"] = worker.forward(mine)
    q.put((rank, out))
    worker.shutdown()


def _sum(metrics: list[dict]) -> dict:
    """Metrics of the data-parallel groups as the driver adds them: loss shares summed, the optimizer's taken once."""
    return {k: metrics[0][k] if k in ("grad_norm", "lr", "skipped") else sum(m[k] for m in metrics) for k in metrics[0]}


def _run(world: int, model: str, sp: int = 1, budget: int = -1, packing: bool = False) -> dict:
    """The run as the driver sees it: each data-parallel group's results from its collecting rank. Split runs
    recompute activations in backward (gradient checkpointing, the spec's default), which runs the all-to-alls
    again there."""
    results = run_ranks(_rank, world, model, sp, budget, packing, sp > 1)
    picked = sorted((r for r in results if r["layout"]["collect"]), key=lambda r: r["layout"]["dp_rank"])
    assert len(picked) == world // sp
    from transformers import AutoModelForCausalLM

    return {
        "initial": AutoModelForCausalLM.from_pretrained(model).state_dict(),
        **{key: torch.cat([r[key] for r in picked]) for key in ("logp", "squares", "values", "ref")},
        "policy": _sum([r["policy"] for r in picked]),
        "critic": [_sum([r["critic"][step] for r in picked]) for step in range(2)],
        "weights": results[0]["weights"],
    }


def _same(run: dict, reference: dict) -> None:
    mask = _batch(64).loss_mask.bool()
    for key in ("logp", "squares", "values", "ref"):
        torch.testing.assert_close(run[key][mask], reference[key][mask], rtol=1e-4, atol=1e-5, msg=key)
    for key in ("policy_loss", "kl", "entropy", "clip_fraction", "grad_norm"):
        assert run["policy"][key] == pytest.approx(reference["policy"][key], rel=1e-4, abs=1e-6), key
    for step, (got, want) in enumerate(zip(run["critic"], reference["critic"])):
        for key in ("critic_loss", "grad_norm"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-7), (step, key)
    assert reference["values"][mask].abs().min() > 0  # the critic's first step made its values depend on the rows
    # AdamW's first step moves a weight by lr * g / (|g| + eps): where a gradient is float32 cancellation noise, well
    # under eps = 1e-8, layouts that sum in another order move it differently (see test_fsdp.py). Elsewhere they agree.
    before = reference["initial"]
    for name, weight in reference["weights"].items():
        off = ~torch.isclose(run["weights"][name], weight, rtol=1e-4, atol=5e-5)
        assert ((weight - before[name])[off].abs() < LR / 10).all(), name


@pytest.fixture(scope="module")
def llama(tiny_model):
    return _run(1, tiny_model)


def test_two_sequence_parallel_ranks_match_one_rank(llama, tiny_model):
    """sp = 2 (one data-parallel group, every row split in two), rlc:tiny (4 heads, 2 key/value heads)."""
    _same(_run(2, tiny_model, sp=2), llama)


def test_data_and_sequence_parallel_with_a_token_budget_match_one_rank(llama, tiny_model):
    """4 ranks: 2 data-parallel groups of 2 sequence-parallel ranks, micro-batches cut at 18 tokens. The groups'
    rows cut into 4 and 3 micro-batches: the second group runs a row with no loss to keep pace with the first."""
    from rlc.runtime.workers.micro_batches import by_tokens, lengths

    halves = [_batch(64).select(slice(0, 4)), _batch(64).select(slice(4, 8))]
    assert [len(by_tokens(*lengths(half), 18, packed=False)) for half in halves] == [4, 3]
    _same(_run(4, tiny_model, sp=2, budget=18), llama)


@pytest.fixture(scope="module")
def qwen2_mqa(tmp_path_factory) -> str:
    """A Qwen2 decoder whose single key/value head cannot split over 2 ranks: it is repeated."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    path = tmp_path_factory.mktemp("qwen2-mqa")
    Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)


def test_packed_rows_over_two_ranks_match_padded_rows_on_one(qwen2_mqa):
    """The packed path (one row of all the micro-batch's tokens, its sequences kept apart in the split attention)
    with sp = 2 and a token budget, against one rank's padded rows."""
    _same(_run(2, qwen2_mqa, sp=2, budget=24, packing=True), _run(1, qwen2_mqa))
