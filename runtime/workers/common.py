"""What every training strategy's worker shares: its settings, where it runs, the LR schedule, and the
policy and critic objectives on per-token outputs (so `fsdp2` and `megatron` optimise the same loss).

Losses are weighted by the whole mini-batch's token and sequence counts (`totals`): summed over the
micro-batches and data-parallel ranks of a mini-batch they give the mini-batch's loss, so any split of it
gives the same gradient.
"""

from __future__ import annotations

import datetime
import enum
import math
import os
import pickle
import socket
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist
from rlc.core import algorithms
from rlc.core.job import WorkerSettings  # noqa: F401  (re-exported for the workers)
from rlc.runtime.algorithms.kl import token_kl
from rlc.runtime.algorithms.losses import token_weights
from rlc.runtime.algorithms.registry import get_policy_loss, get_policy_loss_options
from rlc.runtime.batch import TrainBatch
from rlc.runtime.host import cpu_threads, pin_gloo_interface
from rlc.runtime.weights.broadcast import init_group
from rlc.runtime.weights.delta import Publisher, checkpoint_dir
from rlc.runtime.weights.payload import pack

ROLES = ("policy", "ref", "critic")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def free_address() -> tuple[str, int]:
    """This host's address and a free TCP port, for rank 0 to host the process group."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    try:
        host = socket.gethostbyname(socket.gethostname())
    except OSError:
        host = "127.0.0.1"
    return host, port


def first_non_finite(state: dict) -> str | None:
    """The name of the first weight holding a NaN or an infinity in this rank's shard of `state`, "a weight on another
    rank" when only another rank's has one, None when all are finite. Every rank must call it (the ranks agree through
    a collective on a CPU flag, gloo's on CUDA too), so that all of them refuse together."""
    bad = next(
        (
            name
            for name, t in state.items()
            if isinstance(t, torch.Tensor)
            and (local := t.to_local() if hasattr(t, "to_local") else t).is_floating_point()
            and not bool(torch.isfinite(local).all())
        ),
        None,
    )
    if not dist.is_initialized():
        return bad
    flag = torch.tensor([0 if bad is None else 1], dtype=torch.int32)
    dist.all_reduce(flag)
    return bad if bad is not None or int(flag) == 0 else "a weight on another rank"


def read_extra(path) -> dict:
    """A rank's extra checkpoint state (RNG, step count, scheduler), read as data only: a checkpoint directory is
    something model-written code might once have reached, so nothing in it may run code on resume."""
    return torch.load(path, weights_only=True)


def _enum_member(cls: Any, name: Any) -> enum.Enum:
    """What `builtins.getattr` may do in checkpoint metadata: Python 3.11.0-3.11.4 pickle an enum member as
    `getattr(EnumClass, "NAME")` (later Pythons as `EnumClass(value)`), and the metadata holds torch's enums. Only a
    member's name on an enum class the unpickler already let in is data; any other attribute of anything is code."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(
        f"a checkpoint's metadata calls getattr({getattr(cls, '__qualname__', type(cls).__name__)}, {name!r}), "
        "which is no enum member rlc writes there"
    )


class _MetadataUnpickler(pickle.Unpickler):
    """torch.distributed.checkpoint's `.metadata` is a plain pickle: only its own classes, sizes, dtypes, layouts and
    paths may appear in it, and its enums' members (`_enum_member`); anything else (a function to call, a module of
    the trainer's) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        found = (
            super().find_class(module, name) if module.split(".")[0] in ("torch", "pathlib", "collections") else None
        )
        if module.startswith("torch.distributed.checkpoint.") and isinstance(found, type):
            return found
        if (module, name) in (
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),
            ("collections", "OrderedDict"),
        ):
            return found
        if module == "torch" and isinstance(found, torch.dtype):
            return found
        if module == "pathlib" and name in ("PosixPath", "PurePosixPath"):
            return found
        raise pickle.UnpicklingError(f"a checkpoint's metadata names {module}.{name}, which rlc never writes there")


def check_metadata(directory) -> None:
    """Read a torch.distributed.checkpoint directory's `.metadata` with only the names it may hold, before
    `dcp.load` unpickles it (which would run whatever a tampered file asks)."""
    path = Path(directory) / ".metadata"
    if path.exists():
        with open(path, "rb") as f:
            _MetadataUnpickler(f).load()


def lr_lambda(scheduler: str, warmup: int, total: int):
    """The learning-rate factor of optimizer step `step` (0-based), as Hugging Face's `get_scheduler` (SkyRL's)
    gives it for constant / constant_with_warmup / linear / cosine: warm-up from 0 at the first step."""

    def factor(step: int) -> float:
        if scheduler == "constant":
            return 1.0
        if step < warmup:
            return step / max(1, warmup)
        if scheduler == "constant_with_warmup":
            return 1.0
        if scheduler == "linear":
            return max(0.0, (total - step) / max(1, total - warmup))
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))  # cosine, half a cycle

    return factor


class TrainWorker:
    """What the fsdp2 and megatron workers do alike: where they run (as Ray sees it), joining the role's process
    group, and handing the policy's weights to the engines. Subclasses set `s` (WorkerSettings), `rank`,
    `world_size` and `lora`, and define `full_state_dict`."""

    s: WorkerSettings
    rank: int
    world_size: int
    lora: Any

    def full_state_dict(self, dtype: str | None = None, adapters_only: bool = False) -> dict | None:
        raise NotImplementedError

    def node_ip(self) -> str:
        """The address of the node this process runs on (as Ray sees it)."""
        return ray.util.get_node_ip_address()

    def address(self) -> tuple[str, int]:
        """Where rank 0 hosts the process group: the address Ray knows this node by, and a free port."""
        host, port = free_address()
        if ray.is_initialized():
            host = ray.util.get_node_ip_address()  # the hostname may resolve to an address peers cannot reach
        return host, port

    def _join_process_group(self, master_addr: str, master_port: int) -> None:
        """This rank's device and threads, and the role's process group (gloo on CPU; gloo + nccl on CUDA)."""
        if self.s.device == "cuda":
            torch.cuda.set_device(0)  # Ray gives each actor its own CUDA_VISIBLE_DEVICES: the local device is 0
            backend = "cpu:gloo,cuda:nccl"
        else:
            if self.s.cpu_slots_per_node:
                cpu_threads(self.s.cpu_slots_per_node)
            backend = "gloo"
        if not dist.is_initialized():
            pin_gloo_interface()
            # A rank whose peer died waits this long in a collective before failing (RLC_DIST_TIMEOUT_S, default 30 min).
            timeout = datetime.timedelta(seconds=float(os.environ.get("RLC_DIST_TIMEOUT_S", "1800")))
            dist.init_process_group(
                backend,
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=timeout,
            )

    def init_weight_group(self, master_address: str, master_port: int, world_size: int, backend: str) -> None:
        """Global rank 0 joins the weight-sync group (rank 0 of it) with every engine worker; other ranks stay out."""
        if self.rank == 0:
            pin_gloo_interface()
            self.weight_group = init_group(master_address, master_port, 0, world_size, backend)

    def publish_delta(self, settings: dict) -> dict | None:
        """Publish the weights as the next checkpoint delta (`weights.delta`); every rank must call it (the gathers
        are collectives), and rank 0 answers what the engines need to load it."""
        full = self.full_state_dict(None)
        if full is None:
            return None
        if getattr(self, "_delta_publisher", None) is None:
            self._delta_publisher = Publisher(
                checkpoint_dir(self.s.model_path),
                settings["sync_dir"],
                settings["max_file_bytes"],
                settings["publish_num_workers"],
            )
        return self._delta_publisher.publish(full.items())

    def packed_state_dict(self, dtype: str | None = None) -> dict | None:
        """`full_state_dict` as numpy arrays (`weights.payload.pack`): engines read it from the object store without a copy.

        With fsdp2 LoRA only the adapters travel: the engines keep the frozen base weights they loaded.
        """
        full = self.full_state_dict(dtype, adapters_only=self.lora)
        return pack(full) if full is not None else None


def policy_objective(
    algorithm, logp: torch.Tensor, entropy: torch.Tensor, mb: TrainBatch, totals: dict, max_seq_len: int | None
) -> tuple[torch.Tensor, dict]:
    """The policy's loss on one micro-batch (its share of the mini-batch's) and its metrics, from the
    response tokens' log-probs and entropies."""
    a = algorithm
    mask = mb.loss_mask
    # No old log-probs: this is the only update on the batch, so the old policy is the current one.
    old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
    options = get_policy_loss_options(a.policy_loss_type, a)
    if algorithms.policy_loss(a.policy_loss_type).rollout_anchored:  # the engines returned their log-probs
        options["rollout_log_probs"] = mb.rollout_logprobs.to(logp.device)
    token_loss, parts = get_policy_loss(a.policy_loss_type)(logp, old, mb.advantages, mask, **options)
    token_loss = torch.where(mask.bool(), token_loss, 0.0)  # NaN * 0 would still be NaN
    if mb.is_weight is not None:  # off-policy correction: truncated importance weights, decided by the driver
        token_loss = token_loss * mb.is_weight
    w = (
        mb.loss_weights.to(token_loss.dtype)  # a reduction over the mini-batch: the driver's weights
        if mb.loss_weights is not None
        else token_weights(
            mask,
            a.loss_reduction,
            total_tokens=totals["tokens"],
            total_sequences=totals["sequences"],
            max_seq_len=max_seq_len,
        )
    )
    policy = (token_loss * w).sum()
    loss = policy
    # Share of the mini-batch's trained tokens in this micro-batch: metrics below sum to means over ranks (over
    # every token, or over those left when rows that could not move the weights were not run).
    metric_tokens = max(totals.get("trained_tokens", totals["tokens"]), 1.0)
    share = mask.sum().item() / metric_tokens
    seq_w = mask.float() / mask.float().sum(-1, keepdim=True).clamp(min=1) / max(totals["sequences"], 1.0)
    metrics = {"policy_loss": policy.item(), **{k: float(v) * share for k, v in parts.items()}}
    if a.use_kl_loss and mb.ref_logprobs is not None:
        kl = (token_kl(logp, mb.ref_logprobs, mask, a.kl_estimator_type) * seq_w).sum()
        loss = loss + a.kl_loss_coef * kl
        metrics["kl"] = kl.item()
    ent = (entropy * mask / max(totals["tokens"], 1.0)).sum()
    if a.use_entropy_loss:
        loss = loss - a.entropy_loss_coef * ent
    metrics["entropy"] = ent.item() * max(totals["tokens"], 1.0) / metric_tokens
    return loss, metrics


def critic_objective(algorithm, values: torch.Tensor, mb: TrainBatch, totals: dict) -> tuple[torch.Tensor, dict]:
    """The clipped value loss on one micro-batch (its share of the mini-batch's)."""
    mask, returns, old = mb.loss_mask, mb.returns, mb.old_values
    assert returns is not None and old is not None, "a critic trains on the driver's returns and its old values"
    clip = algorithm.value_clip
    clipped = old + (values - old).clamp(-clip, clip)
    token_loss = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    loss = (token_loss * mask / max(totals["tokens"], 1.0)).sum()
    return loss, {"critic_loss": loss.item()}
