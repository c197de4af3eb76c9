"""The Megatron policy's multi-token-prediction (MTP) heads (trainer.mtp) on the CPU, on a tiny Qwen2 checkpoint with
MiMo-named head weights (`model.mtp_layers.0.*`) built here.

The draft loss is SkyRL's own function's value and gradient; the loss a step reports is SkyRL's formula computed
independently (MiMo's head run with transformers' Qwen2 layer, the policy's logits from transformers); the heads
alone learn from it, the policy's update is the same as without heads at loss_weight 0; two tensor ranks step as
one does; the heads leave under MiMo's names and a checkpoint restores them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from conftest import run_ranks  # noqa: E402
from test_fsdp import _batch_and_noise  # noqa: E402

HEADS = "model.mtp_layers.0."
CLIP = 0.5


@pytest.fixture(scope="module")
def mimo_like(tiny_model, tmp_path_factory) -> str:
    """A two-layer Qwen2 with one MTP head under MiMo's names (random weights), and rlc:tiny's tokenizer."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    d = tmp_path_factory.mktemp("mimo") / "model"
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        num_nextn_predict_layers=1,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(d)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tiny_model, name), d / name)
    state = load_file(d / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    h = config.hidden_size
    layer = {k.removeprefix("model.layers.0."): v for k, v in state.items() if k.startswith("model.layers.0.")}
    for k, v in layer.items():
        state[HEADS + k] = v + 0.05 * torch.randn(v.shape, generator=g)
    for k in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        state[HEADS + k + ".weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    state[HEADS + "input_proj.weight"] = 0.05 * torch.randn(h, 2 * h, generator=g)
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})
    return str(d)


def _spec(tp: int, weight: float, topk: int | None):
    from rlc.spec.model import default_model

    mc = {"tensor_model_parallel_size": tp, "mtp_loss_topk": topk, "dist_ckpt_optim_fully_reshardable": True}
    return default_model().to_typed(
        {
            "version": 1,
            "trainer": {
                "strategy": "megatron",
                "mtp": {"enabled": True, "loss_weight": weight},
                "policy": {
                    "optimizer_config": {"lr": 1e-2, "weight_decay": 0.0, "max_grad_norm": CLIP},
                    "megatron_config": mc,
                },
                "algorithm": {"use_kl_loss": False, "policy_loss_type": "regular"},
            },
        }
    )


def _rank(rank, world, port, q, model_path, tp, weight, topk, ckpt) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker

    spec = _spec(tp, weight, topk)
    settings = WorkerSettings(
        "policy",
        model_path,
        strategy="megatron",
        micro_train_batch_size=4,
        micro_forward_batch_size=4,
        mtp_loss_weight=None if weight is None else weight,
    )
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    batch, noise = _batch_and_noise(64)
    old = worker.forward(batch)
    if world > 1:  # the collecting rank's log-probs on every rank
        import torch.distributed as dist

        found: list = [None] * world
        dist.all_gather_object(found, old)
        old = next(o for o in found if o.numel())
    before = worker.full_state_dict()
    metrics = worker.train_mini_batch(dataclasses.replace(batch, old_logprobs=old + noise), totals(batch))
    after = worker.full_state_dict()
    result = {"metrics": metrics, "names": [m.name for m in worker.weight_metas()]}
    if ckpt:
        worker.save_checkpoint(ckpt)
        second = worker.train_mini_batch(dataclasses.replace(batch, old_logprobs=old + noise), totals(batch))
        worker.load_checkpoint(ckpt)
        again = worker.train_mini_batch(dataclasses.replace(batch, old_logprobs=old + noise), totals(batch))
        result.update(second=second, again=again)
    if rank == 0:
        result.update(before=before, after=after)
    q.put((rank, result))


@pytest.fixture(scope="module")
def runs(mimo_like, tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp-runs")
    return {
        "one": run_ranks(_rank, 1, mimo_like, 1, 0.5, None, str(d / "ckpt"))[0],
        "tp2": run_ranks(_rank, 2, mimo_like, 2, 0.5, None, None)[0],
        "topk": run_ranks(_rank, 1, mimo_like, 1, 0.5, 5, None)[0],
        "zero": run_ranks(_rank, 1, mimo_like, 1, 0.0, None, None)[0],
        "plain": run_ranks(_rank, 1, mimo_like, 1, None, None, None)[0],
    }


@functools.cache
def _skyrl_soft_ce():
    """SkyRL 0.4.0's mtp/soft_ce.py, read from the installed package by file: importing it by name runs SkyRL's
    package start-up, which needs Python 3.12 (pydantic's TypedDicts). Its one SkyRL import, masked_mean, is read
    the same way."""
    import importlib.metadata
    import importlib.util
    import sys

    try:
        root = importlib.metadata.distribution("skyrl").locate_file("skyrl")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("skyrl is not installed")
    helper = "skyrl.backends.skyrl_train.utils.torch_utils"

    def load(name: str, rel: str):
        spec = importlib.util.spec_from_file_location(name, os.path.join(str(root), rel))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    saved = sys.modules.get(helper)
    sys.modules[helper] = load(helper, "backends/skyrl_train/utils/torch_utils.py")
    try:
        return load("skyrl_soft_ce", "backends/skyrl_train/mtp/soft_ce.py")
    finally:  # soft_ce holds masked_mean itself: the name is not left behind for other tests
        if saved is None:
            del sys.modules[helper]
        else:
            sys.modules[helper] = saved


def test_the_draft_loss_is_skyrls_value_and_gradient():
    from rlc.runtime.workers.megatron_mtp import draft_loss

    sk = _skyrl_soft_ce()
    g = torch.Generator().manual_seed(3)
    teacher = torch.randn(3, 9, 11, generator=g)
    mask = torch.ones(3, 9)
    mask[0, :2] = 0  # left padding
    mask[2, 6:] = 0  # a short row
    for topk, chunk in ((None, None), (None, 4), (4, None)):
        mine = torch.randn(3, 9, 11, generator=g, requires_grad=True)
        theirs = mine.detach().clone().requires_grad_(True)
        ours = draft_loss([mine], teacher, mask, topk=topk, chunk=chunk)
        layer_mask = sk.shift_mask_for_mtp(mask, 0)
        if topk:
            ref = sk.draft_soft_ce_topk(theirs, teacher, layer_mask, k=topk, roll_shift=1)
        else:
            ref = sk.draft_soft_ce(theirs, sk.build_teacher_logits(teacher, 0), layer_mask, chunk_size=chunk)
        ours.backward()
        ref.backward()
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(mine.grad, theirs.grad)


def _independent_draft_loss(model_path: str, weights: dict) -> float:
    """SkyRL's draft loss of the checkpoint's head on the test batch, with MiMo's head run by transformers' Qwen2
    layer on the Hugging Face model's final hidden states (the loss at the step's start: its weights `weights`)."""
    from transformers import AutoConfig, Qwen2ForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm

    sk = _skyrl_soft_ce()
    config = AutoConfig.from_pretrained(model_path)
    lm = Qwen2ForCausalLM(config)
    lm.load_state_dict({k: v for k, v in weights.items() if not k.startswith(HEADS)})
    layer = Qwen2DecoderLayer(config, 0)
    layer.load_state_dict({k.removeprefix(HEADS): v for k, v in weights.items() if k.startswith(HEADS)}, strict=False)
    norms = {}
    for k in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        norms[k] = Qwen2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        norms[k].weight.data = weights[HEADS + k + ".weight"]
    batch, _ = _batch_and_noise(64)
    ids, attn = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        out = lm(input_ids=ids, attention_mask=attn, output_hidden_states=True)
        hidden = out.hidden_states[-1]  # after the final norm, as the drafter gets it
        nxt = torch.roll(ids, -1, dims=1)  # position t: the token at t + 1 with the hidden state at t
        x = torch.cat([norms["hidden_layernorm"](hidden), norms["token_layernorm"](lm.model.embed_tokens(nxt))], -1)
        x = x @ weights[HEADS + "input_proj.weight"].T
        positions = torch.arange(ids.shape[1])[None].expand_as(ids)
        rope = lm.model.rotary_emb(x, positions)
        keep = attn.bool()
        causal = torch.tril(torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool))
        mask4 = (causal[None] & keep[:, None, :])[:, None]
        bias = torch.zeros(mask4.shape).masked_fill(~mask4, torch.finfo(torch.float32).min)
        x = layer(x, attention_mask=bias, position_embeddings=rope, position_ids=positions)
        x = x[0] if isinstance(x, tuple) else x
        student = lm.lm_head(norms["final_layernorm"](x))
    return float(
        sk.draft_soft_ce(student, sk.build_teacher_logits(out.logits, 0), sk.shift_mask_for_mtp(attn.float(), 0))
    )


def test_the_step_reports_skyrls_draft_loss_of_the_checkpoints_head(runs, mimo_like):
    one = runs["one"]
    expected = _independent_draft_loss(mimo_like, one["before"])
    assert one["metrics"]["mtp_loss"] == pytest.approx(expected, rel=2e-3)
    assert runs["topk"]["metrics"]["mtp_loss"] != pytest.approx(expected, rel=1e-3)  # top-5 of 64 is another loss


def test_only_the_heads_learn_from_the_draft_loss(runs):
    plain, zero, one = runs["plain"], runs["zero"], runs["one"]
    # max_grad_norm 0.5 clips this step: the heads' gradients are clipped apart, as SkyRL clips them
    assert plain["metrics"]["grad_norm"] > CLIP
    assert one["metrics"]["grad_norm"] == pytest.approx(plain["metrics"]["grad_norm"], rel=1e-5)
    assert not any(k.startswith(HEADS) for k in plain["after"])
    for k, v in plain["after"].items():  # the policy's update is the same with heads or without, at any weight
        torch.testing.assert_close(zero["after"][k], v, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(one["after"][k], v, rtol=1e-4, atol=1e-6)
    heads = [k for k in one["after"] if k.startswith(HEADS)]
    assert heads and [k for k in heads if torch.equal(one["after"][k], one["before"][k])] == []
    assert all(torch.equal(zero["after"][k], zero["before"][k]) for k in heads)  # weight 0: no gradient


def test_two_tensor_ranks_step_as_one(runs):
    one, tp2 = runs["one"], runs["tp2"]
    assert tp2["metrics"]["mtp_loss"] == pytest.approx(one["metrics"]["mtp_loss"], rel=1e-4)
    for k, v in one["after"].items():
        torch.testing.assert_close(tp2["after"][k], v, rtol=1e-3, atol=1e-4)  # Adam's first step: lr * sign


def test_the_heads_leave_under_mimos_names(runs, mimo_like):
    from safetensors.torch import load_file

    saved = load_file(os.path.join(mimo_like, "model.safetensors"))
    one = runs["one"]
    assert set(one["before"]) == set(saved) == set(one["names"])
    for k, v in saved.items():  # the conversion both ways is the checkpoint itself
        torch.testing.assert_close(one["before"][k], v.float())


def test_a_checkpoint_restores_the_heads(runs):
    one = runs["one"]
    assert one["again"]["mtp_loss"] == pytest.approx(one["second"]["mtp_loss"], rel=1e-6)
    assert one["again"]["grad_norm"] == pytest.approx(one["second"]["grad_norm"], rel=1e-6)
