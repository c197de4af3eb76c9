"""Megatron-Core training workers (strategy `megatron`): one process per rank of the policy or ref.

Each rank builds Megatron's parallel state from the role's `megatron_config` (tensor, pipeline, context
and expert parallel sizes; data parallel is what remains of the world), a GPTModel stage from the Hugging
Face config (TransformerEngine's layer spec when it is installed, Megatron's local spec otherwise), loads
the Hugging Face weights through rlc's conversion (`rlc.runtime.workers.megatron_weights`; Megatron-Bridge, when
installed, only for architectures that conversion does not cover), and wraps it in Megatron's DDP and optimizer. Steps run Megatron's forward-backward schedule, so
pipeline stages pass activations as Megatron does. Under context parallelism each rank of a context group
holds two of 2·cp chunks of every row and attends to the whole row's keys (`megatron_cp`).

The driver gives every rank of a data-parallel group the same rows (`layout()`); only the ranks that
`collect` (tensor rank 0 of the last pipeline stage, context rank 0) return log-probs and loss metrics.
Losses are the same objective as fsdp2's (`workers.common.policy_objective`), computed from vocab-parallel
logits without gathering the vocabulary; with trainer.fused_lm_head_logprob, from the last hidden states and the head's
weight a chunk of logits at a time (`megatron_head`). Weights leave as Hugging Face tensors on global rank 0: each
parameter's tensor shards are gathered, pipeline stages send theirs to stage 0, and the conversion turns
them into Hugging Face names.

Megatron-Core needs CUDA; without a GPU, `megatron_cpu` redirects its CUDA calls to the CPU (slow, for
checking a job on a tiny model).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rlc.core.pipeline_stages import FIRST, LAST, VIRTUAL, Stages
from rlc.core.runtime_facts import LOGPROB_CHUNK_TOKENS, score_chunk
from rlc.runtime.algorithms.fused_head import score_from_hidden
from rlc.runtime.algorithms.losses import score_tokens
from rlc.runtime.batch import TrainBatch
from rlc.runtime.stopping import leave_sigterm_to_the_driver
from rlc.runtime.weights.broadcast import send_weights
from rlc.runtime.weights.tensors import metas_of
from rlc.runtime.workers import megatron_adapters, megatron_cpu, qat
from rlc.runtime.workers import megatron_cp as cp_utils
from rlc.runtime.workers import megatron_experts as mx
from rlc.runtime.workers import megatron_mtp as mtp
from rlc.runtime.workers import megatron_weights as mw
from rlc.runtime.workers import micro_batches as mbs
from rlc.runtime.workers.common import (
    DTYPES,
    TrainWorker,
    WorkerSettings,
    check_metadata,
    lr_lambda,
    policy_objective,
    read_extra,
)
from rlc.runtime.workers.megatron_cp import context_parallel_attention_class
from rlc.runtime.workers.megatron_head import HeadInput, bypassed, last_stage_model
from rlc.runtime.workers.megatron_lora import LoraLinear, add_adapters
from rlc.runtime.workers.megatron_replay import RoutingReplay
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

__all__ = ["MegatronWorker", "vocab_parallel_logprobs"]

# Fused kernels are CUDA code: a CPU run turns them off whatever the spec says.
_CPU_OFF = dict(
    bias_activation_fusion=False,
    masked_softmax_fusion=False,
    persist_layer_norm=False,
    gradient_accumulation_fusion=False,
    apply_rope_fusion=False,
    bias_dropout_fusion=False,
)


def _quiet() -> None:
    """Megatron-Core's and torch's notices that say nothing about the job (falling back to torch kernels without
    Apex/TransformerEngine, its own deprecated calls) are not shown; real warnings still are."""
    for message in (
        "Apex is not installed",
        "Transformer Engine and Apex are not installed",
        "full scope is deprecated",
        "The .grad attribute of a Tensor that is not a leaf",
        "Please use DTensor instead",
        "`load_state_dict` is deprecated",
        r"`torch.distributed.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    ):
        warnings.filterwarnings("ignore", message=message)


def _have_bridge() -> bool:
    try:
        return importlib.util.find_spec("megatron.bridge") is not None
    except ModuleNotFoundError:
        return False


def _have_softmax_kernels() -> bool:
    """Whether Megatron's fused masked-softmax CUDA extension is importable (it ships apart from megatron-core)."""
    return importlib.util.find_spec("scaled_masked_softmax_cuda") is not None


def _have_te() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def vocab_parallel_logprobs(
    logits: torch.Tensor | HeadInput,
    targets: torch.Tensor,
    temperature: float,
    vocab_size: int,
    want_entropy: bool = False,
    positions: torch.Tensor | None = None,
    want_sum_pi_squared: bool = False,
    chunks: tuple[int | None, int | None, int] = (LOGPROB_CHUNK_TOKENS, None, 512),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` (and the entropy, or the sum of squared probabilities) from this tensor rank's slice of
    the vocabulary's logits.

    `logits` is [rows, seq, vocab / tp]; `positions` (default: every one) are the sequence positions scored, in
    place, `targets` [rows, len(positions)]. The softmax normaliser and the target's logit are summed over the
    tensor-parallel group (forward: all-reduce; backward: each rank's own slice, since every rank holds the same
    loss), `chunk` tokens at a time in float32 (`score_tokens`). Columns past `vocab_size` (padding that makes the
    vocabulary divide by tp) get no probability. `chunks`: trainer.logprobs_chunk_size, vocab_entropy_chunk_size and
    vocab_entropy_chunk_memory_mb, the entropy's bound applying when the entropy is computed (`score_chunk`).

    A `HeadInput` (trainer.fused_lm_head_logprob) is scored the same from the hidden states and this rank's rows of
    the head, whose logits exist a chunk at a time; its entropy and squared probabilities are metrics (no gradient).
    """
    # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
    from megatron.core import parallel_state as ps

    if isinstance(logits, HeadInput):  # the chunk's logits are float32 whatever the model's dtype
        (rows, seq), local, logit_bytes = logits.hidden.shape[:2], logits.weight.shape[0], 4
    else:
        (rows, seq, local), logit_bytes = logits.shape, logits.element_size()
    if positions is None:
        positions = torch.arange(seq, device=logits.device)
    index = torch.arange(rows, device=logits.device)[:, None] * seq + positions.to(logits.device)[None, :]
    entropy_chunk = chunks[1] if want_entropy else None
    chunk = score_chunk(index.numel(), chunks[0], entropy_chunk, chunks[2], local, logit_bytes)
    common = {
        "entropy": want_entropy,
        "sum_pi_squared": want_sum_pi_squared,
        "rows": index,
        "vocab_start": ps.get_tensor_model_parallel_rank() * local,
        "vocab_size": vocab_size,
        "chunk": chunk,
        "group": ps.get_tensor_model_parallel_group(),
    }
    if isinstance(logits, HeadInput):
        return score_from_hidden(logits.hidden, logits.weight, targets, temperature, **common)
    # the head's logits feed nothing else: their gradient overwrites them
    return score_tokens(logits, targets, temperature, inplace_backward=True, **common)


class MegatronWorker(TrainWorker):
    """One rank of the policy or ref under Megatron-Core. `config` is the role's sub-config."""

    roles: tuple[str, ...] = ("policy", "ref")  # the critic is `megatron_critic.MegatronCriticWorker`

    def __init__(self, settings: WorkerSettings, config: Any, algorithm: Any, rank: int, world_size: int):
        if settings.role not in self.roles:
            raise ValueError(f"{type(self).__name__} runs no {settings.role!r} ({' and '.join(self.roles)} only)")
        leave_sigterm_to_the_driver()
        _quiet()
        # Megatron's tensor-parallel layers overlap their gradient all-reduce with compute only when kernels queue
        # in order on one CUDA connection; it must be set before CUDA starts.
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
        self.s, self.config, self.algorithm = settings, config, algorithm
        self.mc = config.megatron_config
        _check_fused_head(settings, algorithm)
        self.rank, self.world_size = rank, world_size
        # Built in setup(), once the process groups exist: one model chunk per virtual pipeline stage.
        self.models: list = []
        self.chunks: list = []  # the same chunks unwrapped (GPTModel)
        self.optimizer: Any = None
        self.optimizer_steps = 0
        self.lora = False
        self._schedule = lr_lambda("constant", 0, 1)
        self._stage_metas: list | None = None
        self.replay: RoutingReplay | None = None  # moe_enable_routing_replay: the engines' routes replayed (R3)
        self.mtp: mtp.Heads | None = None  # the policy's MTP heads (trainer.mtp), built in setup()

    # -- set-up ---------------------------------------------------------------------------------------

    def _device(self):
        """The context every call into Megatron runs in: the CPU redirection on a run without a GPU."""
        if self.s.device == "cpu":
            return megatron_cpu.active()
        return contextlib.nullcontext()

    def setup(self, master_addr: str, master_port: int) -> None:
        torch.manual_seed(self.s.seed)
        if self.s.deterministic:  # trainer.deterministic: a kernel without a deterministic version raises
            torch.use_deterministic_algorithms(True)
        if self.s.device == "cpu":
            megatron_cpu.enable()
        self._join_process_group(master_addr, master_port)
        self.hf_config = mtp.hf_config(self.s.model_path) or AutoConfig.from_pretrained(self.s.model_path)
        self.conversion = mw.conversion_for(self.hf_config)
        with self._device():
            self._parallel_state()
            self._build()

    def _parallel_state(self) -> None:
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        mc = self.mc
        model_parallel = mc.tensor_model_parallel_size * mc.pipeline_model_parallel_size * mc.context_parallel_size
        if self.world_size % model_parallel:
            raise ValueError(
                f"the {self.s.role} world size {self.world_size} is not divisible by tp*pp*cp = {model_parallel}"
            )
        self.vp = (mc.transformer_config_kwargs or {}).get(VIRTUAL) or 1
        if not ps.model_parallel_is_initialized():
            ps.initialize_model_parallel(
                tensor_model_parallel_size=mc.tensor_model_parallel_size,
                pipeline_model_parallel_size=mc.pipeline_model_parallel_size,
                virtual_pipeline_model_parallel_size=self.vp if self.vp > 1 else None,
                context_parallel_size=mc.context_parallel_size,
                expert_model_parallel_size=mc.expert_model_parallel_size,
                expert_tensor_parallel_size=mc.expert_tensor_parallel_size,
            )
        self.tp, self.tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
        self.pp, self.pp_rank = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
        self.dp, self.dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
        self.cp, self.cp_rank = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
        tensor_parallel.model_parallel_cuda_manual_seed(self.s.seed)

    def _transformer_config(self):
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core.transformer.transformer_config import TransformerConfig

        kwargs = self._config_kwargs(architecture=True)
        try:
            return TransformerConfig(**kwargs)
        except TypeError as exc:
            raise ValueError(f"trainer.{self.s.role}.megatron_config.transformer_config_kwargs: {exc}") from None

    def _config_kwargs(self, architecture: bool) -> dict:
        """TransformerConfig arguments: the model's architecture (from rlc's conversion, when `architecture`), the
        parallel sizes, dtypes, MoE flags and the spec's transformer_config_kwargs."""
        mc, cpu = self.mc, self.s.device == "cpu"
        dtype = torch.bfloat16 if self.s.bf16 and not cpu else torch.float32
        kwargs = dict(self.conversion.transformer_config_kwargs(self.hf_config)) if architecture else {}
        kwargs.update(
            tensor_model_parallel_size=mc.tensor_model_parallel_size,
            pipeline_model_parallel_size=mc.pipeline_model_parallel_size,
            context_parallel_size=mc.context_parallel_size,
            expert_model_parallel_size=mc.expert_model_parallel_size,
            expert_tensor_parallel_size=mc.expert_tensor_parallel_size,
            bf16=dtype == torch.bfloat16,
            params_dtype=dtype,
            pipeline_dtype=dtype,
            use_cpu_initialization=True,
        )  # weights are loaded into CPU tensors, then moved
        if _experts(self.hf_config, ("num_experts", "num_local_experts")):
            kwargs.update(
                moe_token_dispatcher_type=mc.moe_token_dispatcher_type,
                moe_router_load_balancing_type=mc.moe_router_load_balancing_type,
                moe_grouped_gemm=mc.moe_grouped_gemm,
            )
            if mc.tensor_model_parallel_size > 1:  # Megatron-Core trains MoE under TP only so (SkyRL sets it too)
                kwargs["sequence_parallel"] = True
            if mc.moe_router_score_function is not None:
                kwargs["moe_router_score_function"] = mc.moe_router_score_function
            if mc.moe_router_enable_expert_bias is not None:
                kwargs["moe_router_enable_expert_bias"] = mc.moe_router_enable_expert_bias
        if mc.moe_enable_routing_replay and _experts(self.hf_config):  # routing replay: Megatron's RouterReplay
            kwargs["moe_enable_routing_replay"] = True
        if not _have_softmax_kernels():  # Megatron's fused softmax is a compiled extension that may be missing
            kwargs["masked_softmax_fusion"] = False
        kwargs.update(mc.transformer_config_kwargs or {})
        if kwargs.get(VIRTUAL) == 1:  # one chunk a stage: the plain schedule
            kwargs[VIRTUAL] = None
        if kwargs.get(VIRTUAL) and mc.pipeline_model_parallel_size == 2:
            # Two stages in a ring are each other's previous and next: batched sends post an activation and a
            # gradient to the same peer in an order its receives do not follow, and the two swap. Megatron's
            # unbatched exchange orders them by rank parity.
            kwargs["batch_p2p_comm"] = False
        if self.s.max_tokens_per_microbatch > 0 and mc.pipeline_model_parallel_size > 1:
            # Token-budget micro-batches differ in shape: stages send each one's first. Megatron-Core refuses that
            # with its default allgather MoE dispatcher even on a dense model, where no dispatcher runs.
            kwargs["variable_seq_lengths"] = True
            kwargs.setdefault("moe_token_dispatcher_type", "alltoall")
        if cpu:
            kwargs.update(_CPU_OFF)
        if kwargs.get("recompute_granularity") is None:  # no activation recompute: its options would be refused
            for k in ("recompute_method", "recompute_num_layers", "recompute_modules"):
                kwargs.pop(k, None)
        return kwargs

    def _build(self) -> None:
        te = _have_te() and self.s.device == "cuda"
        try:
            self.arch = self.conversion.layout_from_hf(self.hf_config, self.tp, fused_norms=te)
        except mw.UnsupportedModel as exc:
            if not _have_bridge():
                raise RuntimeError(
                    f"{exc}. Megatron-Bridge (pip install megatron-bridge, Python >= 3.12) converts more "
                    "architectures; rlc uses it for models its own conversion does not cover"
                ) from None
            if self.cp > 1:
                raise RuntimeError(
                    f"{exc}: context parallelism needs a model rlc's conversion covers (Llama, Qwen2, "
                    "Mistral); Megatron-Bridge builds this one"
                ) from None
            if self.s.mtp_loss_weight is not None:
                raise RuntimeError(f"{exc}: MTP heads need a MiMo-style checkpoint rlc's conversion covers") from None
            self.bridge = self._build_with_bridge()
        else:
            self.bridge = None
            self._check_experts(te)
            self._build_with_rlc_conversion(te)
            self._reduce_experts_apart()
        lora = getattr(self.config.model, "lora", None)
        if self.s.role == "policy" and lora is not None and lora.rank > 0:
            if self.bridge is not None:
                raise RuntimeError(
                    "LoRA under the megatron strategy needs a model rlc's conversion covers "
                    "(Llama, Qwen2, Mistral); this one goes through Megatron-Bridge"
                )
            for chunk in self.chunks:
                add_adapters(chunk, lora, self.mc.lora_config.lora_type, self.arch, self.tp)
            self.lora = True
        if getattr(self.tconfig, "moe_enable_routing_replay", False):
            self.replay = RoutingReplay(self.chunks, self.tconfig)
        elif self.mc.moe_enable_routing_replay:
            raise RuntimeError(
                f"moe_enable_routing_replay: {self.s.model_path} ({self.hf_config.model_type}) has no mixture-of-experts "
                "router to replay the engines' routes in"
            )
        if self.s.fake_int4_qat is not None:  # the routed experts on the served INT4 grid in every forward
            qat.install(self.chunks, self.s.fake_int4_qat)
        models = list(self.chunks)
        if self.s.device == "cuda":
            for model in models:
                model.cuda()
        if self.tconfig.bf16:
            # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
            from megatron.core.transformer.module import Float16Module

            models = [Float16Module(self.tconfig, model) for model in models]
        if self.s.role == "ref":
            self.models = models
            for model in models:
                model.requires_grad_(False)
        else:
            self._wrap_for_training(models)
        self._exchange_stage_metas()

    def _check_experts(self, te: bool) -> None:
        """One-line refusals of what Megatron-Core would only refuse with a traceback mid-step (RLC-E517 and E518
        say so at compile time)."""
        experts = getattr(self.arch, "experts", None)
        if experts is None:
            return
        why = mx.check(
            experts, self.tp, self.mc.expert_model_parallel_size, self.mc.expert_tensor_parallel_size or self.tp
        )
        if why:
            raise RuntimeError(f"{self.hf_config.model_type}: {why}")
        sp = self.tp > 1 and (self.mc.transformer_config_kwargs or {}).get("sequence_parallel", True)
        if self.tp > 1 and not sp:
            raise RuntimeError(
                "Megatron-Core trains a mixture-of-experts model under tensor parallelism only with sequence "
                "parallelism: drop megatron_config.transformer_config_kwargs.sequence_parallel: false (RLC-E518)"
            )

    def _block_spec(self, spec, v: int):
        """The layer spec as is; a local one whose norms take sequence parallelism (mx.SequenceParallelNorm) as a
        block spec of this chunk's layers whose final norm takes it too (Megatron's default is its local norm)."""
        if hasattr(spec, "layer_specs") or spec.submodules.input_layernorm is not mx.SequenceParallelNorm:
            return spec
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

        count = get_num_layers_to_build(self.tconfig, vp_stage=v if self.vp > 1 else None)
        return TransformerBlockSubmodules(layer_specs=[spec] * count, layer_norm=mx.SequenceParallelNorm)

    def _reduce_experts_apart(self) -> None:
        """Megatron-Core flags an expert weight for the expert-data-parallel gradient reduction only under expert
        parallelism (`allreduce = not (is_expert and expert_model_parallel_size > 1)`). With the experts split by an
        expert_tensor_parallel_size apart from tensor_model_parallel_size at one expert-parallel rank, its DDP would
        then all-reduce the expert gradients over the dense data-parallel group, whose ranks hold different expert
        shards: each rank's shard got the sum of all shards' gradients. Flagged expert-parallel, they reduce over the
        expert-data-parallel group, as under expert parallelism."""
        etp = self.mc.expert_tensor_parallel_size
        if getattr(self.arch, "experts", None) is None or etp is None or etp == self.tp:
            return
        for chunk in self.chunks:
            for name, param in chunk.named_parameters():
                if ".mlp.experts." in name:  # routed experts only: shared experts split over tp like dense layers
                    param.allreduce = False

    def _build_with_bridge(self):
        """A GPTModel stage built and loaded by Megatron-Bridge (architectures rlc's conversion does not cover,
        MoE ones among them); this rank's parallel sizes and the spec's Megatron settings set on its provider.
        Weights leave through the bridge's own export."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.bridge import AutoBridge
        from megatron.core.utils import unwrap_model

        bridge = AutoBridge.from_hf_pretrained(self.s.weights_path or self.s.model_path)
        provider = bridge.to_megatron_provider(load_weights=True)
        for key, value in self._config_kwargs(architecture=False).items():
            setattr(provider, key, value)
        provider.finalize()
        self.chunks = [unwrap_model(c) for c in provider.provide_distributed_model(wrap_with_ddp=False)]
        self.tconfig = self.chunks[0].config
        cfg = self.tconfig
        vocab = self.hf_config.vocab_size
        self.arch = mw.Layout(
            num_layers=cfg.num_layers,
            hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads,
            num_query_groups=cfg.num_query_groups or cfg.num_attention_heads,
            head_dim=cfg.kv_channels,
            ffn_hidden_size=cfg.ffn_hidden_size,
            vocab_size=vocab,
            padded_vocab_size=self.chunks[0].vocab_size,
            tied=self.chunks[0].share_embeddings_and_output_weights,
            qkv_bias=bool(cfg.add_qkv_bias),
        )
        return bridge

    def _build_with_rlc_conversion(self, te: bool) -> None:
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps
        from megatron.core.models.gpt import GPTModel
        from megatron.core.transformer.enums import AttnMaskType

        self.tconfig = config = self._transformer_config()
        spec = self.conversion.layer_spec(config, te)
        # Rows are padded: a plain `causal` layer ignores the mask given to it (TransformerEngine's attention, and
        # Megatron's fused upper-triangle softmax), so padding must be masked as well.
        layer = spec.layer_specs[0] if hasattr(spec, "layer_specs") else spec  # a block's layers share one spec
        layer.submodules.self_attention.params["attn_mask_type"] = AttnMaskType.padding_causal
        if self.cp > 1:  # rlc's context-parallel attention, with TransformerEngine's linear layers or without
            layer.submodules.self_attention.submodules.core_attention = context_parallel_attention_class()
        kwargs = self._gpt_kwargs()
        self.chunks = [
            GPTModel(
                config,
                transformer_layer_spec=self._block_spec(spec, v),
                pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v),
                post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v),
                vp_stage=v if self.vp > 1 else None,
                **kwargs,
            )
            for v in range(self.vp)
        ]
        if self.s.mtp_loss_weight is not None:
            count = mtp.head_count(self.hf_config, self.mc.mtp_num_layers)
            if count < 1 or self.pp > 1 or self.vp > 1 or self.cp > 1:
                raise RuntimeError(
                    f"MTP heads need a checkpoint with heads and one pipeline stage, no cp ({count} heads)"
                )
            self.mtp = mtp.Heads.attach(self.chunks[0], config, spec, te, count, self.mc, self.s.mtp_loss_weight)
        self._load_hf()

    def _stages(self) -> Stages:
        """Where Megatron-Core placed the decoder layers (uneven first/last stages, virtual stages)."""
        settings = {k: getattr(self.tconfig, k) for k in (FIRST, LAST, VIRTUAL)}
        return Stages.of(self.arch.num_layers, self.pp, settings)

    def _gpt_kwargs(self) -> dict:
        """GPTModel's arguments from the Hugging Face config, then the spec's model_config_kwargs."""
        return {**self.conversion.gpt_model_kwargs(self.hf_config, self.arch), **(self.mc.model_config_kwargs or {})}

    def _fit_chunk(self, model, state: dict) -> dict:
        """The converted weights a model chunk loads (a subclass may change the chunk or the weights first)."""
        return state

    def _own_weight(self, name: str) -> bool:
        """A parameter of the chunk that no converted weight fills (a subclass's own)."""
        return False

    def _load_hf(self) -> None:
        hf = AutoModelForCausalLM.from_pretrained(
            self.s.weights_path or self.s.model_path, config=self.hf_config, dtype=torch.float32
        ).state_dict()
        stages = self._stages()
        for v, model in enumerate(self.chunks):
            state = self.conversion.hf_to_megatron(
                hf, self.arch, self.tp_rank, self.tp, self.pp_rank, stages=stages, vp_stage=v, **self._placement()
            )
            if self.mtp is not None:
                heads = mtp.read_heads(self.s.model_path)
                state.update(mtp.hf_to_megatron(heads, hf, self.arch, self.mtp.count, self.tp_rank, self.tp))
            missing, unexpected = model.load_state_dict(self._fit_chunk(model, state), strict=False)
            missing = [k for k in missing if not k.endswith("_extra_state") and not self._own_weight(k)]
            if missing or unexpected:
                raise RuntimeError(
                    f"the converted weights do not fit the Megatron model: missing {missing[:5]}, "
                    f"unexpected {unexpected[:5]}"
                )

    def _placement(self) -> dict:
        """The conversion's argument placing a mixture-of-experts model's experts on this rank (none for a dense
        model): its expert-parallel and expert-tensor-parallel ranks."""
        if getattr(self.arch, "experts", None) is None:
            return {}
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps

        return {
            "experts": mx.Placement(
                ps.get_expert_model_parallel_rank(),
                ps.get_expert_model_parallel_world_size(),
                ps.get_expert_tensor_parallel_rank(),
                ps.get_expert_tensor_parallel_world_size(),
            )
        }

    def _wrap_for_training(self, models: list) -> None:
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        mc, opt = self.mc, self.config.optimizer_config
        extra = dict(mc.optimizer_config_kwargs or {})
        distributed = bool(extra.pop("use_distributed_optimizer", True))
        ddp = mc.ddp_config
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=ddp.grad_reduce_in_fp32,
            overlap_grad_reduce=ddp.overlap_grad_reduce,
            overlap_param_gather=ddp.overlap_param_gather,
            average_in_collective=ddp.average_in_collective,
            use_distributed_optimizer=distributed,
        )
        # As Megatron's own training does: only the first chunk's gradients are bucketed for overlapped reduction.
        self.models = [
            DistributedDataParallel(config=self.tconfig, module=m, ddp_config=ddp_config, disable_bucketing=v > 0)
            for v, m in enumerate(models)
        ]
        self.tconfig.finalize_model_grads_func = finalize_model_grads
        try:
            ocfg = OptimizerConfig(
                optimizer="adam",
                lr=opt.lr,
                min_lr=0.0,
                weight_decay=opt.weight_decay,
                adam_beta1=opt.adam_betas[0],
                adam_beta2=opt.adam_betas[1],
                clip_grad=opt.max_grad_norm,
                bf16=self.tconfig.bf16,
                params_dtype=self.tconfig.params_dtype,
                use_distributed_optimizer=distributed,
                **extra,
            )
        except TypeError as exc:
            raise ValueError(f"trainer.{self.s.role}.megatron_config.optimizer_config_kwargs: {exc}") from None
        self.optimizer = get_megatron_optimizer(ocfg, self.models)
        self._base_lr = opt.lr
        self._schedule = lr_lambda(opt.scheduler, opt.num_warmup_steps, self.s.total_optimizer_steps)

    def layout(self) -> dict:
        """Which rows this rank takes (its data-parallel rank of `dp`) and whether it returns results."""
        collect = self.tp_rank == 0 and self.pp_rank == self.pp - 1 and self.cp_rank == 0
        return {"dp_rank": self.dp_rank, "dp_size": self.dp, "collect": collect}

    # -- forward-backward -------------------------------------------------------------------------------

    def _micro_batches(self, batch: TrainBatch, size: int) -> list[tuple[torch.Tensor | None, TrainBatch]]:
        """This rank's micro-batches, each with the batch rows it scores (None: a row with no loss).

        Blocks of `size` rows; with pipeline stages every block has the same shape (the last one padded with rows
        that carry no loss), since stages exchange fixed-size activations. Under a token budget as many rows as
        one holds, each micro-batch in its narrowest layout (`runtime/workers/micro_batches.py`; stages then send
        each activation's shape first, `variable_seq_lengths`), and every rank runs as many as the busiest
        data-parallel rank: the experts' all-to-alls span data-parallel ranks, so no rank may skip a forward. The
        interleaved schedule (virtual stages) takes whole rounds of pp micro-batches: rows with no loss fill it.
        """
        budget = self.s.max_tokens_per_microbatch
        if budget <= 0:
            out = []
            for i in range(0, batch.rows, size):
                mb = batch.select(slice(i, i + size))
                rows = torch.arange(i, i + mb.rows)
                if mb.rows < size and self.pp > 1:
                    mb = mb.map(partial(_pad_rows, rows=size - mb.rows))
                out.append((rows, mb))
            return self._whole_rounds(out, (None, _empty_micro_batch(batch, size)))
        prompts, responses = mbs.lengths(batch)
        parts = [torch.tensor(rows) for rows in mbs.by_tokens(prompts, responses, budget, packed=False)]
        count = torch.tensor(len(parts))
        if self.world_size > 1:  # a CPU tensor: gloo carries it on a GPU run too
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        micro: list[tuple[torch.Tensor | None, TrainBatch]] = [(r, mbs.trimmed(batch.select(r))) for r in parts]
        inert = (None, mbs.trimmed(mbs.inert(batch)))
        return self._whole_rounds(micro + [inert] * (int(count) - len(parts)), inert)

    def _whole_rounds(self, micro: list, filler) -> list:
        if self.vp > 1:
            micro = micro + [filler] * (-len(micro) % self.pp)
        return micro

    def _seq_len(self, mb: TrainBatch) -> int:
        """The row length the model sees: with context parallelism, padded to split into 2·cp chunks; with sequence
        parallelism, into tp pieces of each."""
        seq = mb.input_ids.shape[1]
        step = (2 * self.cp if self.cp > 1 else 1) * (
            self.tp if getattr(self.tconfig, "sequence_parallel", False) else 1
        )
        return -(-seq // step) * step

    def _inputs(self, mb: TrainBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token ids, positions and Megatron's attention mask (True = masked: causal and padding); with context
        parallelism, this rank's two chunks of every row and their mask against the whole row's keys."""
        dev = "cuda" if self.s.device == "cuda" else "cpu"
        ids, attn = mb.input_ids.to(dev), mb.attention_mask.to(dev)
        pad = self._seq_len(mb) - ids.shape[1]
        if pad:
            ids, attn = (torch.nn.functional.pad(t, (0, pad)) for t in (ids, attn))
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        mine = cp_utils.local_positions(ids.shape[1], self.cp, self.cp_rank).to(dev)
        return ids[:, mine], positions[:, mine], cp_utils.attention_mask(attn, self.cp, self.cp_rank)

    def _response_logprobs(
        self, logits: torch.Tensor, mb: TrainBatch, want_entropy: bool, want_sum_pi_squared: bool = False
    ):
        """Log-probs (and entropies, or sums of squared probabilities) of the response tokens, [rows, response
        length]; with context parallelism each rank scores the positions it holds and the group sums them, so every
        rank has the whole rows."""
        start, length = mb.prompt_len - 1, mb.response_ids.shape[1]
        response = mb.response_ids.to(logits.device)
        if self.cp == 1:
            return vocab_parallel_logprobs(
                logits,
                response,
                self.s.temperature,
                self.arch.vocab_size,
                want_entropy,
                positions=torch.arange(start, start + length, device=logits.device),
                want_sum_pi_squared=want_sum_pi_squared,
                chunks=self._score_chunks(),
            )
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps

        held = cp_utils.local_positions(self._seq_len(mb), self.cp, self.cp_rank).to(logits.device)
        scoring = (held >= start) & (held < start + length)
        positions = held[scoring]
        logp, entropy = vocab_parallel_logprobs(
            logits,
            response[:, positions - start],
            self.s.temperature,
            self.arch.vocab_size,
            want_entropy,
            positions=torch.nonzero(scoring).flatten(),
            want_sum_pi_squared=want_sum_pi_squared,
            chunks=self._score_chunks(),
        )
        group = ps.get_context_parallel_group()
        logp = cp_utils.response_values(logp, positions, start, length, group)
        if entropy is not None:
            entropy = cp_utils.response_values(entropy, positions, start, length, group)
        return logp, entropy

    def _score_chunks(self) -> tuple[int | None, int | None, int]:
        return (self.s.logprobs_chunk_size, self.s.entropy_chunk_size, self.s.entropy_chunk_memory_mb)

    def _schedule_run(self, micro: list[TrainBatch], loss_fn, forward_only: bool) -> list:
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core.pipeline_parallel import get_forward_backward_func

        replay = self.replay if any(mb.routed_experts is not None for mb in micro) else None

        def step(data_iterator, model):
            mb = next(data_iterator)
            ids, positions, mask = self._inputs(mb)
            if replay is not None:
                if mb.routed_experts is None:
                    raise RuntimeError("routing replay: a micro-batch came without the engines' routed experts")
                replay.forward(mb.routed_experts, mb.attention_mask, self.tp, self.tp_rank, ids.device)
            if self.mtp is None or forward_only:
                head = last_stage_model(model) if self.s.fused_lm_head else None
                seen: dict = {}
                with bypassed(head, seen) if head is not None else contextlib.nullcontext():
                    output = model(ids, positions, mask)
                if replay is not None:
                    replay.after_forward()
                if head is None:
                    return output, partial(loss_fn, mb)
                return output, lambda hidden: loss_fn(mb, HeadInput(hidden, seen["weight"]))
            chunk = self._unwrapped()[0]
            chunk = getattr(chunk, "module", chunk)  # Float16Module
            with self.mtp.capture(chunk):
                output = model(ids, positions, mask)
            if replay is not None:
                replay.after_forward()
            self.mtp.run(chunk, ids, positions)  # one stage: the loss below runs before the next forward
            return output, partial(loss_fn, mb)

        with replay.schedule() if replay is not None else contextlib.nullcontext():
            return get_forward_backward_func()(
                forward_step_func=step,
                data_iterator=[iter(micro) for _ in self.models] if self.vp > 1 else iter(micro),
                model=self.models,
                num_microbatches=len(micro),
                seq_length=self._seq_len(micro[0]),
                micro_batch_size=micro[0].rows,
                forward_only=forward_only,
            )

    @torch.no_grad()
    def forward(self, batch: TrainBatch, sum_pi_squared: bool = False) -> torch.Tensor:
        """Log-probs of this data-parallel rank's rows on the collecting ranks; an empty tensor elsewhere. With
        `sum_pi_squared`, (rows, response_len, 2): the log-probs and each token's sum of squared probabilities."""
        with self._device():
            for model in self.models:
                model.eval()
            micro = self._micro_batches(batch, self.s.micro_forward_batch_size)

            def scored(mb, logits):
                logp, squares = self._response_logprobs(logits, mb, False, sum_pi_squared)
                out = torch.stack([logp, squares], -1) if squares is not None else logp
                return logp.sum() * 0.0, {"logp": out.float().cpu()}

            outs = self._schedule_run([mb for _, mb in micro], scored, forward_only=True)
            self._maybe_empty_cache()
        if not self.layout()["collect"]:
            return torch.empty(0)
        # Each micro-batch's rows back in their batch order, narrowed responses zero-padded to the batch's width.
        first = outs[0]["logp"]
        out = first.new_zeros((batch.rows, batch.response_ids.shape[1], *first.shape[2:]))
        for (rows, _), o in zip(micro, outs):
            if rows is not None:
                out[rows, : o["logp"].shape[1]] = o["logp"][: len(rows)]
        return out

    def train_mini_batch(self, batch: TrainBatch, totals: dict) -> dict:
        """One optimizer step on this data-parallel rank's share of a mini-batch."""
        with self._device(), self._profiled():
            for model in self.models:
                model.train()
                model.zero_grad_buffer()
            self.optimizer.zero_grad()
            lr = self._base_lr * self._schedule(self.optimizer_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            micro = [mb for _, mb in self._micro_batches(batch, self.s.micro_train_batch_size)]
            # Megatron divides each micro-batch's loss by their number and averages gradients over data-parallel
            # ranks; the objective is already each micro-batch's share of the mini-batch, so undo both.
            scale = len(micro) * self.dp
            real = max(1, sum(int(mb.attention_mask.any()) for mb in micro))

            def objective(mb, output):
                loss, metrics = self._objective(mb, output, totals)
                if self.mtp is None:
                    return loss * scale, metrics
                # SkyRL's weighting: the micro-batches' mean draft loss, its gradient averaged over data-parallel ranks
                draft = self._draft_loss(mb, output)
                metrics["mtp_loss"] = float(draft.detach()) / (real * self.dp)  # a share: the driver sums ranks
                return loss * scale + self.mtp.weight * draft * len(micro) / real, metrics

            outs = self._schedule_run(micro, objective, forward_only=False)
            if self.mtp is None:
                ok, grad_norm, _ = self.optimizer.step()
            else:
                ok, grad_norm = mtp.step_clipping_apart(self.optimizer, list(self.chunks[0].mtp.parameters()))
            self.optimizer_steps += 1
            self._maybe_empty_cache()
        grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        sums: dict[str, float] = {}
        for metrics in outs:
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        sums.update(grad_norm=grad_norm, lr=lr, skipped=float(not ok or not math.isfinite(grad_norm)))
        return sums

    def _objective(self, mb: TrainBatch, logits: torch.Tensor, totals: dict) -> tuple[torch.Tensor, dict]:
        """One micro-batch's share of the mini-batch's loss, from the last stage's output."""
        logp, entropy = self._response_logprobs(logits, mb, True)
        return policy_objective(self.algorithm, logp, entropy, mb.to(logp.device), totals, self.s.max_seq_len)

    def _draft_loss(self, mb: TrainBatch, logits: torch.Tensor) -> torch.Tensor:
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps

        assert self.mtp is not None
        group = ps.get_tensor_model_parallel_group()
        return self.mtp.loss(logits, mb.attention_mask, self.arch.vocab_size, self.tp_rank, group)

    @contextlib.contextmanager
    def _profiled(self):
        """torch_profiler_config: a trace of each optimizer step on the listed ranks."""
        prof = self.mc.torch_profiler_config
        if not prof.enable or self.rank not in (prof.ranks or []):
            yield
            return

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.s.device == "cuda" else [])
        out = Path(os.path.expanduser(prof.save_path or "profiler"))
        out.mkdir(parents=True, exist_ok=True)
        with profile(activities=activities, record_shapes=True) as p:
            yield
        p.export_chrome_trace(str(out / f"{self.s.role}_rank{self.rank}_step{self.optimizer_steps}.json"))

    def _maybe_empty_cache(self) -> None:
        empty = self.mc.empty_cuda_cache
        if self.s.device == "cuda" and (empty if empty is not None else self.s.colocated):
            torch.cuda.empty_cache()

    # -- weights out ------------------------------------------------------------------------------------

    def _exchange_stage_metas(self) -> None:
        """Every stage's parameters (global Megatron name, local shape, dtype), known to every rank of the pipeline."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps

        if self.bridge is not None:  # its export knows the stages
            return
        mine = [(n, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in self._named_params()]
        if self.pp == 1:
            self._stage_metas = [mine]
            return
        gathered: list = [None] * self.pp
        dist.all_gather_object(gathered, mine, group=ps.get_pipeline_model_parallel_group())
        self._stage_metas = gathered

    def _named_params(self) -> list[tuple[str, torch.Tensor]]:
        """This stage's weights under Megatron's names with global layer numbers, chunk by chunk; with LoRA the
        adapted layers' merged weights (every rank of the tensor group must call it then)."""
        stages, out = self._stages(), []
        for v, chunk in enumerate(self.chunks):
            offset = stages.layers(self.pp_rank, v).start
            merged = {}
            if self.lora:
                merged = {
                    f"{n}.weight": m.merged_weight() for n, m in chunk.named_modules() if isinstance(m, LoraLinear)
                }
            for name, p in chunk.state_dict(keep_vars=True).items():
                if (
                    not torch.is_tensor(p)
                    or name.endswith("_extra_state")
                    or ".lora_" in name
                    or name.endswith(".magnitude")
                ):
                    continue
                name = name.replace(".base.", ".")
                out.append((self.conversion.global_name(name, offset), merged.get(name, p)))
        return out

    def _shard_count(self, name: str) -> int:
        return self.tp if mtp.tp_split_dim(name, self.conversion) is not None else 1

    def weight_metas(self, dtype: str | None = None) -> list:
        """Hugging Face names, dtypes and shapes of what `broadcast_weights` sends, in order (no collectives:
        the conversion runs on meta tensors)."""
        return metas_of(self._hf_stream(meta=True), DTYPES.get(dtype or ""))

    def _hf_stream(self, meta: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, full tensor) pairs on global rank 0, parameter by parameter.

        Every rank of data-parallel replica 0 and context rank 0 must iterate it (tensor shards are gathered,
        stages send to stage 0), and with experts every rank of expert-data-parallel replica 0 (each routed expert's
        shards are gathered over the expert-tensor and expert-parallel groups); other replicas take no part. `meta=True` yields meta tensors
        of the right shapes on the calling rank without any communication.
        """
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps

        if self.bridge is not None:
            yield from self._bridge_stream(meta)
            return
        place = self._placement().get("experts")
        # Dense weights come from data-parallel replica 0; a routed expert's from expert-data-parallel replica 0, whose
        # expert-parallel group spans ranks of other data-parallel replicas.
        dense_part = meta or (self.dp_rank == 0 and self.cp_rank == 0)
        expert_part = meta or (place is not None and ps.get_expert_data_parallel_rank() == 0)
        if not dense_part and not expert_part:
            return
        local = {} if meta else dict(self._named_params())
        assert self._stage_metas is not None, "weight_metas() runs before a stream"
        for stage, metas in enumerate(self._stage_metas):
            for name, shape, dtype in metas:
                if name == "output_layer.weight" and self.arch.tied:
                    continue  # the embedding carries it
                routed = place if place is not None and mx.is_expert(name) else None
                if not (expert_part if routed else dense_part):
                    continue
                count = routed.ep_size * routed.etp_size if routed else self._shard_count(name)
                if meta:
                    shards = [torch.empty(shape, dtype=getattr(torch, dtype), device="meta")] * count
                    yield from self._to_hf(name, shards, routed)
                    continue
                stacked = None
                if stage == self.pp_rank:
                    tensor = local[name].detach()
                    if routed:
                        stacked = self._gather_experts(tensor, routed)
                    elif count > 1:
                        parts = [torch.empty_like(tensor) for _ in range(count)]
                        dist.all_gather(parts, tensor.contiguous(), group=ps.get_tensor_model_parallel_group())
                        stacked = torch.stack(parts)
                    else:
                        stacked = tensor.unsqueeze(0)
                if self.tp_rank != 0 or self.dp_rank != 0 or self.cp_rank != 0:
                    continue
                if self.pp > 1:
                    group = ps.get_pipeline_model_parallel_group()
                    if stacked is None:
                        dev = "cuda" if self.s.device == "cuda" else "cpu"
                        stacked = torch.empty((count, *shape), dtype=getattr(torch, dtype), device=dev)
                    src = dist.get_global_rank(group, stage)
                    dist.broadcast(stacked.contiguous(), src=src, group=group)
                if self.rank == 0:
                    assert stacked is not None  # every rank of the group took part in the broadcast above
                    yield from self._to_hf(name, list(stacked.cpu().unbind(0)), routed)

    def _gather_experts(self, tensor: torch.Tensor, place: mx.Placement) -> torch.Tensor:
        """A routed expert weight of every expert-parallel rank, each in its expert-tensor-parallel shards:
        [ep * etp, *shape], expert-parallel rank major."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import parallel_state as ps

        stacked = tensor.unsqueeze(0)
        for size, group in (
            (place.etp_size, ps.get_expert_tensor_parallel_group()),
            (place.ep_size, ps.get_expert_model_parallel_group()),
        ):
            if size > 1:
                parts = [torch.empty_like(stacked) for _ in range(size)]
                dist.all_gather(parts, stacked.contiguous(), group=group)
                stacked = torch.cat(parts)
        return stacked

    def _to_hf(self, name: str, shards: list, place: mx.Placement | None) -> Iterator[tuple[str, torch.Tensor]]:
        """The conversion's HF tensors of one Megatron weight; a routed expert's `shards` hold every expert-parallel
        rank's copy of it (their local experts), renamed to global expert indices."""
        if place is None:
            yield from mtp.megatron_to_hf(name, shards, self.arch, self.conversion)
            return
        per_rank = self.arch.experts.num_experts // place.ep_size
        for r in range(place.ep_size):
            mine = shards[r * place.etp_size : (r + 1) * place.etp_size]
            yield from self.conversion.megatron_to_hf(mx.global_expert_name(name, r * per_rank), mine, self.arch)

    def _bridge_stream(self, meta: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """The Hugging Face weights of a Megatron-Bridge model, in the HF model's own order (metas need no
        collectives). The bridge's export gathers on every rank; rank 0 holds the whole model on the CPU once."""
        with torch.device("meta"):
            shapes = AutoModelForCausalLM.from_config(self.hf_config).state_dict()
        names = [
            n for n in shapes if not (n == "lm_head.weight" and getattr(self.hf_config, "tie_word_embeddings", False))
        ]
        if meta:
            yield from ((n, shapes[n]) for n in names)
            return
        exported = {}
        for name, tensor in self.bridge.export_hf_weights(self.models, cpu=True, show_progress=False):
            if self.rank == 0:
                exported[name] = tensor
        if self.rank != 0:
            return
        missing = [n for n in names if n not in exported]
        if missing:
            raise RuntimeError(f"Megatron-Bridge exported no {missing[:3]} of the Hugging Face model")
        yield from ((n, exported.pop(n)) for n in names)

    @torch.no_grad()
    def full_state_dict(self, dtype: str | None = None, adapters_only: bool = False) -> dict[str, torch.Tensor] | None:
        """The Hugging Face state dict on global rank 0 (None elsewhere); every rank must call it. With LoRA the
        adapters are merged in, unless `adapters_only` asks for them alone and lora_config.merge_lora is off (the
        engines then apply them, `megatron_adapters`)."""
        cast = DTYPES.get(dtype or "")
        if adapters_only and self.lora and not self.mc.lora_config.merge_lora:
            with self._device():
                return megatron_adapters.hf_adapters(self, cast)
        with self._device():
            out = {
                name: (t.to(cast) if cast is not None and t.is_floating_point() else t.clone())
                for name, t in self._hf_stream()
            }
        return out if self.rank == 0 else None

    @torch.no_grad()
    def broadcast_weights(self, dtype: str | None = None) -> int:
        """Stream the Hugging Face weights to the engines; every rank must call it."""
        cast = DTYPES.get(dtype or "")
        with self._device():
            stream = (
                (n, t.to(cast) if cast is not None and t.is_floating_point() else t) for n, t in self._hf_stream()
            )
            if self.rank == 0:
                return len(send_weights(self.weight_group, stream))
            for _ in stream:
                pass
        return 0

    def export_hf(self, directory: str, tokenizer_path: str) -> None:
        """A Hugging Face model directory of the current weights."""
        full = self.full_state_dict()
        if self.rank == 0:
            os.makedirs(directory, exist_ok=True)
            lm = AutoModelForCausalLM.from_pretrained(
                self.s.weights_path or self.s.model_path, config=self.hf_config, dtype=torch.float32
            )
            trunk, heads = mtp.split_heads(full)
            lm.load_state_dict(trunk, strict=not self.arch.tied)
            lm.save_pretrained(directory, state_dict={**lm.state_dict(), **heads} if heads else None)
            AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(directory)
        dist.barrier()

    # -- checkpoints ------------------------------------------------------------------------------------

    def _chunk_keys(self) -> list[str]:
        """The checkpoint's key of each model chunk: `model`, or `model0`, `model1`... with virtual stages (Megatron's
        own training names them so)."""
        return ["model"] if len(self.models) == 1 else [f"model{v}" for v in range(len(self.models))]

    def _unwrapped(self) -> list:
        return [m.module if hasattr(m, "zero_grad_buffer") else m for m in self.models]

    def _sharded_state(self, loading: bool) -> dict:
        state = {k: m.sharded_state_dict() for k, m in zip(self._chunk_keys(), self._unwrapped())}
        if self.optimizer is not None:
            kind = "fully_reshardable" if self.mc.dist_ckpt_optim_fully_reshardable else "dp_reshardable"
            state["optimizer"] = self.optimizer.sharded_state_dict(
                dict(state), is_loading=loading, metadata={"distrib_optim_sharding_type": kind}
            )
        return state

    def save_checkpoint(self, directory: str) -> None:
        """Model and optimizer through Megatron's distributed checkpointing, plus this rank's RNG and step."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import dist_checkpointing

        with self._device():
            os.makedirs(directory, exist_ok=True)
            dist.barrier()
            dist_checkpointing.save(self._sharded_state(loading=False), directory)
            extra = {"rng": torch.get_rng_state(), "optimizer_steps": self.optimizer_steps}
            if self.s.device == "cuda":
                extra["cuda_rng"] = torch.cuda.get_rng_state()
            torch.save(extra, Path(directory) / f"extra_rank{self.rank}.pt")
            dist.barrier()

    def load_checkpoint(self, directory: str) -> None:
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports this module for every job
        from megatron.core import dist_checkpointing

        # deferred: torch's distributed checkpoint module, only when a checkpoint is read
        from torch.distributed.checkpoint.api import CheckpointException

        with self._device(), torch.no_grad():
            self._prime_optimizer_state()
            check_metadata(directory)
            try:
                loaded = dist_checkpointing.load(self._sharded_state(loading=True), directory)
            except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
                if getattr(self.arch, "experts", None) is None or "chained_" not in str(exc):
                    raise
                raise RuntimeError(
                    f"{directory}: the checkpoint's optimizer state was written under another expert layout "
                    "(expert_model_parallel_size / expert_tensor_parallel_size); Megatron-Core 0.16 keeps expert "
                    "optimizer state apart under some layouts only, so resume on the layout it was written on"
                ) from None
            for key, module in zip(self._chunk_keys(), self._unwrapped()):
                module.load_state_dict(loaded[key])
            if self.optimizer is not None:
                self.optimizer.load_state_dict(loaded["optimizer"])
                self._unshare_steps()
        extra_path = Path(directory) / f"extra_rank{self.rank}.pt"
        if extra_path.exists():
            extra = read_extra(extra_path)
            torch.set_rng_state(extra["rng"])
            if "cuda_rng" in extra and self.s.device == "cuda":
                torch.cuda.set_rng_state(extra["cuda_rng"])
            self.optimizer_steps = extra["optimizer_steps"]

    def _prime_optimizer_state(self) -> None:
        """Megatron-Core 0.16 with torch's Adam (no Apex/TransformerEngine) cannot load a checkpoint as it is:

        - a fresh optimizer has no state, and Megatron's state dict wants the step count only a first step makes:
          the state entries are created, zero, for the checkpoint to fill;
        - the fully reshardable format stores no per-parameter `step`, yet Megatron copies every state entry
          torch's Adam has (`step` included) from it: only the entries the checkpoint holds are copied.
        """
        for opt in getattr(self.optimizer, "chained_optimizers", None) or ([self.optimizer] if self.optimizer else []):
            torch_opt = getattr(opt, "optimizer", None)
            if torch_opt is None or not type(torch_opt).__module__.startswith("torch.optim"):
                continue
            for group in torch_opt.param_groups:
                for p in group["params"]:
                    state = torch_opt.state[p]
                    if not state:
                        state.update(
                            step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)
                        )
            if hasattr(opt, "_set_main_param_and_optimizer_states") and not getattr(opt, "_rlc_tolerant", False):
                opt._set_main_param_and_optimizer_states = partial(
                    _set_held_states, opt, opt._set_main_param_and_optimizer_states
                )
                opt._rlc_tolerant = True

    def _unshare_steps(self) -> None:
        """Megatron restores torch Adam's step count as one tensor shared by every parameter's state, and Adam
        increments each parameter's count in place: each gets its own copy, or the count grows by the number of
        parameters every step (and with it Adam's bias correction goes wrong)."""
        for opt in getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]:
            torch_opt = getattr(opt, "optimizer", None)
            for state in torch_opt.state.values() if torch_opt is not None else ():
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].clone()

    # -- colocation ---------------------------------------------------------------------------------------

    def offload(self, model: bool = True, optimizer: bool = True) -> None:
        """Free this rank's GPU memory (colocated GPUs): parameter buffers to pinned CPU copies, gradient
        buffers dropped, optimizer state to the CPU. A no-op on a CPU run."""
        if self.s.device != "cuda":
            return
        if model:
            for buffer in self._buffers():
                buffer.cpu_param = buffer.param_data.detach().to("cpu", non_blocking=True).pin_memory()
                torch.cuda.synchronize()
                buffer.param_data.untyped_storage().resize_(0)
                buffer.grad_data.untyped_storage().resize_(0)
            if not self._buffers():  # the ref: plain modules
                for chunk in self.models:
                    chunk.to("cpu")
        if optimizer and self.optimizer is not None:
            self._move_optimizer("cpu")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def backload(self, model: bool = True, optimizer: bool = True) -> None:
        if self.s.device != "cuda":
            return
        if model:
            for buffer in self._buffers():
                if getattr(buffer, "cpu_param", None) is None:
                    continue
                buffer.param_data.untyped_storage().resize_(
                    buffer.param_data.numel() * buffer.param_data.element_size()
                )
                buffer.param_data.copy_(buffer.cpu_param, non_blocking=True)
                buffer.grad_data.untyped_storage().resize_(buffer.grad_data.numel() * buffer.grad_data.element_size())
                buffer.grad_data.zero_()
                buffer.cpu_param = None
            if not self._buffers():
                for chunk in self.models:
                    chunk.to("cuda")
        if optimizer and self.optimizer is not None:
            self._move_optimizer("cuda")
        torch.cuda.synchronize()

    def _buffers(self) -> list:
        return [
            b
            for m in self.models
            for b in list(getattr(m, "buffers", []) or []) + list(getattr(m, "expert_parallel_buffers", []) or [])
        ]

    def _move_optimizer(self, device: str) -> None:
        inner = getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]
        for opt in inner:
            torch_opt = getattr(opt, "optimizer", None)
            if torch_opt is None:
                continue
            for group in torch_opt.param_groups:
                for p in group["params"]:
                    p.data = p.data.to(device, non_blocking=True)  # fp32 master copies (distributed optimizer)
            for state in torch_opt.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v) and k != "step":
                        state[k] = v.to(device, non_blocking=True)

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _set_held_states(opt, original, model_param, tensors: dict) -> None:
    """A distributed optimizer's `_set_main_param_and_optimizer_states` for torch's Adam: the main parameter and
    the state entries `tensors` holds, but never `step`. A fully reshardable checkpoint has none per parameter; a
    dp_reshardable one hands back the loading worker's own count (its step is not a sharded tensor, so the load
    template's value stays), which would undo the checkpoint's count that `load_state_dict` set from its param
    groups just before."""
    if opt.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        return original(model_param, tensors)
    group, order = opt.model_param_group_index_map[model_param]
    main = opt.optimizer.param_groups[group]["params"][order]
    with torch.no_grad():
        main.copy_(tensors["param"])
        for key, value in opt.optimizer.state[main].items():
            if key in tensors and key != "step":
                value.copy_(tensors[key])


def _check_fused_head(settings: WorkerSettings, algorithm: Any) -> None:
    """What trainer.fused_lm_head_logprob cannot run with, as SkyRL refuses it: a loss needing the logits' gradient
    beyond the log-probs' (the entropy), and MTP draft heads (whose teacher is the head's whole logits)."""
    if settings.fused_lm_head is None:
        return
    if getattr(algorithm, "use_entropy_loss", False):
        raise ValueError(
            "trainer.fused_lm_head_logprob with trainer.algorithm.use_entropy_loss: the fused head's entropy is a "
            "metric without a gradient (RLC-E570)"
        )
    if settings.mtp_loss_weight is not None:
        raise ValueError(
            "trainer.fused_lm_head_logprob with trainer.mtp.enabled: the draft loss distills from the head's whole "
            "logits, which the fused head never makes (RLC-E571)"
        )
    if settings.fused_lm_head == "triton":
        warnings.warn(
            "trainer.fused_lm_head_logprob_backend=triton: rlc has no Triton kernel for the fused head and runs its "
            "torch one (the same values)",
            stacklevel=2,
        )


def _experts(hf_config, names: tuple = ("num_experts", "num_local_experts", "n_routed_experts")) -> int:
    """The routed experts a Hugging Face config names (Qwen-MoE, Mixtral, DeepSeek; a multimodal checkpoint's in its
    text config, as Qwen3.5-MoE's); 0 for a dense model."""
    text = getattr(hf_config, "text_config", None)
    found = (getattr(c, n, None) for c in (hf_config, text) if c is not None for n in names)
    return next((int(v) for v in found if v), 0)


def _empty_micro_batch(batch: TrainBatch, size: int) -> TrainBatch:
    """`size` rows of zeros shaped as `batch`'s: no tokens, no loss."""
    mb = batch.select(slice(0, 0)).map(partial(_pad_rows, rows=size))
    mb.padding_rows = size
    return mb


def _pad_rows(v: torch.Tensor, rows: int) -> torch.Tensor:
    """`v` with `rows` rows of zeros after its own (no tokens, no loss)."""
    return torch.cat([v, torch.zeros((rows, *v.shape[1:]), dtype=v.dtype)])
