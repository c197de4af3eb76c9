"""Trainer-side sections of spec v1: models, optimizers, FSDP, Megatron, placement (SkyRL's names and defaults)."""

import copy
from typing import Any

from rlc.core.dataclass import dataclass
from rlc.spec.algorithm import AlgorithmConfig
from rlc.spec.fields import section, setting

STRATEGY_NAMES = ("fsdp2", "fsdp", "megatron")  # the spec's spelling; the runtime's STRATEGIES start each
DTYPES_SHORT = ("bf16", "fp16", "fp32")

DEFAULT_MEGATRON_OPTIMIZER_KWARGS: dict[str, Any] = {
    "overlap_cpu_optimizer_d2h_h2d": False,
    "use_precision_aware_optimizer": False,
    "optimizer_cpu_offload": False,
    "optimizer_offload_fraction": 0.0,
}
DEFAULT_TRANSFORMER_CONFIG_KWARGS: dict[str, Any] = {
    "recompute_granularity": "full",
    "recompute_modules": ["core_attn"],
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
    "gradient_accumulation_fusion": False,
}


@dataclass
class SkyRLLoraConfig:
    rank: int = setting(0, "LoRA rank; 0 trains the full model.", minimum=0)
    alpha: int = setting(16, "LoRA scaling numerator (alpha / rank scales the adapter).")
    dropout: float = setting(0.0, "Dropout on the LoRA adapter input.", minimum=0, maximum=1)
    lora_sync_path: str = setting(
        "/tmp/skyrl_lora_sync",
        "Directory adapters are written to for the inference engines (shared FS when not colocated).",
    )
    target_modules: str = setting("all-linear", "Modules that get adapters (PEFT target_modules).")
    exclude_modules: str | None = setting(None, "Modules excluded from adapters.")
    init_method: str = setting(
        "kaiming",
        "Adapter init: PEFT init_lora_weights for FSDP; lora_A init (xavier, normal, kaiming, zero) for Megatron.",
    )
    sync_mode: str = setting(
        "disk", "SkyRL 0.4: how adapter-only sync reaches the engines (disk or memory).", enum=("disk", "memory")
    )
    share_expert_adapters: bool = setting(True, "SkyRL 0.4: MoE experts share one adapter.")
    max_loras: int = setting(1, "SkyRL 0.4: adapters active at once in the engines (vLLM max_loras).", minimum=1)
    max_cpu_loras: int | None = setting(
        None, "SkyRL 0.4: adapters kept in the engines' CPU cache (vLLM max_cpu_loras).", minimum=1
    )


@dataclass
class FakeInt4QATConfig:
    enabled: bool = setting(False, "SkyRL 0.4: fake-INT4 quantization-aware training of MoE experts (Megatron).")
    group_size: int = setting(32, "SkyRL 0.4: weights per quantization group.", minimum=1)
    symmetric: bool = setting(True, "SkyRL 0.4: symmetric quantization.")
    scale_divisor: float = setting(7.5, "SkyRL 0.4: divisor of the group's max magnitude giving the scale.")
    q_min: float = setting(-8.0, "SkyRL 0.4: smallest quantized value.")
    bf16_base_path: str | None = setting(None, "SkyRL 0.4: bf16 checkpoint the quantized weights start from.")


@dataclass
class ModelConfig:
    path: str | None = setting(None, "Hugging Face model id or local path (rlc:tiny builds a tiny local model).")
    lora: SkyRLLoraConfig = section(SkyRLLoraConfig, "LoRA adapter settings.")
    fake_int4_qat: FakeInt4QATConfig = section(FakeInt4QATConfig, "SkyRL 0.4: fake-INT4 quantization-aware training.")


@dataclass
class OptimizerConfig:
    lr: float = setting(1e-6, "Peak learning rate of AdamW.", exclusive_minimum=0)
    adam_betas: list[float] = setting(doc="AdamW betas (beta1, beta2).", factory=lambda: [0.9, 0.999])
    weight_decay: float = setting(1e-2, "AdamW weight decay.", minimum=0)
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", minimum=0)
    offload_after_step: bool = setting(
        True, "Offload optimizer state to CPU after each training step (only with colocate_all)."
    )
    num_warmup_steps: int = setting(0, "Mini-batch steps of learning-rate warmup.", minimum=0)
    scheduler: str = setting(
        "constant_with_warmup",
        "Learning-rate schedule.",
        enum=("constant_with_warmup", "constant", "linear", "cosine"),
    )


@dataclass
class MixedPrecisionConfig:
    param_dtype: str = setting("bf16", "Dtype parameters are cast to for compute.", enum=DTYPES_SHORT)
    reduce_dtype: str = setting("fp32", "Dtype of gradient reduction.", enum=DTYPES_SHORT)
    buffer_dtype: str = setting("fp32", "Dtype of module buffers.", enum=DTYPES_SHORT)


@dataclass
class FSDPConfig:
    cpu_offload: bool = setting(False, "Offload parameters and optimizer state to CPU during the forward pass.")
    reshard_after_forward: bool | int = setting(
        True, "FSDP2: reshard after forward (true, false, or an int between 1 and fsdp_size)."
    )
    fsdp_size: int = setting(-1, "Shard group size for hybrid sharding; -1 shards over the whole world.")
    mixed_precision: MixedPrecisionConfig | None = setting(None, "Mixed-precision policy; null uses bf16 params.")
    wrap_policy: dict = setting(
        doc="Custom wrapping, e.g. {transformer_layer_cls_to_wrap: [...]}; passed through.",
        factory=dict,
        passthrough=True,
    )


@dataclass
class MegatronDDPConfig:
    grad_reduce_in_fp32: bool = setting(True, "Reduce gradients in fp32.")
    overlap_grad_reduce: bool = setting(False, "Overlap gradient reduce-scatter with backward.")
    overlap_param_gather: bool = setting(False, "Overlap parameter all-gather with forward.")
    average_in_collective: bool = setting(True, "Average gradients inside the collective.")
    fp8_param_gather: bool = setting(False, "SkyRL 0.4: all-gather parameters in FP8.")


@dataclass
class MegatronHFExportConfig:
    distributed_save: bool = setting(False, "SkyRL 0.4: every rank writes its part of the Hugging Face export.")
    save_every_n_ranks: int = setting(1, "SkyRL 0.4: ranks per writer in a distributed export.", minimum=1)


@dataclass
class MegatronTorchProfilerConfig:
    enable: bool = setting(False, "Run the torch profiler on the listed ranks.")
    ranks: list[int] = setting(doc="Ranks to profile.", factory=list)
    save_path: str | None = setting(None, "Directory profiler traces are written to.")


@dataclass
class MegatronLoraConfig:
    lora_type: str = setting("lora", "Megatron LoRA flavour.", enum=("lora", "canonical_lora", "dora"))
    merge_lora: bool = setting(True, "SkyRL 0.4: merge adapters into the weights sent to the engines.")
    experts_shared_outer_loras: bool = setting(False, "SkyRL 0.4: experts share the outer LoRA matrices.")
    normalize_moe_lora: bool = setting(False, "SkyRL 0.4: normalize MoE adapter updates by the experts routed.")


@dataclass
class TorchProfilerConfig:
    enable: bool = setting(False, "SkyRL 0.4: profile the policy workers with torch.profiler.")
    ranks: list[int] = setting(doc="SkyRL 0.4: ranks profiled.", factory=lambda: [0])
    save_path: str | None = setting(None, "SkyRL 0.4: directory traces are written to.")
    skip_first: int = setting(10, "SkyRL 0.4: profiler steps skipped before the schedule starts.", minimum=0)
    wait: int = setting(0, "SkyRL 0.4: idle steps of each profiler cycle.", minimum=0)
    warmup: int = setting(1, "SkyRL 0.4: warm-up steps of each profiler cycle.", minimum=0)
    active: int = setting(1, "SkyRL 0.4: recorded steps of each profiler cycle.", minimum=1)
    repeat: int = setting(1, "SkyRL 0.4: profiler cycles; 0 repeats until the end.", minimum=0)
    activities: list[str] = setting(doc="SkyRL 0.4: activities recorded (cpu, cuda).", factory=lambda: ["cpu", "cuda"])
    record_shapes: bool = setting(True, "SkyRL 0.4: record operator input shapes.")
    profile_memory: bool = setting(False, "SkyRL 0.4: record tensor allocations.")
    with_stack: bool = setting(True, "SkyRL 0.4: record Python stacks.")
    with_flops: bool = setting(False, "SkyRL 0.4: estimate FLOPs of matmuls and convolutions.")
    with_modules: bool = setting(False, "SkyRL 0.4: record the module hierarchy.")
    use_gzip: bool = setting(False, "SkyRL 0.4: gzip chrome traces.")
    export_type: str = setting("chrome_trace", "SkyRL 0.4: trace format.", enum=("chrome_trace", "stacks"))


@dataclass
class MegatronConfig:
    tensor_model_parallel_size: int = setting(1, "Tensor-parallel size.", minimum=1)
    pipeline_model_parallel_size: int = setting(1, "Pipeline-parallel size.", minimum=1)
    context_parallel_size: int = setting(1, "Context-parallel size.", minimum=1)
    expert_model_parallel_size: int = setting(1, "Expert-parallel size (MoE).", minimum=1)
    expert_tensor_parallel_size: int | None = setting(None, "Tensor-parallel size inside experts; null follows tp.")
    moe_token_dispatcher_type: str = setting(
        "alltoall", "MoE token dispatcher.", enum=("alltoall", "allgather", "flex")
    )
    moe_router_load_balancing_type: str = setting(
        "none", "MoE router load balancing.", enum=("none", "aux_loss", "seq_aux_loss", "sinkhorn")
    )
    moe_aux_loss_coeff: float = setting(0.0, "SkyRL 0.4: coefficient of the MoE auxiliary load-balancing loss.")
    moe_grouped_gemm: bool = setting(True, "Use grouped GEMM for experts.")
    moe_router_score_function: str | None = setting(
        None, "MoE router score function; null keeps the model's.", enum=("softmax", "sigmoid")
    )
    moe_router_enable_expert_bias: bool | None = setting(None, "Aux-loss-free expert bias; null keeps the model's.")
    moe_enable_routing_replay: bool = setting(
        False, "Routing replay (R3): the router replays the engines' routes (with enable_return_routed_experts)."
    )
    moe_per_layer_logging: bool = setting(False, "SkyRL 0.4: log MoE router statistics per layer.")
    moe_router_dtype: str = setting("fp32", "SkyRL 0.4: dtype of the MoE router.", enum=("fp32", "fp64"))
    ddp_config: MegatronDDPConfig = section(MegatronDDPConfig, "Megatron DDP settings.")
    torch_profiler_config: MegatronTorchProfilerConfig = section(MegatronTorchProfilerConfig, "Torch profiler.")
    hf_export_config: MegatronHFExportConfig = section(MegatronHFExportConfig, "SkyRL 0.4: Hugging Face export.")
    lora_config: MegatronLoraConfig = section(MegatronLoraConfig, "Megatron LoRA settings.")
    optimizer_config_kwargs: dict[str, Any] = setting(
        doc="Extra Megatron OptimizerConfig arguments; unset keys take rlc's defaults.",
        factory=lambda: copy.deepcopy(DEFAULT_MEGATRON_OPTIMIZER_KWARGS),
        passthrough=True,
    )
    transformer_config_kwargs: dict[str, Any] = setting(
        doc="Extra Megatron TransformerConfig arguments; unset keys take rlc's defaults. The pipeline layout is set "
        "here too, as in SkyRL: num_layers_in_first/last_pipeline_stage (uneven stages) and "
        "virtual_pipeline_model_parallel_size (interleaved virtual stages).",
        factory=lambda: copy.deepcopy(DEFAULT_TRANSFORMER_CONFIG_KWARGS),
        passthrough=True,
    )
    fp8: str | None = setting(
        None, "SkyRL 0.4: TransformerEngine FP8 compute format (e4m3, hybrid); null trains without."
    )
    fp8_recipe: str | None = setting(None, "SkyRL 0.4: TransformerEngine FP8 scaling recipe.")
    fp8_param: bool | None = setting(None, "SkyRL 0.4: keep parameters in FP8.")
    fp8_amax_compute_algo: str | None = setting(None, "SkyRL 0.4: FP8 amax algorithm (max, most_recent).")
    empty_cuda_cache: bool | None = setting(None, "Empty the CUDA cache between phases; null decides automatically.")
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the model provider.", factory=dict, passthrough=True
    )
    dist_ckpt_optim_fully_reshardable: bool = setting(
        False, "Save optimizer state so it can be resharded to any parallel layout."
    )
    freeze_moe_router: bool = setting(False, "SkyRL 0.4: do not train the MoE router.")
    freeze_dsa_indexer: bool = setting(False, "SkyRL 0.4: do not train the DeepSeek sparse-attention indexer.")
    mtp_num_layers: int | None = setting(
        None, "SkyRL 0.4: MTP heads built with trainer.mtp.enabled; null keeps the checkpoint's, 0 none."
    )
    mtp_loss_weight: float = setting(
        0.1, "SkyRL 0.4: weight of the MTP draft loss; trainer.mtp.loss_weight replaces it, as in SkyRL."
    )
    mtp_loss_chunk_size: int | None = setting(
        1024, "SkyRL 0.4: tokens per chunk of the full-vocabulary MTP draft loss (memory only; null: one chunk)."
    )
    mtp_loss_topk: int | None = setting(
        None, "SkyRL 0.4: distil only the policy's top-k tokens in the MTP draft loss; null: the whole vocabulary."
    )
    async_dist_ckpt_save: bool = setting(False, "SkyRL 0.4: save distributed checkpoints asynchronously.")
    async_save_prestage_to_cpu: bool = setting(False, "SkyRL 0.4: stage asynchronous saves in CPU memory first.")


@dataclass
class PlacementConfig:
    colocate_all: bool = setting(True, "Training and inference share the same GPUs.")
    colocate_policy_ref: bool = setting(True, "Policy and reference model share GPUs (when not colocate_all).")
    policy_num_nodes: int = setting(1, "Nodes for the policy model; derived from cluster when unset.", minimum=1)
    policy_num_gpus_per_node: int = setting(
        1, "GPUs per node for the policy; derived from cluster when unset.", minimum=1
    )
    critic_num_nodes: int = setting(1, "Nodes for the critic; derived from cluster when unset.", minimum=1)
    critic_num_gpus_per_node: int = setting(
        1, "GPUs per node for the critic; derived from cluster when unset.", minimum=1
    )
    ref_num_nodes: int = setting(1, "Nodes for the reference model; derived from cluster when unset.", minimum=1)
    ref_num_gpus_per_node: int = setting(
        1, "GPUs per node for the reference model; derived from cluster when unset.", minimum=1
    )
    allocation: str | None = setting(
        None,
        "AReaL-style shorthand for the counts above, e.g. vllm:d4t2+fsdp:d8 (`rlc explain` gives the grammar).",
        rlc_only=True,
    )


def _default_policy_model() -> ModelConfig:
    return ModelConfig(path="Qwen/Qwen2.5-1.5B-Instruct")


@dataclass
class PolicyConfig:
    model: ModelConfig = section(ModelConfig, "Policy model.", factory=_default_policy_model)
    optimizer_config: OptimizerConfig = section(OptimizerConfig, "Policy optimizer.")
    fsdp_config: FSDPConfig = section(FSDPConfig, "Policy FSDP settings.")
    sequence_parallel_size: int = setting(
        1,
        "Ulysses sequence parallelism (fsdp2): each row split over this many GPUs; data parallel = GPUs / this.",
        minimum=1,
    )
    use_torch_compile: bool = setting(False, "Apply torch.compile to the logits computation.")
    record_memory: bool = setting(False, "Save CUDA memory snapshots to {ckpt_path}/memory_snapshots/.")
    megatron_config: MegatronConfig = section(MegatronConfig, "Policy Megatron settings.")
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the Hugging Face model config (FSDP).", factory=dict, passthrough=True
    )
    torch_profiler_config: TorchProfilerConfig = section(TorchProfilerConfig, "SkyRL 0.4: torch profiler.")
    language_model_only: bool = setting(
        False, "SkyRL 0.4: load only the text model of a multimodal checkpoint (Qwen3.5) and train it as text."
    )
    inference_only_init: bool = setting(False, "SkyRL 0.4: start the policy for inference only (no optimizer).")


def _critic_optimizer() -> OptimizerConfig:
    return OptimizerConfig(lr=5e-6)


@dataclass
class CriticConfig:
    model: ModelConfig = section(ModelConfig, "Critic model; a path turns the critic on.")
    optimizer_config: OptimizerConfig = section(OptimizerConfig, "Critic optimizer.", factory=_critic_optimizer)
    strategy: str | None = setting(
        None, "The critic's training backend; unset: trainer.strategy's.", enum=STRATEGY_NAMES, rlc_only=True
    )
    fsdp_config: FSDPConfig = section(FSDPConfig, "Critic FSDP settings.")
    megatron_config: MegatronConfig = section(
        MegatronConfig, "Critic Megatron settings (SkyRL 0.4's critic trains with FSDP only).", rlc_only=True
    )
    sequence_parallel_size: int = setting(
        1,
        "Ulysses sequence parallelism (fsdp2): each row split over this many GPUs; data parallel = GPUs / this.",
        minimum=1,
    )
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the Hugging Face model config.", factory=dict, passthrough=True
    )


@dataclass
class RefConfig:
    model: ModelConfig = section(ModelConfig, "Reference model; path defaults to the policy's.")
    sequence_parallel_size: int = setting(
        1,
        "Ulysses sequence parallelism (fsdp2): each row split over this many GPUs; data parallel = GPUs / this.",
        minimum=1,
    )
    fsdp_config: FSDPConfig = section(FSDPConfig, "Reference FSDP settings.")
    megatron_config: MegatronConfig = section(MegatronConfig, "Reference Megatron settings.")
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the Hugging Face model config.", factory=dict, passthrough=True
    )
    language_model_only: bool = setting(
        False, "SkyRL 0.4: load only the text model of a multimodal checkpoint (Qwen3.5) and train it as text."
    )


@dataclass
class FullyAsyncConfig:
    enabled: bool = setting(
        False, "Generate batches for later steps while the trainer trains (SkyRL's fully async trainer)."
    )
    max_staleness_steps: int = setting(
        4, "Most steps a trajectory may lag: scheduled at step i, trained at j, j - i <= this.", minimum=0
    )
    num_parallel_generation_workers: int = setting(
        768, "Generation workers; between policy_mini_batch_size and that times (max_staleness_steps + 1).", minimum=1
    )
    sample_full_batch: bool = setting(False, "SkyRL 0.4: wait for a full batch of fresh groups before each step.")
    clear_kv_cache_on_weight_sync: bool = setting(False, "SkyRL 0.4: drop the engines' KV cache at each weight sync.")
    simulate_training: bool = setting(False, "SkyRL 0.4: sleep instead of training (benchmarks generation).")
    simulate_training_step_seconds: float = setting(30.0, "SkyRL 0.4: simulated step time.", minimum=0)
    simulate_weight_sync_seconds: float = setting(0.0, "SkyRL 0.4: simulated weight-sync time.", minimum=0)


@dataclass
class MTPConfig:
    enabled: bool = setting(
        False,
        "SkyRL 0.4: train the policy checkpoint's multi-token-prediction heads (megatron; MiMo-style) with SkyRL's "
        "draft loss, and draft with them in vLLM (speculative_config method mtp, unless one is given).",
    )
    num_speculative_tokens: int = setting(
        1, "SkyRL 0.4: tokens vLLM drafts per step with the MTP heads (a head is reused past its count).", minimum=1
    )
    loss_weight: float = setting(0.1, "SkyRL 0.4: weight w of the draft loss in policy_loss + w * draft_loss.")


@dataclass
class TrainerConfig:
    placement: PlacementConfig = section(PlacementConfig, "Where policy, ref and critic run.")
    use_expandable_segments: bool = setting(
        True, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True on the training workers (less fragmentation)."
    )
    sequence_parallel_backend: str = setting("ulysses", "Sequence-parallel implementation.", enum=("ulysses",))
    strategy: str = setting("fsdp2", "Training backend (fsdp is an alias of fsdp2).", enum=STRATEGY_NAMES)
    policy: PolicyConfig = section(PolicyConfig, "Policy model training.")
    ref: RefConfig = section(RefConfig, "Reference model (used when a KL term needs it).")
    critic: CriticConfig = section(CriticConfig, "Critic model (used when critic.model.path is set).")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "RL algorithm.")
    fully_async: FullyAsyncConfig = section(FullyAsyncConfig, "Fully asynchronous training knobs.")
    mtp: MTPConfig = section(MTPConfig, "SkyRL 0.4: multi-token prediction.")
    gradient_checkpointing: bool = setting(True, "Recompute activations in backward to save memory.")
    gradient_checkpointing_use_reentrant: bool = setting(False, "Use reentrant activation checkpointing.")
    seed: int = setting(42, "Random seed.")
    deterministic: bool = setting(
        False,
        "Deterministic kernels in the training ranks (torch.use_deterministic_algorithms; CUBLAS_WORKSPACE_CONFIG on "
        "CUDA), so a run repeats its losses exactly; the engines' sampling is seeded by trainer.seed either way. "
        "Slower. SkyRL had it before 0.4.",
        rlc_only=True,
    )
    resume_mode: str | None = setting(
        "latest", "Resume from: none, latest checkpoint, or resume_path.", enum=("none", "latest", "from_path")
    )
    resume_path: str | None = setting(None, "Checkpoint directory for resume_mode=from_path.")
    log_path: str = setting("/tmp/skyrl-logs", "Infrastructure log directory (shared FS on multi-node).")
    ckpt_path: str = setting("~/ckpts/", "Directory of resumable checkpoints.")
    max_ckpts_to_keep: int = setting(-1, "Checkpoints kept: -1 keeps all, N keeps the last N.")
    ckpt_interval: int = setting(10, "Save a checkpoint every N steps.")
    hf_save_interval: int = setting(-1, "Export a Hugging Face model every N steps; -1 disables.")
    export_path: str = setting("~/exports/", "Directory of exported artifacts (HF models, dumps).")
    bf16: bool = setting(True, "Train in bfloat16.")
    epochs: int = setting(1, "Passes over the training data.", minimum=1)
    max_training_steps: int | None = setting(
        None, "Stop after this many training steps (fewer than epochs would give); null trains every epoch.", minimum=1
    )
    update_epochs_per_batch: int = setting(1, "Gradient passes over each training batch.", minimum=1)
    train_batch_size: int = setting(1024, "Prompts per training step.")
    use_hybrid_env_sampling: bool = setting(
        False,
        "SkyRL's history: every batch holds min_samples_per_env rows of each environment (a row's data_source, "
        "else its env_class), the rest drawn by the environments' shares.",
        rlc_only=True,
    )
    min_samples_per_env: int = setting(
        1, "Rows of each environment in every batch (use_hybrid_env_sampling).", minimum=1, rlc_only=True
    )
    policy_mini_batch_size: int = setting(256, "Prompts per policy optimizer step.")
    critic_mini_batch_size: int = setting(256, "Prompts per critic optimizer step.")
    micro_train_batch_size_per_gpu: int = setting(1, "Sequences per GPU per forward/backward in training.")
    micro_forward_batch_size_per_gpu: int = setting(1, "Sequences per GPU per forward-only pass.")
    max_tokens_per_microbatch: int = setting(
        -1,
        "SkyRL 0.4: tokens per micro batch (padding counted where rows stay padded; a longer row runs alone), for "
        "training and forward passes alike; -1 counts sequences (micro_*_batch_size_per_gpu).",
    )
    recompute_old_logprobs_per_minibatch: bool = setting(
        True, "SkyRL 0.4: recompute old log-probs before each mini batch (rlc runs only the default)."
    )
    remove_microbatch_padding: bool = setting(
        True, "SkyRL 0.4's name of use_sample_packing: false turns packing off (either one false does)."
    )
    update_ref_every_epoch: bool = setting(False, "Copy the policy into the reference model every epoch.")
    use_sample_packing: bool = setting(True, "Pack sequences without padding in micro batches.")
    eval_batch_size: int = setting(1024, "Prompts per evaluation batch.", minimum=1)
    eval_before_train: bool = setting(True, "Evaluate once before the first step.")
    eval_interval: int = setting(5, "Evaluate every N steps; -1 disables.")
    max_prompt_length: int = setting(512, "Longest prompt in tokens.", minimum=1)
    flash_attn: bool = setting(True, "Use flash attention.")
    disable_fast_tokenizer: bool = setting(False, "Use the slow tokenizer.")
    project_name: str = setting("skyrl", "Tracker project name.")
    run_name: str = setting("test_run", "Tracker run name.")
    logger: str = setting("wandb", "Metrics tracker.", enum=("wandb", "tensorboard", "mlflow", "console"))
    dump_data_batch: bool = setting(False, "Write each training batch to export_path.")
    dump_eval_results: bool = setting(True, "Write evaluation results to export_path.")
    enable_ray_gpu_monitor: bool = setting(
        True,
        "SkyRL 0.4: log GPU use through Ray's monitor (a metrics side channel: rlc has none, either value trains alike).",
    )
    tags: list[str] | None = setting(None, "SkyRL 0.4: tracker run tags.")
    print_example_interval: int = setting(1, "SkyRL 0.4: print an example trajectory every N steps.")
    num_logger_eval_samples: int = setting(-1, "SkyRL 0.4: evaluation samples sent to the tracker; -1 sends none.")
    num_logger_train_samples: int = setting(-1, "SkyRL 0.4: training samples sent to the tracker; -1 sends none.")
    log_example_interval: int = setting(-1, "SkyRL 0.4: send example trajectories every N steps; -1 disables.")
    logprobs_chunk_size: int | None = setting(1024, "SkyRL 0.4: tokens per chunk of the log-prob computation.")
    vocab_entropy_chunk_size: int | None = setting(0, "SkyRL 0.4: tokens per chunk of the entropy; 0 does not chunk.")
    vocab_entropy_chunk_memory_mb: int = setting(512, "SkyRL 0.4: memory budget of an entropy chunk.", minimum=1)
    fused_lm_head_logprob: bool = setting(
        False,
        "SkyRL 0.4, megatron: log-probs from the last hidden states and the LM head's weight, chunk by chunk, so the "
        "head's whole logits never exist.",
    )
    fused_lm_head_logprob_backend: str = setting(
        "torch",
        "SkyRL 0.4: backend of the fused LM-head log-probs (rlc runs its torch implementation for both).",
        enum=("torch", "triton"),
    )
    rope_scaling: dict[str, Any] | None = setting(
        None, "RoPE scaling for the trained model (e.g. YaRN).", passthrough=True
    )
    rope_theta: float | None = setting(None, "RoPE base frequency override.")
