"""Trainer-side sections of spec v1: models, optimizers, FSDP, Megatron, placement (SkyRL's names and defaults)."""

import copy
from dataclasses import dataclass
from typing import Any

from rlc.spec.algorithm import AlgorithmConfig
from rlc.spec.fields import section, setting

STRATEGIES = ("fsdp2", "fsdp", "megatron")
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


@dataclass
class ModelConfig:
    path: str | None = setting(None, "Hugging Face model id or local path (rlc:tiny builds a tiny local model).")
    lora: SkyRLLoraConfig = section(SkyRLLoraConfig, "LoRA adapter settings.")


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


@dataclass
class MegatronTorchProfilerConfig:
    enable: bool = setting(False, "Run the torch profiler on the listed ranks.")
    ranks: list[int] = setting(doc="Ranks to profile.", factory=list)
    save_path: str | None = setting(None, "Directory profiler traces are written to.")


@dataclass
class MegatronLoraConfig:
    lora_type: str = setting("lora", "Megatron LoRA flavour.", enum=("lora", "canonical_lora", "dora"))


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
    moe_grouped_gemm: bool = setting(True, "Use grouped GEMM for experts.")
    moe_router_score_function: str | None = setting(
        None, "MoE router score function; null keeps the model's.", enum=("softmax", "sigmoid")
    )
    moe_router_enable_expert_bias: bool | None = setting(None, "Aux-loss-free expert bias; null keeps the model's.")
    ddp_config: MegatronDDPConfig = section(MegatronDDPConfig, "Megatron DDP settings.")
    torch_profiler_config: MegatronTorchProfilerConfig = section(MegatronTorchProfilerConfig, "Torch profiler.")
    lora_config: MegatronLoraConfig = section(MegatronLoraConfig, "Megatron LoRA settings.")
    optimizer_config_kwargs: dict[str, Any] = setting(
        doc="Extra Megatron OptimizerConfig arguments; unset keys take rlc's defaults.",
        factory=lambda: copy.deepcopy(DEFAULT_MEGATRON_OPTIMIZER_KWARGS),
        passthrough=True,
    )
    transformer_config_kwargs: dict[str, Any] = setting(
        doc="Extra Megatron TransformerConfig arguments; unset keys take rlc's defaults.",
        factory=lambda: copy.deepcopy(DEFAULT_TRANSFORMER_CONFIG_KWARGS),
        passthrough=True,
    )
    empty_cuda_cache: bool | None = setting(None, "Empty the CUDA cache between phases; null decides automatically.")
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the model provider.", factory=dict, passthrough=True
    )
    dist_ckpt_optim_fully_reshardable: bool = setting(
        False, "Save optimizer state so it can be resharded to any parallel layout."
    )


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
    sequence_parallel_size: int = setting(1, "Ulysses sequence-parallel size.", minimum=1)
    use_torch_compile: bool = setting(False, "Apply torch.compile to the logits computation.")
    record_memory: bool = setting(False, "Save CUDA memory snapshots to {ckpt_path}/memory_snapshots/.")
    megatron_config: MegatronConfig = section(MegatronConfig, "Policy Megatron settings.")
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the Hugging Face model config (FSDP).", factory=dict, passthrough=True
    )


def _critic_optimizer() -> OptimizerConfig:
    return OptimizerConfig(lr=5e-6)


@dataclass
class CriticConfig:
    model: ModelConfig = section(ModelConfig, "Critic model; a path turns the critic on.")
    optimizer_config: OptimizerConfig = section(OptimizerConfig, "Critic optimizer.", factory=_critic_optimizer)
    fsdp_config: FSDPConfig = section(FSDPConfig, "Critic FSDP settings.")
    sequence_parallel_size: int = setting(1, "Ulysses sequence-parallel size.", minimum=1)
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the Hugging Face model config.", factory=dict, passthrough=True
    )


@dataclass
class RefConfig:
    model: ModelConfig = section(ModelConfig, "Reference model; path defaults to the policy's.")
    sequence_parallel_size: int = setting(1, "Ulysses sequence-parallel size.", minimum=1)
    fsdp_config: FSDPConfig = section(FSDPConfig, "Reference FSDP settings.")
    megatron_config: MegatronConfig = section(MegatronConfig, "Reference Megatron settings.")
    model_config_kwargs: dict = setting(
        doc="Pass-through kwargs for the Hugging Face model config.", factory=dict, passthrough=True
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


@dataclass
class TrainerConfig:
    placement: PlacementConfig = section(PlacementConfig, "Where policy, ref and critic run.")
    sequence_parallel_backend: str = setting("ulysses", "Sequence-parallel implementation.", enum=("ulysses",))
    strategy: str = setting("fsdp2", "Training backend (fsdp is an alias of fsdp2).", enum=STRATEGIES)
    policy: PolicyConfig = section(PolicyConfig, "Policy model training.")
    ref: RefConfig = section(RefConfig, "Reference model (used when a KL term needs it).")
    critic: CriticConfig = section(CriticConfig, "Critic model (used when critic.model.path is set).")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "RL algorithm.")
    fully_async: FullyAsyncConfig = section(FullyAsyncConfig, "Fully asynchronous training knobs.")
    gradient_checkpointing: bool = setting(True, "Recompute activations in backward to save memory.")
    gradient_checkpointing_use_reentrant: bool = setting(False, "Use reentrant activation checkpointing.")
    seed: int = setting(42, "Random seed.")
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
    update_epochs_per_batch: int = setting(1, "Gradient passes over each training batch.", minimum=1)
    train_batch_size: int = setting(1024, "Prompts per training step.")
    policy_mini_batch_size: int = setting(256, "Prompts per policy optimizer step.")
    critic_mini_batch_size: int = setting(256, "Prompts per critic optimizer step.")
    micro_train_batch_size_per_gpu: int = setting(1, "Sequences per GPU per forward/backward in training.")
    micro_forward_batch_size_per_gpu: int = setting(1, "Sequences per GPU per forward-only pass.")
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
    rope_scaling: dict[str, Any] | None = setting(
        None, "RoPE scaling for the trained model (e.g. YaRN).", passthrough=True
    )
    rope_theta: float | None = setting(None, "RoPE base frequency override.")
