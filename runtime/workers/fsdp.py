"""FSDP2 training workers (strategy `fsdp2`): one process per rank of the policy, ref or critic.

A worker is a plain class; the driver makes it a Ray actor, and tests run it in plain processes. Each
decoder layer is a `fully_shard` unit, then the root. Gradients are averaged over ranks by FSDP, so
the loss is scaled by the world size and weighted by the whole mini-batch's token and sequence counts
(`token_weights`): any split into ranks and micro-batches gives the mini-batch's gradient.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlc.core.runtime_facts import logprob_chunk
from rlc.runtime.algorithms.losses import score_tokens
from rlc.runtime.batch import TrainBatch
from rlc.runtime.models import cache_keyword, load_causal_lm
from rlc.runtime.stopping import leave_sigterm_to_the_driver
from rlc.runtime.weights.broadcast import send_weights
from rlc.runtime.weights.ipc import gpu_uuid, ipc_buckets, ipc_handle
from rlc.runtime.weights.lora import with_lora
from rlc.runtime.weights.tensors import iter_full_params, metas_of
from rlc.runtime.workers import micro_batches as mbs
from rlc.runtime.workers import ulysses
from rlc.runtime.workers.common import (
    DTYPES,
    ROLES,
    TrainWorker,
    WorkerSettings,
    check_metadata,
    critic_objective,
    first_non_finite,
    free_address,
    lr_lambda,
    policy_objective,
    read_extra,
)
from rlc.runtime.workers.micro_batches import widened
from rlc.runtime.workers.packing import pack, packed_kwargs, packing_unsupported, response_rows, unpack
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoTokenizer, DynamicCache

__all__ = ["FSDPWorker", "ValueModel", "WorkerSettings", "free_address"]


# The head's logits feed the scorer only: its backward writes their gradient over them (one [tokens, vocab]
# tensor in training, not two; compiler/memory.py counts the same).
_INPLACE = {"inplace_backward": True}


def _scatter(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Per-token values of the `valid` entries of a (rows, response_len) layout into it, 0 elsewhere."""
    out = values.new_zeros(valid.shape)
    out[valid] = values
    return out


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


class ValueModel(torch.nn.Module):
    """A critic: the causal LM's decoder with a scalar value head instead of the vocabulary head."""

    def __init__(self, lm: torch.nn.Module, head_name: str):
        super().__init__()
        self.config = lm.config
        self.backbone = lm.get_decoder()
        self._no_split_modules = getattr(lm, "_no_split_modules", None)
        self.head_name = head_name
        setattr(self, head_name, torch.nn.Linear(lm.config.hidden_size, 1))
        torch.nn.init.zeros_(getattr(self, head_name).weight)
        torch.nn.init.zeros_(getattr(self, head_name).bias)

    def forward(self, input_ids, attention_mask, position_ids, **kwargs):
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs
        ).last_hidden_state
        return getattr(self, self.head_name)(hidden).squeeze(-1).clone()  # not a view: FSDP hooks the output


class FSDPWorker(TrainWorker):
    """One rank of one role. `config` is that role's sub-config (trainer.policy, .ref or .critic)."""

    def __init__(self, settings: WorkerSettings, config: Any, algorithm: Any, rank: int, world_size: int):
        if settings.role not in ROLES:
            raise ValueError(f"unknown role {settings.role!r}")
        leave_sigterm_to_the_driver()
        self.s, self.config, self.algorithm = settings, config, algorithm
        self.rank, self.world_size = rank, world_size
        lora = getattr(getattr(config, "model", None), "lora", None)
        self.lora = bool(lora is not None and lora.rank > 0 and settings.role != "ref")
        # Built in setup(), once the process group exists.
        self.model: Any = None
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.optimizer_steps = 0
        self.share_prompts = True  # run each distinct prompt of a micro-batch once (`_shared_prompt_logits`)
        # Ulysses: groups of sp consecutive ranks split each row of one data-parallel block (`workers/ulysses.py`).
        self.sp = max(int(settings.sequence_parallel_size), 1)
        self.sp_group: Any = None
        self.attention = ""  # the model's attention kernel (under sp, the one the split attention wraps)
        self.packing = False

    # -- set-up ---------------------------------------------------------------------------------------

    def setup(self, master_addr: str, master_port: int) -> None:
        torch.manual_seed(self.s.seed)
        if self.s.deterministic:  # trainer.deterministic: a kernel without a deterministic version raises
            torch.use_deterministic_algorithms(True)
        self._join_process_group(master_addr, master_port)
        if self.s.device == "cuda" and getattr(self.config, "record_memory", False) and self.s.memory_snapshot_dir:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        shard = self.config.fsdp_config.fsdp_size
        if 0 < shard < self.world_size:
            if self.world_size % shard:
                raise ValueError(f"fsdp_size {shard} does not divide the {self.s.role} world size {self.world_size}")
            # Hybrid sharding: parameters sharded within groups of fsdp_size ranks, replicated across the groups.
            self.mesh = init_device_mesh(
                self.s.device, (self.world_size // shard, shard), mesh_dim_names=("replicate", "shard")
            )
        else:
            self.mesh = init_device_mesh(self.s.device, (self.world_size,), mesh_dim_names=("fsdp",))
        if self.sp > 1:
            self.sp_group = ulysses.group_of(self.rank, self.world_size, self.sp)
        self.model = self._build_model()
        if self.s.role != "ref":
            opt = self.config.optimizer_config
            trainable = [p for p in self.model.parameters() if p.requires_grad]  # LoRA: the adapters only
            # On CPU, torch's default AdamW loops over the parameters one op at a time; its fused kernel does the
            # same update in one pass per parameter (1.4 ms -> 0.24 ms a step for rlc:tiny). CUDA keeps the
            # default (foreach).
            fused = {"fused": True} if self.s.device == "cpu" else {}
            self.optimizer = torch.optim.AdamW(
                trainable, lr=opt.lr, betas=tuple(opt.adam_betas), weight_decay=opt.weight_decay, **fused
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lr_lambda(opt.scheduler, opt.num_warmup_steps, self.s.total_optimizer_steps)
            )

    def _packing(self, config: Any) -> bool:
        """use_sample_packing where it saves work: with flash attention's variable-length kernels. sdpa and
        eager would apply a block-diagonal mask over all the micro-batch's tokens, quadratic in their sum, which
        costs more than the padding it removes (3x slower measured on the CPU example), so they stay padded."""
        if not self.s.sample_packing or not self.attention.startswith("flash"):
            return False
        why = packing_unsupported(config)
        if why:
            print(
                f"rlc: {self.s.role} rank {self.rank}: use_sample_packing is on but {why}; micro-batches stay padded",
                flush=True,
            )
        return why is None

    def layout(self) -> dict:
        """Each sequence-parallel group takes its own block of rows; its first rank returns the results."""
        return {
            "dp_rank": self.rank // self.sp,
            "dp_size": self.world_size // self.sp,
            "collect": self.rank % self.sp == 0,
        }

    @property
    def language_model_only(self) -> bool:
        """SkyRL's trainer.{policy,ref}.language_model_only: the text model of a multimodal checkpoint (the critic
        has no such setting)."""
        return bool(getattr(self.config, "language_model_only", False))

    def _build_model(self) -> torch.nn.Module:
        # deferred: torch.distributed.fsdp (~1 s), not needed by the driver, which imports this module
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        load_kwargs: dict[str, Any] = {}
        if self.s.device == "cuda" and self.s.bf16 and self.s.sample_packing:
            if importlib.util.find_spec("flash_attn") is not None:  # packed micro-batches on its varlen kernels
                load_kwargs["attn_implementation"] = "flash_attention_2"
        lm = load_causal_lm(
            self.s.model_path, language_model_only=self.language_model_only, dtype=torch.float32, **load_kwargs
        )
        if self.s.gradient_checkpointing and self.s.role != "ref":
            lm.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": self.s.gradient_checkpointing_use_reentrant}
            )
        lm.config.use_cache = False
        self.attention = getattr(lm.config, "_attn_implementation", None) or "eager"
        self.packing = self._packing(lm.config)
        if self.sp > 1:
            ulysses.enable(lm, lm.config, self.sp)
        lora = getattr(self.config.model, "lora", None)
        if lora is not None and lora.rank > 0 and self.s.role != "ref":
            lm = with_lora(lm, lora)
        model = ValueModel(lm, self.algorithm.value_head_prefix) if self.s.role == "critic" else lm
        model.to(self.s.device)
        fsdp = self.config.fsdp_config
        mp = None
        if self.s.bf16:
            mpc = fsdp.mixed_precision
            names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
            mp = MixedPrecisionPolicy(
                param_dtype=names[mpc.param_dtype] if mpc else torch.bfloat16,
                reduce_dtype=names[mpc.reduce_dtype] if mpc else torch.float32,
            )
        reshard = fsdp.reshard_after_forward  # True, False, or an int: reshard to groups of that many ranks
        kwargs: dict[str, Any] = {
            "mesh": self.mesh,
            "reshard_after_forward": reshard
            if isinstance(reshard, int) and not isinstance(reshard, bool)
            else bool(reshard),
        }
        if mp is not None:
            kwargs["mp_policy"] = mp
        if fsdp.cpu_offload and self.s.device == "cuda":
            # deferred: torch.distributed.fsdp (~1 s), not needed by the driver, which imports this module
            from torch.distributed.fsdp import CPUOffloadPolicy

            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        if self.world_size == 1 and self.s.device == "cpu" and mp is None:
            # One CPU rank has nothing to shard and no dtype policy to apply: FSDP would only add hooks and
            # single-member collectives to every layer. Like torchtitan, train the plain module then.
            return model
        layer_classes = set(
            fsdp.wrap_policy.get("transformer_layer_cls_to_wrap")
            or getattr(model, "_no_split_modules", None)
            or getattr(_base(model), "_no_split_modules", None)
            or []
        )
        for module in model.modules():
            if type(module).__name__ in layer_classes:
                fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        return model

    # -- forward passes -------------------------------------------------------------------------------

    def _micro_batches(self, batch: TrainBatch, size: int) -> list:
        """This rank's micro-batches as row selections: blocks of `size` rows, or under a token budget as many rows
        as one holds (`runtime/workers/micro_batches.py`), then as many None (a row with no loss) as it takes to run as many
        micro-batches as the role's busiest rank."""
        budget = self.s.max_tokens_per_microbatch
        if budget <= 0:
            return [slice(i, i + size) for i in range(0, batch.rows, size)]
        prompts, responses = mbs.lengths(batch)
        parts: list = [torch.tensor(rows) for rows in mbs.by_tokens(prompts, responses, budget, self.packing)]
        count = torch.tensor(len(parts))
        if self.world_size > 1:  # every micro-batch's forward gathers the sharded weights: all ranks run as many
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return parts + [None] * (int(count) - len(parts))

    def _device_batch(self, batch: TrainBatch, rows) -> TrainBatch:
        """The selected rows (None: `micro_batches.inert`) on this rank's device, in their narrowest padded layout."""
        return mbs.trimmed(batch.select(rows) if rows is not None else mbs.inert(batch)).to(self.s.device)

    def _outputs(self, mb: TrainBatch, want_entropy: bool = False, want_sum_pi_squared: bool = False):
        """Per response token: log-probs (policy/ref) or values (critic), and the entropy or the sum of squared
        probabilities when asked."""
        # trainer.logprobs_chunk_size tokens at a time, within rlc's own bound
        second: dict[str, Any] = {
            "entropy": want_entropy,
            "sum_pi_squared": want_sum_pi_squared,
            "chunk": logprob_chunk(self.s.logprobs_chunk_size),
        }
        if self.sp > 1:
            return self._split_outputs(mb, second)
        ids, attn = mb.input_ids, mb.attention_mask
        plen, length = mb.prompt_len, mb.response_ids.shape[1]
        response = mb.response_ids
        if self.packing:  # one row of the real tokens, each sequence attending to itself only
            packed = pack(ids, attn, plen)
            kwargs = packed_kwargs(packed, varlen=self._varlen())
            if self.s.role == "critic":
                return unpack(self.model(**kwargs), packed, length).float(), None
            rows, valid = response_rows(packed, length, packed.input_ids.device)
            if self._keep(1):  # the head runs on the positions that predict a response token only
                kept = self.model(**kwargs, logits_to_keep=rows[valid]).logits[0]
                scores = score_tokens(kept, response[valid], self.s.temperature, **second, **_INPLACE)
                return tuple(_scatter(valid, x) if x is not None else None for x in scores)  # type: ignore[return-value]
            # Scored where they are in the packed row: no (rows, length, vocab) copy of the logits.
            out = self.model(**kwargs)
            logp, entropy = score_tokens(out.logits, response, self.s.temperature, **second, rows=rows, **_INPLACE)
            fill = ~valid
            return logp.masked_fill(fill, 0.0), (entropy.masked_fill(fill, 0.0) if entropy is not None else None)
        # Response token j is scored at the position before it, so a row's last token is never fed.
        ids, attn = ids[:, :-1], attn[:, :-1]
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        # Without left padding the only padding follows a row's last token, which causal attention already
        # hides from every scored position: the model then needs no mask (and builds none).
        mask = None if bool(attn[:, :plen].all()) else attn
        if self.s.role == "critic":
            values = self.model(input_ids=ids, attention_mask=mask, position_ids=positions)
            return values[:, plen - 1 :].float(), None
        logits = self._shared_prompt_logits(ids, mask, positions, plen)
        if logits is None:
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, **self._keep(length)).logits
        width = logits.shape[1]
        if width == length:
            return score_tokens(logits, response, self.s.temperature, **second, **_INPLACE)
        # The last `length` positions of each row, scored in place (a model without logits_to_keep returns all).
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None] * width + width - length
        rows = rows + torch.arange(length, device=logits.device)
        return score_tokens(logits, response, self.s.temperature, **second, rows=rows, **_INPLACE)

    def _varlen(self) -> bool:
        """Whether flash attention runs the packed row (it then takes the sequences' boundaries explicitly)."""
        return getattr(_base(self.model).config, "_attn_implementation", "").startswith("flash")

    def _split_outputs(self, mb: TrainBatch, second: dict):
        """`_outputs` with each row's positions split over the sequence-parallel group (`workers/ulysses.py`): this
        rank runs its share of every row and scores the response tokens predicted there; the group sums the
        scores, so every rank returns the whole rows' outputs."""
        ids, attn, plen, length = mb.input_ids, mb.attention_mask, mb.prompt_len, mb.response_ids.shape[1]
        if self.packing:
            packed = pack(ids, attn, plen)
            split, local_ids, local_positions = ulysses.packed_split(
                self.sp_group, self.attention, packed.input_ids, packed.position_ids, packed.cu_seqlens
            )
            where, valid = response_rows(packed, length, ids.device)  # (rows, length) positions in the packed row
            row = torch.zeros_like(where)
        else:
            # As `_outputs`: response token j is predicted at position plen - 1 + j; the last token is never fed.
            ids, attn = ids[:, :-1], attn[:, :-1]
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            masked = not bool(attn[:, :plen].all())
            split, local_ids, local_positions = ulysses.padded_split(
                self.sp_group, self.attention, ids, attn, positions, masked
            )
            where = (plen - 1 + torch.arange(length, device=ids.device)).expand(ids.shape[0], -1)
            valid = torch.ones_like(where, dtype=torch.bool)
            row = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(where)
        kwargs = {"input_ids": local_ids, "attention_mask": None, "position_ids": local_positions, "rlc_split": split}
        if self.s.role == "critic":
            values = split.gather(self.model(**kwargs).float())
            return values[row, where].masked_fill(~valid, 0.0), None
        step = split.length // split.size
        start = split.rank * step
        mine = valid & (where >= start) & (where < start + step)
        # Padded, the vocabulary head runs on this rank's positions from the first that predicts a response token
        # (`_keep`); at least one, so that it takes part in backward on every rank.
        keep = step if self.packing else min(step, max(start + step - (plen - 1), 1))
        logits = self.model(**kwargs, **(self._keep(keep) if keep < step else {})).logits
        keep = logits.shape[1]  # a model without logits_to_keep returns every position
        flat = (row * keep + where - (start + step - keep))[mine]
        scored = score_tokens(logits, mb.response_ids[mine], self.s.temperature, **second, rows=flat)
        outs: list[torch.Tensor | None] = []
        for part in scored:
            if part is None:
                outs.append(None)
                continue
            here = part.new_zeros(logits.shape[0] * keep).index_put((flat,), part).view(-1, keep)
            here = torch.nn.functional.pad(here, (step - keep, 0))  # this rank's positions, the unscored ones 0
            if not flat.numel():  # no response token here: the vocabulary head still takes part in backward
                here = here + 0.0 * logits.sum()
            whole = split.gather(here)
            outs.append(whole[row, where].masked_fill(~valid, 0.0))
        return outs[0], outs[1]

    def _keep(self, count: int) -> dict:
        """`logits_to_keep=count` where the model takes it: the vocabulary head then runs on the response
        positions only (with a large vocabulary, a sizeable share of a prompt token's cost)."""
        if not hasattr(self, "_takes_keep"):
            self._takes_keep = "logits_to_keep" in inspect.signature(_base(self.model).forward).parameters
        return {"logits_to_keep": count} if self._takes_keep else {}

    def _shared_prompt_logits(self, ids, attn, positions, plen: int) -> torch.Tensor | None:
        """The response positions' logits with every distinct prompt run once (GRPO's group shares one).

        The prompts' keys and values are computed once per distinct prompt and gathered to the rows that share
        it; the responses then attend to them as to their own. Gradients flow back through the gather, so
        each prompt's activations get the sum of its rows' gradients: the same loss and gradient as running
        every row whole, for (n-1)/n of the prompt tokens' work less. None where it saves nothing (no
        repeated prompts, no response positions) or cannot run (gradient checkpointing turns the cache off; a
        linear-attention layer's cache cannot be gathered by row).
        """
        rows = ids.shape[0]
        if (
            not self.share_prompts
            or self.sp > 1
            or plen < 1
            or ids.shape[1] <= plen
            or (self.s.gradient_checkpointing and self.model.training)
        ):
            return None
        # Rows share a prompt when its tokens and its padding are the same (`attn` None: no row is padded).
        real = attn[:, :plen] if attn is not None else torch.ones_like(ids[:, :plen])
        prompts, inverse = torch.unique(torch.cat([ids[:, :plen], real], 1), dim=0, return_inverse=True)
        if 2 * prompts.shape[0] > rows:
            return None  # fewer than half the prompt rows saved: not worth a second pass

        cache = DynamicCache(config=_base(self.model).config)
        if not all(hasattr(layer, "batch_select_indices") for layer in cache.layers):
            return None  # a recurrent state (Qwen3.5's linear-attention layers) has no rows to gather
        prompt_ids, prompt_attn = prompts[:, :plen], prompts[:, plen:]
        first = self.model(
            input_ids=prompt_ids,
            attention_mask=prompt_attn if attn is not None else None,
            position_ids=(prompt_attn.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            **{cache_keyword(self.model): cache},
            **self._keep(1),
        )
        cache.batch_select_indices(inverse)  # each row gets its prompt's keys and values (a differentiable gather)
        rest = self.model(
            input_ids=ids[:, plen:],
            attention_mask=attn,
            position_ids=positions[:, plen:],
            use_cache=True,
            **{cache_keyword(self.model): cache},
        )
        return torch.cat([first.logits[:, -1:][inverse], rest.logits], 1)

    @torch.no_grad()
    def forward(self, batch: TrainBatch, sum_pi_squared: bool = False) -> torch.Tensor:
        """Log-probs (policy, ref) or values (critic) of this rank's rows, on the CPU; with `sum_pi_squared`,
        (rows, response_len, 2): the log-probs and each token's sum of squared probabilities."""
        self.model.eval()
        out = torch.zeros(*batch.response_ids.shape, 2 if sum_pi_squared else 1)
        for rows in self._micro_batches(batch, self.s.micro_forward_batch_size):
            scores = self._outputs(self._device_batch(batch, rows), want_sum_pi_squared=sum_pi_squared)
            if rows is not None:
                for k in range(out.shape[-1]):
                    out[rows, :, k] = widened(scores[k].float().cpu(), out.shape[1])
        return out if sum_pi_squared else out[..., 0]

    # -- training -------------------------------------------------------------------------------------

    def train_mini_batch(self, batch: TrainBatch, totals: dict) -> dict:
        """One optimizer step on this rank's share of a mini-batch; `totals` are the whole mini-batch's counts."""
        self.model.train()
        sums: dict[str, float] = {}
        # On gloo every reduce-scatter is a round trip through the host's network stack: sum the micro-batches'
        # gradients locally and reduce once, at the last one (FSDP keeps them unsharded until then).
        defer = self.world_size > 1 and self.s.device == "cpu" and hasattr(self.model, "set_requires_gradient_sync")
        parts = self._micro_batches(batch, self.s.micro_train_batch_size)
        for i, rows in enumerate(parts):
            if defer:
                self.model.set_requires_gradient_sync(i == len(parts) - 1)
            mb = self._device_batch(batch, rows)
            loss, metrics = self._critic_loss(mb, totals) if self.s.role == "critic" else self._policy_loss(mb, totals)
            (loss * self.world_size).backward()
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        # max_grad_norm 0 turns clipping off, as in SkyRL (the norm is still measured: an infinite bound scales by 1).
        bound = self.config.optimizer_config.max_grad_norm or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), bound)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        lr = self.scheduler.get_last_lr()[0]  # this step's, before the scheduler moves on
        finite = math.isfinite(grad_norm)
        if finite:  # a non-finite gradient skips the step, and the schedule waits for the next real one (SkyRL)
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        sums.update(grad_norm=grad_norm, lr=lr, skipped=float(not finite))
        return sums

    def _policy_loss(self, mb: TrainBatch, totals: dict) -> tuple[torch.Tensor, dict]:
        logp, entropy = self._outputs(mb, want_entropy=True)
        return policy_objective(self.algorithm, logp, entropy, mb, totals, self.s.max_seq_len)

    def _critic_loss(self, mb: TrainBatch, totals: dict) -> tuple[torch.Tensor, dict]:
        values, _ = self._outputs(mb)
        return critic_objective(self.algorithm, values, mb, totals)

    # -- weights out ------------------------------------------------------------------------------------

    # -- weights over a broadcast group (weight_sync_backend gloo / nccl) --------------------------------

    def weight_metas(self, dtype: str | None = None) -> list:
        """Names, dtypes and shapes of what `broadcast_weights` sends (no gather needed)."""
        return metas_of(self.model.state_dict().items(), DTYPES.get(dtype or ""))

    @torch.no_grad()
    def broadcast_weights(self, dtype: str | None = None) -> int:
        """Stream the full weights to the engines, one gathered tensor at a time; every rank must call it."""
        stream = iter_full_params(self.model, DTYPES.get(dtype or ""))
        if self.rank == 0:
            return len(send_weights(self.weight_group, stream))
        for _ in stream:  # the gathers are collectives of the trainer ranks
            pass
        return 0

    # -- weights through CUDA IPC (engines on this rank's GPU) ------------------------------------------

    def start_ipc_weights(self, dtype: str | None, threshold_bytes: int) -> None:
        """Begin streaming the full weights, cast to `dtype`, as CUDA buffers of at most `threshold_bytes`
        (whole modules each, `weights.ipc.ipc_buckets`); then call `next_ipc_bucket` until it returns None.
        Every rank must take part: each tensor is gathered by all, and each rank packs it on its own GPU."""
        self._free_ipc_bucket()
        device = torch.device("cuda", torch.cuda.current_device())
        stream = iter_full_params(self.model, DTYPES.get(dtype or ""), device, rank0_only=False)
        self._ipc_buckets: Any = ipc_buckets(stream, threshold_bytes, device)

    @torch.no_grad()
    def next_ipc_bucket(self) -> tuple[dict, list] | None:
        """Free the previous bucket (call this once the engines have loaded it) and pack the next: its IPC
        handle keyed by this GPU's uuid, and its `weights.ipc.BucketEntry`s; None after the last bucket."""
        self._free_ipc_bucket()
        bucket = next(self._ipc_buckets, None)
        if bucket is None:
            self._ipc_buckets = None
            return None
        self._ipc_buffer, entries = bucket
        torch.cuda.current_stream().synchronize()  # the copies are in the buffer before another process reads it
        return {gpu_uuid(torch.cuda.current_device()): ipc_handle(self._ipc_buffer)}, entries

    def _free_ipc_bucket(self) -> None:
        if getattr(self, "_ipc_buffer", None) is not None:
            self._ipc_buffer = None
            torch.cuda.ipc_collect()  # release what the engines have let go of

    @torch.no_grad()
    def full_state_dict(self, dtype: str | None = None, adapters_only: bool = False) -> dict[str, torch.Tensor] | None:
        """The unsharded weights (LoRA adapters only when asked), gathered one tensor at a time; rank 0 gets
        them (on the CPU), others None.

        Every rank must call this: each `full_tensor()` is a collective.
        """
        cast = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(dtype or "")
        out: dict[str, torch.Tensor] = {}
        state = self.model.state_dict()
        if adapters_only:
            state = {k: v for k, v in state.items() if ".lora_" in k}
        for name, value in state.items():
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            if self.rank == 0:
                full = full.detach().to("cpu")
                out[name] = full.to(cast) if cast is not None and full.is_floating_point() else full.clone()
        return out if self.rank == 0 else None

    # -- checkpoints ------------------------------------------------------------------------------------

    def save_checkpoint(self, directory: str) -> None:
        """Sharded model and optimizer state with torch.distributed.checkpoint, plus this rank's scheduler and RNG."""
        # deferred: torch.distributed.checkpoint (~1 s), only for checkpoints; the driver imports this module
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        state = {"model": get_model_state_dict(self.model)}
        bad = first_non_finite(state["model"])
        if bad is not None:  # a diverged model must not rotate the good checkpoints out (max_ckpts_to_keep)
            raise ValueError(f"the {self.s.role}'s weight {bad} is NaN or infinite (training diverged): not saved")
        if self.optimizer is not None:
            state["optim"] = get_optimizer_state_dict(self.model, self.optimizer)
        dcp.save(state, checkpoint_id=directory)
        extra = {
            "rng": torch.get_rng_state(),
            "optimizer_steps": self.optimizer_steps,
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
        }
        if self.s.device == "cuda":
            extra["cuda_rng"] = torch.cuda.get_rng_state()
        torch.save(extra, Path(directory) / f"extra_rank{self.rank}.pt")
        if self.s.device == "cuda" and getattr(self.config, "record_memory", False) and self.s.memory_snapshot_dir:
            out = Path(self.s.memory_snapshot_dir)
            out.mkdir(parents=True, exist_ok=True)  # open the pickle at pytorch.org/memory_viz
            torch.cuda.memory._dump_snapshot(
                str(out / f"{self.s.role}_rank{self.rank}_step{self.optimizer_steps}.pickle")
            )
        dist.barrier()

    def load_checkpoint(self, directory: str) -> None:
        # deferred: torch.distributed.checkpoint (~1 s), only for checkpoints; the driver imports this module
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        state = {"model": get_model_state_dict(self.model)}
        if self.optimizer is not None:
            state["optim"] = get_optimizer_state_dict(self.model, self.optimizer)
        check_metadata(directory)
        dcp.load(state, checkpoint_id=directory)
        bad = first_non_finite(state["model"])
        if bad is not None:
            raise ValueError(f"{directory} holds NaN or infinite values in {bad}: resume from an older checkpoint")
        set_model_state_dict(self.model, state["model"])
        if self.optimizer is not None:
            set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        extra_path = Path(directory) / f"extra_rank{self.rank}.pt"
        if extra_path.exists():  # absent when resuming on a different world size
            extra = read_extra(extra_path)
            torch.set_rng_state(extra["rng"])
            if "cuda_rng" in extra and self.s.device == "cuda":
                torch.cuda.set_rng_state(extra["cuda_rng"])
            self.optimizer_steps = extra["optimizer_steps"]
            if self.scheduler is not None and extra["scheduler"] is not None:
                self.scheduler.load_state_dict(extra["scheduler"])

    def export_hf(self, directory: str, tokenizer_path: str) -> None:
        """A Hugging Face model directory of the current weights (policy: the LM; critic: backbone + head)."""
        full = self.full_state_dict()
        if self.rank == 0:
            os.makedirs(directory, exist_ok=True)
            if self.s.role == "critic":
                torch.save(full, Path(directory) / "critic.pt")
            else:
                lm = load_causal_lm(
                    self.s.model_path, language_model_only=self.language_model_only, dtype=torch.float32
                )
                if self.lora:  # the adapters merged into the base weights: a plain model anyone can load
                    lm = with_lora(lm, self.config.model.lora)
                    lm.load_state_dict(full)
                    lm = lm.merge_and_unload()
                else:
                    lm.load_state_dict(full)
                lm.save_pretrained(directory)
            AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(directory)
        dist.barrier()

    # -- colocation ---------------------------------------------------------------------------------------

    def offload(self, model: bool = True, optimizer: bool = True) -> None:
        """Move weights and/or optimizer state to the CPU (colocated GPUs); a no-op on a CPU run."""
        self._move("cpu", model, optimizer)
        if self.s.device == "cuda":
            torch.cuda.empty_cache()

    def backload(self, model: bool = True, optimizer: bool = True) -> None:
        """Bring weights and/or optimizer state back to the GPU; a no-op on a CPU run."""
        self._move("cuda", model, optimizer)

    def _move(self, device: str, model: bool, optimizer: bool) -> None:
        if self.s.device != "cuda":
            return
        if model:
            self.model.to(device)
        if optimizer and self.optimizer is not None:
            for st in self.optimizer.state.values():
                for k, v in st.items():
                    if torch.is_tensor(v) and k != "step":  # AdamW keeps its step count on the CPU
                        st[k] = v.to(device, non_blocking=True)
        torch.cuda.synchronize()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
