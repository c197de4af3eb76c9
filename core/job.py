"""The compiled job: the one contract between compiler and runtime.

A `CompiledJob` is the resolved spec, the placement plan and the runtime decisions the compiler took from them
(how weights travel, the engine dtype, each role's worker settings, the engine arguments, the sampling of
training and evaluation). The compiler writes it as resolved.yaml plus plan.json (the decisions under the
plan's "runtime" key); the runtime loads it once and decides nothing of its own: no `auto`, no fallbacks, no
second derivation of a value the compiler already settled.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import field
from typing import Any

from rlc.core.dataclass import dataclass

DECISIONS_VERSION = 5


def seed_for(seed: int, step: int, engine: int) -> int:
    """A sampling seed of its own for every engine at every step (and for every engine's construction, step 0)."""
    return (seed * 1_000_003 + step * 7919 + engine) % (2**63)


class JobFormatError(ValueError):
    """The runtime section of plan.json is not one this version of rlc reads."""


@dataclass(frozen=True)
class Sampling:
    """What an engine samples with: `generator.sampling_params` (or the eval ones) as the engines take them."""

    max_generate_length: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    logprobs: bool = True
    additional_kwargs: dict = field(default_factory=dict)  # passed to vLLM as is (SamplingParams, or a server's body)


@dataclass(frozen=True)
class FakeInt4Qat:
    """trainer.policy.model.fake_int4_qat, enabled: the served INT4 grid's group size and convention."""

    group_size: int
    scale_divisor: float
    q_min: float


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a training worker of one role needs beyond its own sub-config (trainer.<role>, trainer.algorithm)."""

    role: str  # policy | ref | critic
    model_path: str  # a local directory, a hub id or an rlc: model id (the driver hands workers the local directory)
    strategy: str = "fsdp2"  # fsdp2 | megatron (the spelling `fsdp` is resolved to fsdp2)
    device: str = "cpu"  # cpu | cuda
    bf16: bool = False
    gradient_checkpointing: bool = False
    gradient_checkpointing_use_reentrant: bool = False
    micro_train_batch_size: int = 1
    micro_forward_batch_size: int = 1
    temperature: float = 1.0  # the logits' divisor in log-probs: the sampling temperature
    seed: int = 42
    deterministic: bool = False  # trainer.deterministic: torch.use_deterministic_algorithms in the rank
    max_seq_len: int = 0  # prompt plus response tokens of one row
    cpu_slots_per_node: int | None = None  # CPU runs: the node's cores are shared by this many slots
    memory_snapshot_dir: str | None = None  # record_memory on CUDA: snapshots written at every checkpoint
    sample_packing: bool = False  # micro-batches without padding (trainer.use_sample_packing)
    sequence_parallel_size: int = 1  # Ulysses (fsdp2): each row split over groups of this many ranks
    max_tokens_per_microbatch: int = -1  # a token budget per micro-batch; -1 cuts them by micro_*_batch_size
    colocated: bool = False  # training shares its GPUs with the inference engines
    total_optimizer_steps: int = 1  # the LR schedule's length: set by the driver from the dataset's size
    # trainer.mtp on the megatron policy: the weight of its MTP heads' draft loss; None: no MTP heads are trained
    mtp_loss_weight: float | None = None
    # trainer.logprobs_chunk_size: tokens scored at a time (None: a micro-batch's all at once, megatron only)
    logprobs_chunk_size: int | None = 1024
    # trainer.vocab_entropy_chunk_size (0: sized from vocab_entropy_chunk_memory_mb; None: no bound) and its budget:
    # where the entropy is computed under megatron, they bound the chunk further (rlc.core.runtime_facts.score_chunk)
    entropy_chunk_size: int | None = None
    entropy_chunk_memory_mb: int = 512
    # trainer.policy.model.fake_int4_qat (megatron policy and ref, as SkyRL reads the policy's for both) when enabled:
    # (group_size, scale_divisor, q_min) of the routed experts' fake-INT4 forward (rlc.runtime.workers.qat)
    fake_int4_qat: FakeInt4Qat | None = None
    # trainer.policy.model.fake_int4_qat.bf16_base_path (megatron policy and ref): the checkpoint the trainer loads
    # its weights from when model_path is one the engines serve quantized (None: model_path's)
    weights_path: str | None = None
    # trainer.fused_lm_head_logprob (megatron policy and ref): its backend, torch | triton (None: off): log-probs from
    # the last hidden states and the head's weight a chunk at a time (rlc.runtime.workers.megatron_head)
    fused_lm_head: str | None = None


@dataclass(frozen=True)
class VLLMArgs:
    """vLLM's engine arguments for every engine of a `vllm` backend, as the compiler decided them.

    The runtime turns them into `vllm.LLM(**...)` keywords one to one (`rlc.runtime.inference.vllm.engine_kwargs`),
    adding only what exists on the node alone: the model's local directory and rlc's worker extension class.
    """

    seeds: tuple[int, ...]  # one per engine, in the plan's engine order (each engine samples differently)
    dtype: str  # bfloat16 | float16 | float32 (`auto` is resolved)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    enable_expert_parallel: bool  # vLLM's expert-parallel size is dp x tp: the flag is all it takes
    gpu_memory_utilization: float
    enforce_eager: bool
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    distributed_executor_backend: str  # uni (one GPU, in the engine's own process) | ray | mp
    logprobs_mode: str  # processed_logprobs: the log-probs the trainer computes (after temperature)
    enable_sleep_mode: bool  # colocated with training: the engine hands its GPU memory over between phases
    enable_lora: bool  # the engines take the policy's LoRA adapters (fsdp2 with lora.rank > 0)
    max_lora_rank: int = 0  # the smallest value vLLM accepts that holds the adapters' rank (0 without LoRA)
    max_loras: int = 0
    fully_sharded_loras: bool = False
    rope_scaling: dict | None = None  # merged into the model config's rope_parameters (hf_overrides)
    rope_theta: float | None = None
    # The KV cache's size where the compiler sets it: on a CPU, where vLLM would otherwise take its share of the whole
    # host's memory (gpu_memory_utilization of it). None: vLLM sizes it from gpu_memory_utilization (GPUs).
    kv_cache_memory_bytes: int | None = None
    block_size: int | None = None  # the KV cache's block in tokens where the compiler sets it (CPUs); None: vLLM's
    # vLLM's speculative_config (generator.inference_engine.speculative_config): drafts that the engine verifies
    # against the policy, so samples and log-probs stay the policy's. None: no speculative decoding.
    speculative_config: dict | None = None
    init_kwargs: dict = field(default_factory=dict)  # generator.inference_engine.engine_init_kwargs: applied last
    # The prefill/decode split (enable_pd): each engine's role in the plan's engine order ("prefill" | "decode"; empty
    # without a split), and each role's arguments, applied over init_kwargs (prefill_init_kwargs, decode_init_kwargs).
    pd_roles: tuple[str, ...] = ()
    role_init_kwargs: dict = field(default_factory=dict)
    # Routing replay (generator.inference_engine.enable_return_routed_experts): each completion carries its tokens'
    # routed experts (vLLM's argument of that name)
    enable_return_routed_experts: bool = False
    env: dict[str, str] = field(default_factory=dict)  # environment variables set before vLLM is imported


@dataclass(frozen=True)
class EngineSettings:
    """How the inference engines are built."""

    backend: str  # hf | vllm | remote (remote: engines run elsewhere, reached over HTTP)
    dtype: str  # bfloat16 | float16 | float32 (`auto` is resolved)
    device: str  # cpu | cuda
    model_path: str
    max_model_len: int  # max_prompt_length + max_generate_length
    prefix_cache: bool  # the engines keep a prefix cache to reset after a weight update
    adapter_sync: bool  # LoRA under fsdp2: the engines hold the base model and take only the adapters
    lora_rank: int = 0
    served_model_name: str | None = None
    cpu_slots_per_node: int | None = None
    vllm: VLLMArgs | None = None  # the vllm backend's engine arguments; None for hf and remote engines
    # What an engine drops when it sleeps: 2 its weights too (a full sync refills them), 1 its KV cache only (LoRA
    # adapter sync: only the adapters come back, the base weights must stay).
    sleep_level: int = 2
    prompt_cache_bytes: int = 0  # hf engines, multi-turn: a turn's prompts' keys and values kept for the next turn
    # generator.inference_engine.language_model_only: a multimodal checkpoint's text model only
    language_model_only: bool = False
    # generator.inference_engine.enable_return_routed_experts: every completion carries the experts each of its
    # tokens was routed to, for the trainer to replay (routing replay, R3)
    routed_experts: bool = False


@dataclass(frozen=True)
class DeltaSync:
    """Checkpoint deltas through shared storage, in SkyRL's format (generator.inference_engine.delta_weight_sync):
    where trainer rank 0 publishes and how, and where each engine keeps its patched copy of the checkpoint."""

    sync_dir: str  # a path every node sees, s3://bucket/prefix or gs://bucket/prefix
    local_checkpoint_dir: str  # on each engine's node; engines of one node share it
    max_file_bytes: int  # a payload file holds compressed patches up to this size
    publish_num_workers: int | None  # threads computing and compressing patches; None: min(8, CPUs)
    cloud_download_workers: int  # payload files an engine downloads at once


@dataclass(frozen=True)
class WeightSync:
    """How the policy's weights reach the engines after each step."""

    # gloo | nccl (a broadcast group) | ipc (CUDA IPC buckets) | payload (whole state dicts) | delta (checkpoint
    # deltas through shared storage)
    transport: str
    backend: str | None  # the broadcast group's collective (gloo | nccl), None when no group is formed
    override_existing_group: bool  # an engine still in another run's weight-update group leaves it
    ipc_threshold_bytes: int = 0
    delta: DeltaSync | None = None  # transport delta only


@dataclass(frozen=True)
class KLControl:
    """The coefficient of the KL penalty in the reward (use_kl_in_reward)."""

    kind: str  # fixed | adaptive
    initial: float
    target: float
    horizon: int


@dataclass(frozen=True)
class SandboxSettings:
    """Where model-written code runs (environment.sandbox): the isolation the runtime must give, or refuse to start,
    and the limits of one sandbox. `runs_model_code` says whether the job's default environment runs any."""

    isolation: str = "bubblewrap"  # bubblewrap | unisolated
    memory_mb: int = 1024
    max_processes: int = 64
    file_mb: int = 64
    output_kb: int = 1024
    python_tool_seconds: float = 10.0
    env_class: str = ""  # the job's default environment
    runs_model_code: bool = False
    concurrent: int = 32  # sandboxes that may run at once: the generator's environment workers


@dataclass(frozen=True)
class DataSettings:
    """The prompts a run reads (data.*): rows without an env_class of their own take `env_class`; prompts longer
    than `max_prompt_length` tokens are left out."""

    train_data: tuple[str, ...]
    val_data: tuple[str, ...]  # () when the run never evaluates
    env_class: str
    max_prompt_length: int
    chat_template_source: str  # generator.chat_template: name | file
    chat_template: str | None  # its name_or_path; None keeps the tokenizer's own
    chat_template_kwargs: dict[str, Any]
    seed: int  # trainer.seed: a missing dataset whose writer draws from it is written with it
    isolation: str  # environment.sandbox.isolation: rows naming an environment that runs model code need it


@dataclass(frozen=True)
class TrackingSettings:
    """Where a run's metrics go: `{log_path}/{run_name}/metrics.jsonl` and the tracker (trainer.logger)."""

    log_path: str  # expanded on the node that runs the driver
    run_name: str
    logger: str
    project_name: str


@dataclass(frozen=True)
class CheckpointSettings:
    """A run's checkpoints and Hugging Face exports, and the checkpoint it resumes from."""

    ckpt_path: str  # expanded on the node that runs the driver
    export_path: str
    ckpt_interval: int  # -1: never
    hf_save_interval: int  # -1: never
    max_ckpts_to_keep: int
    resume_mode: str | None  # none | latest | from_path
    resume_path: str | None


@dataclass(frozen=True)
class EvalSettings:
    """When and how the run evaluates over the validation rows."""

    interval: int  # trainer.eval_interval; -1: never
    before_train: bool
    batch_size: int
    n_samples_per_prompt: int
    sampling: Sampling  # generator.eval_sampling_params, else the train sampling
    env_class: str  # the environment of rows that name none
    dump_to: str | None  # trainer.export_path when trainer.dump_eval_results, else None


@dataclass(frozen=True)
class AheadSettings:
    """What fully async generation needs: trainer.fully_async's bounds, the batch size and the train sampling."""

    max_staleness_steps: int
    num_parallel_generation_workers: int
    train_batch_size: int
    n_samples_per_prompt: int
    sampling: Sampling


@dataclass(frozen=True)
class ScoringSettings:
    """What scoring a batch takes: its masks and filters, the old log-probs' source, the KL in the reward, the
    advantages, and the rollout metrics' reading of them."""

    multi_turn: bool  # generator.max_turns > 1: the loss mask, not the attention mask, marks generated tokens
    step_wise: bool  # a row per turn (generator.step_wise_trajectories)
    fully_async: bool  # generated ahead with older weights: the rollouts' own log-probs are the old ones
    apply_overlong_filtering: bool
    zero_reward_on_non_stop: bool
    zero_variance_filter: bool
    zero_variance_filter_tol: float
    off_policy_correction: bool  # trainer.algorithm.off_policy_correction changes anything
    kl_in_reward: bool
    kl_estimator: str
    kl: KLControl  # the coefficient of the KL in the reward
    advantage_estimator: str
    advantage_batch_normalize: bool
    # A forward pass of the policy gives the old log-probs; without it they are the rollouts' own (fully async) or
    # the current policy's, which then needs no pass of its own (one optimizer step per batch: ratio 1).
    old_logprob_pass: bool
    # The old-log-prob pass also gives each token's sum of squared probabilities (an estimator's `sum_pi_squared`).
    sum_pi_squared: bool = False
    pf_ppo: str | None = None  # verl's PF-PPO reweighting (trainer.algorithm.pf_ppo.reweight_method): rows drawn again
    pf_ppo_weight_pow: float = 2.0


@dataclass(frozen=True)
class OverlongBuffer:
    """DAPO's soft overlong penalty: the last `length` tokens before `max_response_length` cost up to
    `penalty_factor` of the reward (trainer.algorithm.overlong_buffer_*, generator.sampling_params.max_generate_length)."""

    length: int
    penalty_factor: float
    max_response_length: int


@dataclass(frozen=True)
class GeneratorSettings:
    """The generator's share: `generator`'s multi-turn keys and the environments' defaults (environment.*); the
    environments take environment.skyrl_gym whole."""

    default_env: str  # environment.env_class, for rows without their own
    max_turns: int = 1
    max_input_length: int = 1 << 30  # generator.max_input_length, else trainer.max_prompt_length
    conversation: bool = True  # use_conversation_multi_turn
    append_eos_after_stop: bool = True
    step_wise: bool = False
    batched: bool = False
    zero_reward_on_non_stop: bool = False
    env_workers: int = 32  # environment.skyrl_gym.max_env_workers
    env_timeout_s: float = 600.0  # an environment call (make, init, step) that takes longer ends its trajectory
    overlong_buffer: OverlongBuffer | None = None  # DAPO's soft overlong penalty, when trainer.algorithm asks for it
    reward_clip: float | None = None  # trainer.algorithm.reward_clip: each reward within [-it, it], after the penalty
    # Each batch of prompts also gets one greedy response per prompt, whose reward is its samples' baseline (remax).
    greedy_baseline: bool = False


@dataclass(frozen=True)
class LoopSettings:
    """The step loop's own share of the job: its sizes and length, how it splits a batch for the updates, and what
    it writes of each step; each component's share is in its own settings."""

    seed: int
    train_batch_size: int
    n_samples_per_prompt: int
    policy_mini_batch_size: int
    critic_mini_batch_size: int
    update_epochs_per_batch: int
    epochs: int
    max_training_steps: int | None
    step_wise: bool  # a row per turn: mini-batches of whole prompts
    dynamic_sampling: bool  # trainer.algorithm.dynamic_sampling has a type
    fully_async: bool  # generation runs ahead of training (trainer.fully_async)
    offload_after_step: dict[str, bool]  # by trained role: its optimizer state leaves the GPU after each step
    dump_data_batch_to: str | None  # trainer.export_path when trainer.dump_data_batch, else None
    grace_period_s: float  # launch.grace_period_s: from SIGTERM or SIGINT to exit, the last finished step saved in it
    # trainer.micro_train_batch_size_per_gpu: the runs of rows token_mean_legacy averages (SkyRL's micro-batches)
    micro_train_batch_size: int = 1
    # trainer.recompute_old_logprobs_per_minibatch: the old log-probs (ref log-probs, critic values) are computed
    # mini-batch by mini-batch, split over the ranks as the updates split them; False: one pass over the whole batch
    old_pass_per_mini_batch: bool = True
    # trainer.min_samples_per_env under trainer.use_hybrid_env_sampling: rows of each environment in every batch;
    # None draws batches uniformly
    min_samples_per_env: int | None = None


@dataclass(frozen=True)
class ProcessEnvs:
    """Environment variables of the processes the runtime starts."""

    every: dict[str, str]  # launch.envs: the driver's Ray and every actor it starts
    trainer: dict[str, str]  # the training ranks': launch.trainer_envs and the CUDA allocator's settings
    engines: dict[str, str]  # the local engines': launch.inference_envs


@dataclass(frozen=True)
class Decisions:
    """What the runtime does that is not written in the spec as such: settled once, by the compiler."""

    device: str  # cpu | cuda
    workers: dict[str, WorkerSettings]  # by role, for the roles the job runs
    engines: EngineSettings
    weight_sync: WeightSync
    train_sampling: Sampling
    node_wait_timeout_s: float  # how long a placement group may take to be granted
    offload_between_phases: bool  # weights, optimizer state and engines move on and off the GPUs around each phase
    loop: LoopSettings
    data: DataSettings
    tracking: TrackingSettings
    checkpoints: CheckpointSettings
    evaluation: EvalSettings
    ahead: AheadSettings
    scoring: ScoringSettings
    generator: GeneratorSettings
    envs: ProcessEnvs
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)

    def to_json(self) -> dict:
        return {"version": DECISIONS_VERSION, **_plain(self)}

    @classmethod
    def from_json(cls, data: Any) -> Decisions:
        if not isinstance(data, dict) or data.get("version") != DECISIONS_VERSION:
            raise JobFormatError(f"the runtime decisions are not of version {DECISIONS_VERSION}")
        try:
            return _build(cls, {k: v for k, v in data.items() if k != "version"})
        except (KeyError, TypeError, ValueError) as exc:
            raise JobFormatError(f"the runtime decisions are malformed ({exc})") from None


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _build(tp: Any, value: Any) -> Any:
    """A value of type `tp` from its plain JSON form; TypeError when it does not have that form."""
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"{tp.__name__}: expected an object, got {value!r}")
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        unknown = set(value) - names
        if unknown:
            raise TypeError(f"{tp.__name__}: unknown field(s) {sorted(unknown)}")
        return tp(**{k: _build(hints[k], v) for k, v in value.items()})
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        return _build(next(a for a in args if a is not type(None)), value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {value!r}")
        args = typing.get_args(tp)
        return {k: _build(args[1], v) for k, v in value.items()} if args else dict(value)
    if origin is tuple:
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {value!r}")
        return tuple(_build(typing.get_args(tp)[0], v) for v in value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)
    if tp in (int, str, bool):
        if type(value) is not tp:
            raise TypeError(f"expected {tp.__name__}, got {value!r}")
        return value
    return value
