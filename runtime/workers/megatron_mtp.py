"""Multi-token-prediction (MTP) heads of the Megatron policy (trainer.mtp, SkyRL 0.4's draft-head training).

A checkpoint with MTP heads (MiMo's `model.mtp_layers.{i}.*`, `num_nextn_predict_layers` in its config) gets
Megatron-Core's MTP block (`MultiTokenPredictionBlock`, one `MultiTokenPredictionLayer` per head) beside the
GPTModel's decoder. The block has its own copy of the TransformerConfig with `mtp_num_layers` set: the GPTModel's
own config keeps it unset, so the model's forward neither runs the block nor adds Megatron's hard-label MTP loss;
the worker replays the block on the decoder's detached output instead (`Heads.capture`, `Heads.student_logits`).

The draft loss is SkyRL's: a soft cross-entropy of each head's logits against the policy's own next-token
distribution at the position the head predicts (the policy's logits rolled left by depth + 1, detached), over the
real tokens whose target is real too, masked-mean per micro-batch, averaged over the heads; with `mtp_loss_topk`
only the teacher's top-k tokens (each tensor rank's own top-k, renormalised over their union) are distilled. The
trunk, the re-embedding, the output weight and the teacher are detached, so the loss trains the heads alone.

Weights: MiMo's names (`model.mtp_layers.{i}.` + token_layernorm, hidden_layernorm, input_proj, final_layernorm, and
a Qwen2 decoder layer's self_attn / mlp / norms), which vLLM's MiMo MTP drafter loads, map to the block's
(`mtp.layers.{i}.` + enorm, hnorm, eh_proj, final_layernorm, transformer_layer.*). MiMo's input_proj takes
[hidden, embedding], Megatron's eh_proj [embedding, hidden]: the two column halves swap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlc.runtime.workers import megatron_weights as mw

__all__ = ["Heads", "draft_loss", "head_count", "hf_config", "megatron_to_hf", "tp_split_dim"]

_MTP = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_HF_MTP = "model.mtp_layers."
# Megatron's leaf <-> MiMo's leaf, besides the decoder layer (transformer_layer.*)
_OWN = {
    "enorm.weight": "token_layernorm.weight",
    "hnorm.weight": "hidden_layernorm.weight",
    "eh_proj.weight": "input_proj.weight",
    "final_layernorm.weight": "final_layernorm.weight",
}


def head_count(hf_config: Any, configured: int | None) -> int:
    """The heads to build: megatron_config.mtp_num_layers, else the checkpoint's (MiMo's num_nextn_predict_layers,
    Qwen3.5's mtp_num_hidden_layers)."""
    if configured is not None:
        return int(configured)
    for attr in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        n = getattr(hf_config, attr, None)
        if n:
            return int(n)
    return 0


def hf_config(model_path: str) -> Any:
    """MiMo's config as the Qwen2 config of its trunk (transformers has no `mimo` model type: MiMo's own code is remote,
    and the trunk is Qwen2's), its head count kept; None for any other model (AutoConfig reads it)."""
    root = Path(model_path)
    if root.is_dir():
        path = root / "config.json"
    else:
        # deferred: huggingface_hub, only for a hub id the driver did not resolve to a directory
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(model_path, "config.json"))
    raw = json.loads(path.read_text()) if path.exists() else {}
    if raw.get("model_type") != "mimo":
        return None
    # deferred: transformers' Qwen2 config, only for MiMo
    from transformers import Qwen2Config

    raw = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "auto_map")}
    return Qwen2Config(**raw, architectures=["Qwen2ForCausalLM"])


def _swap_halves(w: torch.Tensor) -> torch.Tensor:
    """[a | b] -> [b | a] along the input dimension (MiMo's input_proj <-> Megatron's eh_proj)."""
    h = w.shape[1] // 2
    return torch.cat([w[:, h:], w[:, :h]], dim=1).contiguous()


def tp_split_dim(name: str, conversion: Any = mw) -> int | None:
    """Dim along which tensor parallelism splits a Megatron parameter (the MTP block's included); the trunk's through
    its family's `conversion`."""
    name = name.removeprefix("module.")
    m = _MTP.match(name)
    if m is None:
        return conversion.tp_split_dim(name)
    leaf = m.group(2)
    if leaf == "eh_proj.weight":
        return 0
    if leaf in _OWN:
        return None
    return mw.tp_split_dim("decoder.layers.0." + leaf.removeprefix("transformer_layer."))


def megatron_to_hf(name: str, shards: list, layout: mw.Layout, conversion: Any = mw) -> list[tuple[str, torch.Tensor]]:
    """Hugging Face (name, tensor) pairs of one Megatron parameter, the MTP block's under MiMo's names; the trunk's
    through its family's `conversion`."""
    name = name.removeprefix("module.")
    m = _MTP.match(name)
    if m is None:
        return conversion.megatron_to_hf(name, shards, layout)
    i, leaf = m.groups()
    prefix = f"{_HF_MTP}{i}."
    if leaf == "eh_proj.weight":
        return [(prefix + _OWN[leaf], _swap_halves(torch.cat([s.detach() for s in shards])))]
    if leaf in _OWN:
        return [(prefix + _OWN[leaf], shards[0].detach())]
    pairs = mw.megatron_to_hf("decoder.layers.0." + leaf.removeprefix("transformer_layer."), shards, layout)
    return [(prefix + n.removeprefix("model.layers.0."), t) for n, t in pairs]


def hf_to_megatron(heads: dict, trunk: dict, layout: mw.Layout, count: int, tp_rank: int, tp: int) -> dict:
    """The MTP block's Megatron state (`mtp.layers.{i}.*`, this tensor rank's shard) from MiMo's head weights
    (`heads`: model.mtp_layers.* names); `trunk` lends the embedding and norm a one-layer conversion needs."""
    out: dict[str, torch.Tensor] = {}
    one = dataclasses.replace(layout, num_layers=1)
    for i in range(count):
        prefix = f"{_HF_MTP}{i}."
        mine = {k.removeprefix(prefix): v for k, v in heads.items() if k.startswith(prefix)}
        missing = [v for v in _OWN.values() if v not in mine]
        if missing:
            raise RuntimeError(f"the checkpoint has no {prefix}{missing[0]} for MTP head {i}")
        layer = {f"model.layers.0.{k}": v for k, v in mine.items() if k not in _OWN.values()}
        state = mw.hf_to_megatron(
            {
                **layer,
                "model.embed_tokens.weight": trunk["model.embed_tokens.weight"],
                "model.norm.weight": mine["final_layernorm.weight"],
            },
            dataclasses.replace(one, tied=True),
            tp_rank,
            tp,
        )
        for k, v in state.items():
            if k.startswith("decoder.layers.0."):
                out[f"mtp.layers.{i}.transformer_layer.{k.removeprefix('decoder.layers.0.')}"] = v
        for mg, hf in _OWN.items():
            t = mine[hf]
            if mg == "eh_proj.weight":
                t = _swap_halves(t).chunk(tp, 0)[tp_rank].contiguous()
            out[f"mtp.layers.{i}.{mg}"] = t
    return out


def read_heads(model_path: str) -> dict[str, torch.Tensor]:
    """The checkpoint's `model.mtp_layers.*` tensors (AutoModelForCausalLM drops them: the Qwen2 model has none)."""
    # deferred: safetensors ships with transformers, which the worker imports; read here only with MTP on
    from safetensors import safe_open

    root = Path(model_path)
    if not root.is_dir():
        # deferred: huggingface_hub, only for a hub id the driver did not resolve to a directory
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(model_path, allow_patterns=["*.safetensors", "*.json"]))
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted({f for k, f in weight_map.items() if k.startswith(_HF_MTP)})
    else:
        files = [p.name for p in sorted(root.glob("*.safetensors"))]
    out: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(os.fspath(root / name), framework="pt") as f:
            for key in f.keys():
                if key.startswith(_HF_MTP):
                    out[key] = f.get_tensor(key).float()
    return out


def split_heads(state: dict) -> tuple[dict, dict]:
    """A Hugging Face state dict as (the trunk's tensors, the MTP heads')."""
    heads = {k: v for k, v in state.items() if k.startswith(_HF_MTP)}
    return {k: v for k, v in state.items() if not k.startswith(_HF_MTP)}, heads


# -- the draft loss ------------------------------------------------------------------------------------------------


def _reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


class _SoftCrossEntropy(torch.autograd.Function):
    """-sum_v softmax(teacher)_v log softmax(student)_v per token over a vocabulary split across `group`; its
    gradient w.r.t. the student's logits is softmax(student) - softmax(teacher)."""

    @staticmethod
    def forward(ctx, student, teacher, group):
        def normalised(x: torch.Tensor) -> torch.Tensor:  # global log-softmax
            top = _reduce(x.amax(-1, keepdim=True), dist.ReduceOp.MAX, group)
            total = _reduce((x - top).exp().sum(-1, keepdim=True), dist.ReduceOp.SUM, group)
            return x - top - total.log()

        p = normalised(teacher.float()).exp_()
        log_q = normalised(student.float())
        loss = _reduce(-(p * log_q).sum(-1), dist.ReduceOp.SUM, group)
        ctx.save_for_backward(log_q.exp_(), p)
        ctx.dtype = student.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        q, p = ctx.saved_tensors
        return ((q - p) * grad.unsqueeze(-1)).to(ctx.dtype), None, None


class _TopkSoftCrossEntropy(torch.autograd.Function):
    """The soft cross-entropy over the teacher's top-k tokens (each tensor rank's own k, the union renormalised on
    both sides); `shift` rolls the teacher's choice left, so position t distils the teacher at t + shift."""

    @staticmethod
    def forward(ctx, student, teacher, k, shift, group):
        values, index = teacher.topk(min(int(k), teacher.shape[-1]), dim=-1)
        values, index = (torch.roll(t, -shift, dims=1) for t in (values, index))
        s = student.gather(-1, index).float()

        def log_softmax(x: torch.Tensor) -> torch.Tensor:
            top = _reduce(x.amax(-1, keepdim=True), dist.ReduceOp.MAX, group)
            total = _reduce((x - top).exp().sum(-1, keepdim=True), dist.ReduceOp.SUM, group)
            return x - top - total.log()

        p = log_softmax(values.float()).exp()
        log_q = log_softmax(s)
        loss = _reduce(-(p * log_q).sum(-1), dist.ReduceOp.SUM, group)
        ctx.save_for_backward(log_q.exp(), p, index)
        ctx.shape, ctx.dtype = student.shape, student.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        q, p, index = ctx.saved_tensors
        out = torch.zeros(ctx.shape, dtype=ctx.dtype, device=grad.device)
        out.scatter_(-1, index, ((q - p) * grad.unsqueeze(-1)).to(ctx.dtype))
        return out, None, None, None, None


def target_mask(mask: torch.Tensor, depth: int) -> torch.Tensor:
    """Positions whose token and whose target (depth + 1 tokens on) are both real."""
    shift = depth + 1
    ahead = torch.zeros_like(mask)
    ahead[:, :-shift] = mask[:, shift:]
    return mask * ahead


def draft_loss(
    students: list[torch.Tensor],
    teacher: torch.Tensor,
    mask: torch.Tensor,
    group=None,
    topk: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """SkyRL's draft loss: each head's masked-mean soft cross-entropy against the detached policy logits `teacher`
    (all [rows, seq, vocab / tp]; head d at position t against the teacher at t + d + 1), averaged over heads.
    `chunk` tokens at a time, recomputed in the backward (memory only: the value is the same)."""
    teacher = teacher.detach()
    losses = []
    for depth, student in enumerate(students):
        m = target_mask(mask, depth).to(torch.float32)
        if topk:
            per_token = _TopkSoftCrossEntropy.apply(student, teacher, topk, depth + 1, group)
            total = (per_token * m).sum()
        else:
            rolled = torch.roll(teacher, -(depth + 1), dims=1)
            step = chunk if chunk and student.shape[1] > chunk else student.shape[1]
            total = student.new_zeros((), dtype=torch.float32)
            for start in range(0, student.shape[1], step):
                part = slice(start, start + step)

                def masked_sum(s, t, w):
                    return (_SoftCrossEntropy.apply(s, t, group) * w).sum()

                args = (student[:, part], rolled[:, part], m[:, part])
                if step < student.shape[1]:
                    # deferred: torch.utils.checkpoint, only for a sequence longer than a chunk
                    from torch.utils.checkpoint import checkpoint

                    total = total + checkpoint(masked_sum, *args, use_reentrant=False)
                else:
                    total = total + masked_sum(*args)
        losses.append(total / m.sum().clamp(min=1.0))
    return torch.stack(losses).mean()


# -- the heads on a model ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Heads:
    """The MTP block of one GPTModel chunk and its loss settings (`weight`: trainer.mtp.loss_weight)."""

    count: int
    weight: float
    topk: int | None
    chunk: int | None
    _seen: dict = dataclasses.field(default_factory=dict)
    students: list | None = None

    @classmethod
    def attach(cls, model, config, layer_spec, te: bool, count: int, mc: Any, weight: float) -> Heads:
        """Megatron-Core's MTP block on `model` (`model.mtp`), built with its own config copy (see the module doc)."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it)
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
        from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionBlock

        own = dataclasses.replace(config, mtp_num_layers=count)
        spec = get_gpt_mtp_block_spec(own, layer_spec, use_transformer_engine=te)
        model.mtp = MultiTokenPredictionBlock(config=own, spec=spec)
        return cls(count, float(weight), mc.mtp_loss_topk or None, mc.mtp_loss_chunk_size or None)

    @contextlib.contextmanager
    def capture(self, model):
        """Within it, `model`'s forward records what the MTP block needs (the decoder's inputs and output)."""
        decoder = model.decoder

        def before(_module, _args, kwargs):
            self._seen = {
                "attention_mask": kwargs.get("attention_mask"),
                "rotary_pos_emb": kwargs.get("rotary_pos_emb"),
            }

        def after(_module, _args, output):
            self._seen["hidden"] = output

        handles = [decoder.register_forward_pre_hook(before, with_kwargs=True), decoder.register_forward_hook(after)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def run(self, model, ids: torch.Tensor, positions: torch.Tensor) -> None:
        """Each head's logits ([rows, seq, vocab / tp]) from the captured forward, in `self.students`: the block on the
        detached trunk output and detached re-embeddings, projected by the detached output weight."""
        seen, self._seen = self._seen, {}
        embedding = model.embedding

        def detached(**kwargs):
            return embedding(**kwargs).detach()

        # A leaf that asks for a gradient (thrown away): under full recompute Megatron's reentrant checkpoint passes
        # gradients only when an input wants one, and the trunk's output is detached.
        trunk = seen["hidden"].detach().requires_grad_(True)
        out = model.mtp(
            input_ids=ids,
            position_ids=positions,
            hidden_states=trunk,
            attention_mask=seen["attention_mask"],
            rotary_pos_emb=seen["rotary_pos_emb"],
            embedding=detached,
        )
        weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
        weight = (weight if weight is not None else model.output_layer.weight).detach()
        self.students = []
        for hidden in torch.chunk(out, 1 + self.count, dim=0)[1:]:
            logits, _ = model.output_layer(hidden, weight=weight)
            self.students.append(logits.transpose(0, 1).contiguous())

    def loss(self, teacher: torch.Tensor, mask: torch.Tensor, vocab_size: int, tp_rank: int, group) -> torch.Tensor:
        """The draft loss of the last `run`'s heads against `teacher` (the policy's untempered logits)."""
        students, self.students = self.students or [], None
        width = teacher.shape[-1]
        real = max(0, min(width, vocab_size - tp_rank * width))  # Megatron's vocabulary padding takes no part
        teacher, students = teacher[..., :real], [s[..., :real] for s in students]
        if self.chunk and not self.topk and teacher.shape[1] > self.chunk:
            # the log-prob pass's backward overwrites the logits in place; a chunk recomputed later must not read it
            teacher = teacher.detach().clone()
        return draft_loss(students, teacher, mask.to(teacher.device), group, self.topk, self.chunk)


# -- the optimizer step ----------------------------------------------------------------------------------------------

# (model-side, optimizer-side) parameter lists that Megatron's optimizers keep in the same order, group by group
_MAIN_OF = (
    ("model_float16_groups", "shard_fp32_from_float16_groups"),  # distributed optimizer, bf16 parameters
    ("model_fp32_groups", "shard_fp32_groups"),  # distributed optimizer, fp32 parameters
    ("float16_groups", "fp32_from_float16_groups"),  # bf16 parameters
)


def _head_main_params(optimizer, heads: set[int]) -> set[int]:
    """Ids of the optimizer-side parameters of the heads' parameters (`heads`: their ids)."""
    out = set(heads)  # an fp32 optimizer steps the model's own parameters
    for model_attr, main_attr in _MAIN_OF:
        for model_group, main_group in zip(
            getattr(optimizer, model_attr, ()) or (), getattr(optimizer, main_attr, ()) or ()
        ):
            out |= {id(main) for model, main in zip(model_group, main_group) if id(model) in heads}
    return out


def step_clipping_apart(optimizer, heads: list) -> tuple[bool, float | None]:
    """Megatron's optimizer step with the heads' gradients clipped by their own norm and the policy's by its own, as
    SkyRL clips them: the draft loss's gradients, large beside the policy's, leave the policy's clipping (and its
    reported norm) as they are without heads. Returns (stepped, the policy's gradient norm)."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it)
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32, get_grad_norm_fp32
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    if optimizer.prepare_grads():  # an overflow: no step
        return False, None
    head_ids = {id(p) for p in heads}
    sides: dict[bool, tuple[list, list]] = {False: ([], []), True: ([], [])}
    subs = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for sub in subs:
        mine = _head_main_params(sub, head_ids)
        for p in sub.get_parameters():
            params, grads = sides[id(p) in mine]
            params.append(p)
            if p.grad is not None and param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p):
                grads.append(p.grad)
    group = optimizer.get_grad_stats_parallel_group()
    clip = subs[0].config.clip_grad
    norms = {}
    for is_head, (params, grads) in sides.items():
        norms[is_head] = get_grad_norm_fp32(grads, grad_stats_parallel_group=group)
        if clip > 0 and params:
            clip_grad_by_total_norm_fp32(params, max_norm=clip, total_norm=norms[is_head])
    return optimizer.step_with_ready_grads(), norms[False]
