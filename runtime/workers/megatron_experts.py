"""Hugging Face <-> Megatron-Core weights of a mixture-of-experts MLP, for any family module to reuse.

A family module (``megatron_moe`` for Qwen3-MoE and Mixtral; others later) converts attention, norms and
embeddings itself and calls these for a layer's MoE block: the router, the routed experts (HF's fused
``experts.gate_up_proj`` [E, 2F, H] and ``experts.down_proj`` [E, H, F], as transformers 5 holds them) and, where a
family has one, a shared expert with its sigmoid gate. Megatron's names follow its MoE layer: ``mlp.router.weight``;
per local expert ``mlp.experts.local_experts.{j}.linear_fc{1,2}.weight`` (SequentialMLP, Megatron's local modules)
or ``mlp.experts.linear_fc{1,2}.weight{j}`` (TEGroupedMLP); ``mlp.shared_experts.linear_fc{1,2}.weight`` and
``mlp.shared_experts.gate_weight``.

Expert parallelism (EP) places experts ``[ep_rank * E / ep, (ep_rank + 1) * E / ep)`` on a rank, numbered from 0
there; expert tensor parallelism (ETP) splits each expert's fc1 rows (gate and up halves alike) and fc2 columns
over the expert-tensor group, as TP splits a dense MLP. The shared expert follows the dense MLP's TP.
Only torch is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

_SEQUENTIAL = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight$")
_GROUPED = re.compile(r"^mlp\.experts\.linear_fc([12])\.weight(\d+)$")
ROUTER = "mlp.router.weight"
EXPERT_BIAS = "mlp.router.expert_bias"
SHARED_FC1, SHARED_FC2, SHARED_GATE = (
    "mlp.shared_experts.linear_fc1.weight",
    "mlp.shared_experts.linear_fc2.weight",
    "mlp.shared_experts.gate_weight",
)


@dataclass(frozen=True)
class Experts:
    """The MoE block's shape: ``num_experts`` routed experts of ``ffn_hidden_size``, ``topk`` a token;
    ``shared_ffn_hidden_size`` > 0 when a shared expert runs beside them (``shared_gate``: behind a sigmoid gate);
    ``grouped``: TEGroupedMLP's names rather than SequentialMLP's."""

    num_experts: int
    topk: int
    ffn_hidden_size: int
    shared_ffn_hidden_size: int = 0
    shared_gate: bool = False
    grouped: bool = False


@dataclass(frozen=True)
class Placement:
    """Which experts and which slice of each a rank holds: its expert-parallel and expert-tensor-parallel ranks."""

    ep_rank: int = 0
    ep_size: int = 1
    etp_rank: int = 0
    etp_size: int = 1


def local_experts(experts: Experts, place: Placement) -> range:
    """Global indices of the experts on the rank, in local order."""
    if experts.num_experts % place.ep_size:
        raise ValueError(f"{experts.num_experts} experts do not divide over expert_model_parallel_size={place.ep_size}")
    n = experts.num_experts // place.ep_size
    return range(place.ep_rank * n, (place.ep_rank + 1) * n)


def check(experts: Experts, tp_size: int = 1, ep_size: int = 1, etp_size: int = 1) -> str | None:
    """Why these experts cannot be split at these sizes (None when they can)."""
    if experts.num_experts % ep_size:
        return f"num_experts={experts.num_experts} is not divisible by expert_model_parallel_size={ep_size}"
    if experts.ffn_hidden_size % etp_size:
        return f"expert ffn size {experts.ffn_hidden_size} is not divisible by expert_tensor_parallel_size={etp_size}"
    if experts.shared_ffn_hidden_size % tp_size:
        return f"shared expert ffn size {experts.shared_ffn_hidden_size} is not divisible by tp_size={tp_size}"
    return None


def config_kwargs(experts: Experts, pre_softmax: bool, score_function: str = "softmax") -> dict:
    """TransformerConfig kwargs of the MoE block. ``pre_softmax``: the router's softmax runs over all experts before
    top-k and the k weights stay unnormalized (HF's ``norm_topk_prob=False``); otherwise a softmax over the k chosen
    logits, which equals HF's renormalized top-k probabilities."""
    kwargs = {
        "num_moe_experts": experts.num_experts,
        "moe_router_topk": experts.topk,
        "moe_ffn_hidden_size": experts.ffn_hidden_size,
        "moe_router_pre_softmax": pre_softmax,
        "moe_router_score_function": score_function,
    }
    if experts.shared_ffn_hidden_size:
        kwargs["moe_shared_expert_intermediate_size"] = experts.shared_ffn_hidden_size
        kwargs["moe_shared_expert_gate"] = experts.shared_gate
    return kwargs


def _fc_name(experts: Experts, local: int, fc: int) -> str:
    if experts.grouped:
        return f"mlp.experts.linear_fc{fc}.weight{local}"
    return f"mlp.experts.local_experts.{local}.linear_fc{fc}.weight"


def expert_leaf(leaf: str) -> tuple[int, int] | None:
    """(local expert index, 1 or 2 for fc1 / fc2) of a routed expert's Megatron weight; None for any other name."""
    m = _SEQUENTIAL.match(leaf)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _GROUPED.match(leaf)
    if m:
        return int(m.group(2)), int(m.group(1))
    return None


def global_expert_name(name: str, first: int) -> str:
    """A routed expert's Megatron name (any prefix) with its local index shifted by ``first``, the global index of
    the rank's first expert; other names unchanged."""
    head, dot, leaf = name.rpartition("mlp.experts.")
    found = expert_leaf("mlp.experts." + leaf) if dot else None
    if found is None:
        return name
    j, fc = found
    return head + _fc_name(Experts(0, 0, 0, grouped=".local_experts." not in "." + leaf), j + first, fc)


def is_expert(name: str) -> bool:
    """Whether a Megatron parameter (any prefix) is a routed expert's, sharded over EP and ETP rather than TP."""
    return ".mlp.experts." in "." + name


def _half_shard(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rows ``rank`` of ``size`` of each half of a [gate; up] matrix, the halves kept in order."""
    if size == 1:
        return t
    gate, up = t.chunk(2)
    return torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]])


def _cols(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t if size == 1 else t.chunk(size, 1)[rank].contiguous()


def to_megatron(
    hf_state: dict,
    hf_mlp: str,
    experts: Experts,
    place: Placement,
    tp_rank: int = 0,
    tp_size: int = 1,
    gate_up: str = "experts.gate_up_proj",
    down: str = "experts.down_proj",
    router: str = "gate.weight",
    shared: str = "shared_expert.",
    shared_gate: str = "shared_expert_gate.weight",
) -> dict:
    """Megatron weights (leaf names under the layer) of one MoE block whose HF names start with ``hf_mlp``
    (e.g. ``model.layers.3.mlp.``); the other arguments name the HF tensors under it."""
    out = {ROUTER: hf_state[hf_mlp + router]}
    fc1, fc2 = hf_state[hf_mlp + gate_up], hf_state[hf_mlp + down]
    for j, e in enumerate(local_experts(experts, place)):
        out[_fc_name(experts, j, 1)] = _half_shard(fc1[e], place.etp_rank, place.etp_size).contiguous()
        out[_fc_name(experts, j, 2)] = _cols(fc2[e], place.etp_rank, place.etp_size)
    if experts.shared_ffn_hidden_size:
        s = hf_mlp + shared
        both = torch.cat([hf_state[s + "gate_proj.weight"], hf_state[s + "up_proj.weight"]])
        out[SHARED_FC1] = _half_shard(both, tp_rank, tp_size).contiguous()
        out[SHARED_FC2] = _cols(hf_state[s + "down_proj.weight"], tp_rank, tp_size)
        if experts.shared_gate:
            out[SHARED_GATE] = hf_state[hf_mlp + shared_gate]
    return out


def tp_split_dim(leaf: str) -> int | None:
    """Dim the (expert) tensor-parallel group splits an MoE block's weight along; None when replicated; KeyError
    for a name that is not an MoE block's."""
    if leaf in (ROUTER, EXPERT_BIAS, SHARED_GATE):
        return None
    if leaf == SHARED_FC1:
        return 0
    if leaf == SHARED_FC2:
        return 1
    found = expert_leaf(leaf)
    if found is None:
        raise KeyError(leaf)
    return 0 if found[1] == 1 else 1


def _unshard_halves(shards: list) -> torch.Tensor:
    halves = [s.chunk(2) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves]).contiguous()


def to_hf(
    leaf: str,
    shards: list,
    hf_mlp: str,
    shared: str = "shared_expert.",
    shared_gate: str = "shared_expert_gate.weight",
    router: str = "gate.weight",
) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one MoE block weight other than a routed expert's (see :func:`experts_to_hf`),
    given its tensor-parallel shards in rank order."""
    if leaf == ROUTER:
        return [(hf_mlp + router, shards[0])]
    if leaf == EXPERT_BIAS:
        return []  # a running routing statistic, not an HF weight
    if leaf == SHARED_GATE:
        return [(hf_mlp + shared_gate, shards[0])]
    if leaf == SHARED_FC1:
        gate, up = _unshard_halves(shards).chunk(2)
        return [(f"{hf_mlp}{shared}gate_proj.weight", gate), (f"{hf_mlp}{shared}up_proj.weight", up)]
    if leaf == SHARED_FC2:
        return [(f"{hf_mlp}{shared}down_proj.weight", torch.cat(shards, 1))]
    raise KeyError(leaf)


def expert_to_hf(fc: int, shards: list) -> torch.Tensor:
    """One expert's full fc1 ([gate; up], HF's gate_up_proj row order) or fc2 from its expert-tensor-parallel
    shards in rank order."""
    return _unshard_halves(shards) if fc == 1 else torch.cat(shards, 1)


def experts_to_hf(
    hf_mlp: str, fc1: list, fc2: list, gate_up: str = "experts.gate_up_proj", down: str = "experts.down_proj"
) -> list[tuple[str, torch.Tensor]]:
    """HF's fused expert tensors from every expert's full fc1 and fc2, in global expert order."""
    return [(hf_mlp + gate_up, torch.stack(fc1)), (hf_mlp + down, torch.stack(fc2))]


class SequenceParallelNorm:
    """A local-spec norm (torch's RMSNorm or LayerNorm, as Megatron's WrappedTorchNorm builds) that runs under
    sequence parallelism, which WrappedTorchNorm refuses: each tensor-parallel rank normalizes its slice of the
    sequence, so the weights carry `sequence_parallel`, and Megatron-Core's finalize_model_grads all-reduces their
    gradients over the tensor-parallel group (q/k norms too, whose ranks see different heads). Megatron-Core trains an
    MoE layer under TP only with sequence parallelism; TransformerEngine's norms have it, this serves runs without."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused):
        if config.normalization == "RMSNorm":
            norm: torch.nn.Module = torch.nn.RMSNorm(hidden_size, eps=eps)
        elif config.normalization == "LayerNorm":
            norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        else:
            raise ValueError(f"normalization {config.normalization!r}: RMSNorm or LayerNorm under sequence parallelism")
        for param in norm.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)
        return norm
