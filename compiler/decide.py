"""Decide: what the runtime does that the spec does not spell out, settled once from the resolved spec and the plan.

The runtime reads these decisions from plan.json's "runtime" section and derives nothing of its own: no `auto`,
no fallbacks. Each function below is one decision, with the reason for it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from rlc.compiler.roles import strategy_of, trainer_checkpoint
from rlc.core import algorithms
from rlc.core.job import (
    AheadSettings,
    CheckpointSettings,
    DataSettings,
    Decisions,
    DeltaSync,
    EngineSettings,
    EvalSettings,
    FakeInt4Qat,
    GeneratorSettings,
    KLControl,
    LoopSettings,
    OverlongBuffer,
    ProcessEnvs,
    Sampling,
    SandboxSettings,
    ScoringSettings,
    TrackingSettings,
    VLLMArgs,
    WeightSync,
    WorkerSettings,
    seed_for,
)
from rlc.core.plan import Plan
from rlc.core.runtime_facts import MULTI_TURN_PROMPT_CACHE_BYTES, off_policy_section_corrects, runs_model_code

# vLLM's accepted `max_lora_rank` values (a Literal of EngineArgs in vLLM 0.30; a vllm_api test compares).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# vLLM 0.30 on a CPU: the KV cache's block, and the KV cache of a model rlc cannot size (a hub id not downloaded yet):
# 1 GiB, what engine_init_kwargs.kv_cache_memory_bytes overrides. CpuPlatform takes 128-token blocks unless told; rlc
# asks for 32 (the smallest its attention kernels take): prefix caching shares only whole blocks, and a group's samples
# share their prompt's KV cache only when the prompt fills at least one block.
CPU_KV_BLOCK_TOKENS = 32
CPU_KV_UNKNOWN_MODEL_BYTES = 1 << 30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
STRATEGY_NAMES = {"fsdp": "fsdp2", "fsdp2": "fsdp2", "megatron": "megatron"}


def decide(spec: Any, plan: Plan) -> Decisions:
    g = spec.generator
    device = "cpu" if plan.device == "CPU" else "cuda"
    cpu_slots = plan.gpus_per_node if device == "cpu" else None
    workers = {role.name: worker_settings(spec, role.name, device, cpu_slots) for role in plan.roles}
    return Decisions(
        device=device,
        workers=workers,
        engines=engine_settings(spec, device, cpu_slots, plan),
        weight_sync=weight_sync(spec, device),
        train_sampling=sampling(g.sampling_params),
        node_wait_timeout_s=float(spec.launch.node_wait_timeout_s),
        offload_between_phases=offload_between_phases(spec, device),
        loop=loop_settings(spec, plan),
        data=data_settings(spec),
        tracking=tracking_settings(spec),
        checkpoints=checkpoint_settings(spec),
        evaluation=eval_settings(spec),
        ahead=ahead_settings(spec),
        scoring=scoring_settings(spec),
        generator=generator_settings(spec),
        envs=process_envs(spec),
        sandbox=sandbox(spec),
    )


def loop_settings(spec: Any, plan: Plan) -> LoopSettings:
    """The step loop's own share: trainer.*'s sizes, length and per-step dumps, the generator's batch keys, and the
    seconds the loop has to stop on a signal (launch.grace_period_s)."""
    t, g = spec.trainer, spec.generator
    return LoopSettings(
        seed=int(t.seed),
        train_batch_size=int(t.train_batch_size),
        n_samples_per_prompt=int(g.n_samples_per_prompt),
        policy_mini_batch_size=int(t.policy_mini_batch_size),
        critic_mini_batch_size=int(t.critic_mini_batch_size),
        update_epochs_per_batch=int(t.update_epochs_per_batch),
        epochs=int(t.epochs),
        max_training_steps=t.max_training_steps,
        step_wise=bool(g.step_wise_trajectories),
        dynamic_sampling=bool(t.algorithm.dynamic_sampling.type),
        fully_async=bool(t.fully_async.enabled),
        offload_after_step={
            r.name: bool(getattr(t, r.name).optimizer_config.offload_after_step) for r in plan.roles if r.name != "ref"
        },
        dump_data_batch_to=str(t.export_path) if t.dump_data_batch else None,
        grace_period_s=float(spec.launch.grace_period_s),
        micro_train_batch_size=int(t.micro_train_batch_size_per_gpu),
        min_samples_per_env=int(t.min_samples_per_env) if t.use_hybrid_env_sampling else None,
        old_pass_per_mini_batch=bool(t.recompute_old_logprobs_per_minibatch),
    )


def data_settings(spec: Any) -> DataSettings:
    """data.*, the prompt limit and the chat template; the validation rows are read only by a run that evaluates."""
    t, g, d = spec.trainer, spec.generator, spec.data
    evaluates = int(t.eval_interval) > 0 or bool(t.eval_before_train)
    return DataSettings(
        train_data=tuple(d.train_data),
        val_data=tuple(d.val_data) if evaluates else (),
        env_class=str(spec.environment.env_class),
        max_prompt_length=int(t.max_prompt_length),
        chat_template_source=str(g.chat_template.source),
        chat_template=g.chat_template.name_or_path,
        chat_template_kwargs=dict(g.chat_template_kwargs or {}),
        seed=int(t.seed),
        isolation=spec.environment.sandbox.isolation,
    )


def tracking_settings(spec: Any) -> TrackingSettings:
    t = spec.trainer
    return TrackingSettings(
        log_path=str(t.log_path), run_name=str(t.run_name), logger=str(t.logger), project_name=str(t.project_name)
    )


def checkpoint_settings(spec: Any) -> CheckpointSettings:
    t = spec.trainer
    return CheckpointSettings(
        ckpt_path=str(t.ckpt_path),
        export_path=str(t.export_path),
        ckpt_interval=int(t.ckpt_interval),
        hf_save_interval=int(t.hf_save_interval),
        max_ckpts_to_keep=int(t.max_ckpts_to_keep),
        resume_mode=t.resume_mode,
        resume_path=t.resume_path,
    )


def eval_settings(spec: Any) -> EvalSettings:
    """Evaluation samples with generator.eval_sampling_params, else as training does."""
    t, g = spec.trainer, spec.generator
    return EvalSettings(
        interval=int(t.eval_interval),
        before_train=bool(t.eval_before_train),
        batch_size=int(t.eval_batch_size),
        n_samples_per_prompt=int(g.eval_n_samples_per_prompt),
        sampling=sampling(g.eval_sampling_params or g.sampling_params),
        env_class=str(spec.environment.env_class),
        dump_to=str(t.export_path) if t.dump_eval_results else None,
    )


def ahead_settings(spec: Any) -> AheadSettings:
    t, g = spec.trainer, spec.generator
    fa = t.fully_async
    return AheadSettings(
        max_staleness_steps=int(fa.max_staleness_steps),
        num_parallel_generation_workers=int(fa.num_parallel_generation_workers),
        train_batch_size=int(t.train_batch_size),
        n_samples_per_prompt=int(g.n_samples_per_prompt),
        sampling=sampling(g.sampling_params),
    )


def scoring_settings(spec: Any) -> ScoringSettings:
    """The generator's and trainer.algorithm's scoring keys, and where the old log-probs come from."""
    t, g, a = spec.trainer, spec.generator, spec.trainer.algorithm
    return ScoringSettings(
        multi_turn=g.max_turns > 1,
        step_wise=bool(g.step_wise_trajectories),
        fully_async=bool(t.fully_async.enabled),
        apply_overlong_filtering=bool(g.apply_overlong_filtering),
        zero_reward_on_non_stop=bool(g.zero_reward_on_non_stop),
        zero_variance_filter=bool(a.zero_variance_filter),
        zero_variance_filter_tol=float(a.zero_variance_filter_tol),
        off_policy_correction=scores_off_policy(a),
        kl_in_reward=bool(a.use_kl_in_reward),
        kl_estimator=str(a.kl_estimator_type),
        kl=KLControl(a.kl_ctrl.type, float(a.kl_loss_coef), float(a.kl_ctrl.kl_target), int(a.kl_ctrl.horizon)),
        advantage_estimator=str(a.advantage_estimator),
        advantage_batch_normalize=bool(a.advantage_batch_normalize),
        old_logprob_pass=old_logprob_pass(spec),
        sum_pi_squared=algorithms.advantage_estimator(str(a.advantage_estimator)).needs_sum_pi_squared,
        pf_ppo=a.pf_ppo.reweight_method,
        pf_ppo_weight_pow=float(a.pf_ppo.weight_pow),
    )


def generator_settings(spec: Any) -> GeneratorSettings:
    """The generator's multi-turn keys; a turn's input is bounded by generator.max_input_length, else the prompt's."""
    g, e = spec.generator, spec.environment
    estimator = algorithms.advantage_estimator(str(spec.trainer.algorithm.advantage_estimator))
    return GeneratorSettings(
        default_env=str(e.env_class),
        max_turns=int(g.max_turns),
        max_input_length=int(g.max_input_length or spec.trainer.max_prompt_length),
        conversation=bool(g.use_conversation_multi_turn),
        append_eos_after_stop=bool(g.append_eos_token_after_stop_str_in_multi_turn),
        step_wise=bool(g.step_wise_trajectories),
        batched=bool(g.batched),
        zero_reward_on_non_stop=bool(g.zero_reward_on_non_stop),
        env_workers=int(e.skyrl_gym.max_env_workers),
        greedy_baseline=estimator.needs_greedy_baseline,
        overlong_buffer=overlong_buffer(spec),
        reward_clip=None if spec.trainer.algorithm.reward_clip is None else float(spec.trainer.algorithm.reward_clip),
    )


def overlong_buffer(spec: Any) -> OverlongBuffer | None:
    a = spec.trainer.algorithm
    if a.overlong_buffer_len is None:
        return None
    return OverlongBuffer(
        int(a.overlong_buffer_len),
        float(a.overlong_buffer_penalty_factor),
        int(spec.generator.sampling_params.max_generate_length),
    )


def old_logprob_pass(spec: Any) -> bool:
    """Whether the policy scores each batch in a pass of its own for the old log-probs.

    Not under fully async training: generated ahead with older weights, the behaviour policy is the engine's, so the
    rollouts' own log-probs anchor the importance ratio. Not with one optimizer step per batch either: the policy
    being updated is the one that scored the batch, so the old log-probs are the current ones (ratio 1), unless the
    KL in the reward, an off-policy correction or the advantage estimator (the optimal token baselines) reads them
    before the update.
    """
    t, a = spec.trainer, spec.trainer.algorithm
    if t.fully_async.enabled:
        return False
    single_update = t.update_epochs_per_batch == 1 and t.policy_mini_batch_size >= t.train_batch_size
    return (
        not single_update
        or bool(a.use_kl_in_reward)
        or scores_off_policy(a)
        or algorithms.advantage_estimator(str(a.advantage_estimator)).needs_sum_pi_squared
    )


def scores_off_policy(a: Any) -> bool:
    """Whether scoring applies trainer.algorithm.off_policy_correction to the batch: unless the policy loss applies
    it itself (verl's bypass mode)."""
    in_loss = algorithms.policy_loss(a.policy_loss_type).corrects_in_loss
    return off_policy_section_corrects(a.off_policy_correction) and not in_loss


def process_envs(spec: Any) -> ProcessEnvs:
    """launch.envs, launch.trainer_envs and launch.inference_envs as strings, and PyTorch's expandable-segments
    allocator for the training ranks when trainer.use_expandable_segments asks for it: fewer fragmented GPU blocks
    between the phases (a PYTORCH_CUDA_ALLOC_CONF the user set, for the trainer or every process, wins); cuBLAS's
    deterministic workspace under trainer.deterministic (likewise)."""
    launch = spec.launch
    every = {k: str(v) for k, v in (launch.envs or {}).items()}
    trainer = {k: str(v) for k, v in (launch.trainer_envs or {}).items()}
    if spec.trainer.use_expandable_segments and "PYTORCH_CUDA_ALLOC_CONF" not in {**every, **trainer}:
        trainer["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if spec.trainer.deterministic and "CUBLAS_WORKSPACE_CONFIG" not in {**every, **trainer}:
        # cuBLAS's deterministic workspace, which torch.use_deterministic_algorithms requires on CUDA; read as the
        # rank starts, so set in its environment (a CPU rank never reads it)
        trainer["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return ProcessEnvs(
        every=every, trainer=trainer, engines={k: str(v) for k, v in (launch.inference_envs or {}).items()}
    )


def sandbox(spec: Any) -> SandboxSettings:
    """environment.sandbox as the runtime applies it, and whether the default environment runs model-written code
    (rows may name another environment: the runtime checks the level again before it makes one)."""
    s = spec.environment.sandbox
    return SandboxSettings(
        isolation=s.isolation,
        memory_mb=s.memory_mb,
        max_processes=s.max_processes,
        file_mb=s.file_mb,
        output_kb=s.output_kb,
        python_tool_seconds=float(s.python_tool_seconds),
        env_class=str(spec.environment.env_class),
        runs_model_code=runs_model_code(spec.environment.env_class),
        concurrent=spec.environment.skyrl_gym.max_env_workers,
    )


def offload_between_phases(spec: Any, device: str) -> bool:
    """colocate_all hands each GPU back and forth between training and generation. Not on a CPU (no device memory to
    hand over: an engine's sleep would only free host memory to allocate it again), not under fully async training
    (both run at once) and not with remote engines (they hold GPUs of their own)."""
    t, ie = spec.trainer, spec.generator.inference_engine
    return bool(t.placement.colocate_all and not t.fully_async.enabled and device != "cpu" and ie.run_engines_locally)


def strategy(spec: Any, role: str) -> str:
    """The runtime's name of the backend that trains `role` (the critic's own trainer.critic.strategy, where set)."""
    return STRATEGY_NAMES[strategy_of(spec, role)]


def model_path(spec: Any, role: str) -> str:  # what the engines serve: trainer_checkpoint is what the trainer loads
    """A ref (or critic) without a model path of its own starts from the policy's weights."""
    t = spec.trainer
    return getattr(t, role).model.path or t.policy.model.path


def max_seq_len(spec: Any) -> int:
    """Tokens of one row: trainer.algorithm.max_seq_len, which resolve derives from the input and generation lengths."""
    a, g = spec.trainer.algorithm, spec.generator
    if isinstance(a.max_seq_len, int):
        return a.max_seq_len
    return int(spec.trainer.max_prompt_length) + int(g.sampling_params.max_generate_length)


def temperature(spec: Any) -> float:
    """The divisor of the logits in the trainer's log-probs: the sampling temperature, 1 when sampling is greedy."""
    value = spec.trainer.algorithm.temperature
    return float(value) if value and value > 0 else 1.0


def worker_settings(spec: Any, role: str, device: str, cpu_slots: int | None) -> WorkerSettings:
    t = spec.trainer
    return WorkerSettings(
        role=role,
        strategy=strategy(spec, role),
        model_path=model_path(spec, role),
        device=device,
        bf16=bool(t.bf16),
        gradient_checkpointing=bool(t.gradient_checkpointing),
        gradient_checkpointing_use_reentrant=bool(t.gradient_checkpointing_use_reentrant),
        micro_train_batch_size=int(t.micro_train_batch_size_per_gpu),
        micro_forward_batch_size=int(t.micro_forward_batch_size_per_gpu),
        temperature=temperature(spec),
        seed=int(t.seed),
        deterministic=bool(t.deterministic),
        max_seq_len=max_seq_len(spec),
        cpu_slots_per_node=cpu_slots,
        memory_snapshot_dir=f"{t.ckpt_path.rstrip('/')}/memory_snapshots",
        # SkyRL 0.4 renamed use_sample_packing to remove_microbatch_padding: packing runs when neither is off
        sample_packing=bool(t.use_sample_packing and t.remove_microbatch_padding),
        sequence_parallel_size=int(getattr(t, role).sequence_parallel_size) if strategy(spec, role) == "fsdp2" else 1,
        max_tokens_per_microbatch=int(t.max_tokens_per_microbatch),
        colocated=bool(t.placement.colocate_all),
        mtp_loss_weight=float(t.mtp.loss_weight)
        if t.mtp.enabled and role == "policy" and strategy(spec, role) == "megatron"
        else None,
        logprobs_chunk_size=None if t.logprobs_chunk_size is None else int(t.logprobs_chunk_size),
        # SkyRL's Megatron worker reads the entropy chunks; its FSDP worker scores the entropy in log-prob chunks
        entropy_chunk_size=(
            None
            if t.vocab_entropy_chunk_size is None or strategy(spec, role) != "megatron"
            else int(t.vocab_entropy_chunk_size)
        ),
        entropy_chunk_memory_mb=int(t.vocab_entropy_chunk_memory_mb),
        fake_int4_qat=fake_int4_qat(spec, role),
        weights_path=bf16_base_path(spec, role),
        fused_lm_head=fused_lm_head(spec, role),
    )


def fused_lm_head(spec: Any, role: str) -> str | None:
    """trainer.fused_lm_head_logprob's backend for the megatron policy and ref (SkyRL's Megatron worker reads it for
    both; its critic has a value head), None where it is off."""
    t = spec.trainer
    if not t.fused_lm_head_logprob or role == "critic" or strategy(spec, role) != "megatron":
        return None
    return str(t.fused_lm_head_logprob_backend)


def bf16_base_path(spec: Any, role: str) -> str | None:
    """SkyRL's Megatron worker loads the policy's and ref's weights from the policy's fake_int4_qat.bf16_base_path,
    QAT on or off, when set (model.path then names the checkpoint the engines serve, INT4)."""
    path = trainer_checkpoint(spec, role)
    return str(path) if path != model_path(spec, role) else None


def fake_int4_qat(spec: Any, role: str) -> FakeInt4Qat | None:
    """SkyRL's fake-INT4 QAT of the routed experts: the policy's setting, for the megatron policy and ref."""
    q = spec.trainer.policy.model.fake_int4_qat
    if not q.enabled or role == "critic" or strategy(spec, role) != "megatron":
        return None
    return FakeInt4Qat(int(q.group_size), float(q.scale_divisor), float(q.q_min))


def adapter_sync(spec: Any) -> bool:
    """LoRA under fsdp2, or under megatron with lora_config.merge_lora off: the engines hold the base weights and
    take only the adapters. Otherwise under megatron the policy sends its weights with the adapters merged in, so
    the engines run a plain model."""
    t = spec.trainer
    if t.policy.model.lora.rank <= 0:
        return False
    return strategy(spec, "policy") != "megatron" or not t.policy.megatron_config.lora_config.merge_lora


def engine_dtype(spec: Any, device: str) -> str:
    """`auto`: float32 on a CPU (no bf16 matmuls worth having there), bfloat16 on GPUs."""
    dtype = spec.generator.inference_engine.model_dtype
    if dtype != "auto":
        return str(dtype)
    return "float32" if device == "cpu" else "bfloat16"


def max_model_len(spec: Any) -> int:
    """An engine's context: the longest prompt plus the longest generation. A multi-turn trajectory's later turns
    send its whole conversation so far, up to generator.max_input_length tokens, as the prompt."""
    g = spec.generator
    longest = int(spec.trainer.max_prompt_length)
    if g.max_turns > 1 and isinstance(g.max_input_length, int):
        longest = max(longest, g.max_input_length)
    return longest + int(g.sampling_params.max_generate_length)


def engine_settings(spec: Any, device: str, cpu_slots: int | None, plan: Plan) -> EngineSettings:
    t, ie = spec.trainer, spec.generator.inference_engine
    backend = ie.backend if ie.run_engines_locally else "remote"
    sync_adapters = adapter_sync(spec)
    return EngineSettings(
        backend=backend,
        dtype=engine_dtype(spec, device),
        device=device,
        model_path=t.policy.model.path,
        max_model_len=max_model_len(spec),
        # The hf engine keeps no prefix cache: nothing to reset after a weight update.
        prefix_cache=backend != "hf",
        adapter_sync=sync_adapters,
        lora_rank=int(t.policy.model.lora.rank) if sync_adapters else 0,
        served_model_name=ie.served_model_name,
        cpu_slots_per_node=cpu_slots,
        vllm=vllm_args(spec, device, [e.index for e in plan.engines]) if backend == "vllm" else None,
        sleep_level=1 if sync_adapters else 2,
        # none with routed experts: a continued prompt's cached tokens were routed in an earlier call, so the engine
        # runs every prompt whole
        prompt_cache_bytes=MULTI_TURN_PROMPT_CACHE_BYTES
        if backend == "hf" and spec.generator.max_turns > 1 and not ie.enable_return_routed_experts
        else 0,
        language_model_only=bool(ie.language_model_only),
        routed_experts=bool(ie.enable_return_routed_experts),
    )


def lora_max_rank(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds adapters of `rank` (RLC-E509 refuses a larger rank)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), VLLM_LORA_RANKS[-1])


def cpu_kv_cache_bytes(spec: Any, engines: int) -> int:
    """A CPU engine's KV cache: room for every sequence of the largest batch an engine gets at once (its share of a
    step's rollouts, or of an evaluation batch; at most max_num_seqs), each max_model_len tokens in whole blocks,
    plus the one block vLLM keeps for itself (its null block, block 0): without it the last sequence waits for the
    others and the batch takes twice the decode steps. A larger cache would only hold host memory; a smaller one
    still works, vLLM then runs fewer sequences at once."""
    # deferred: model_size's shape tables, only when a model's size is asked
    from rlc.compiler.model_size import model_info

    t, g, ie = spec.trainer, spec.generator, spec.generator.inference_engine
    overrides = t.policy.model_config_kwargs
    shape = model_info(t.policy.model.path, overrides if isinstance(overrides, dict) else None).shape
    if shape is None:
        return CPU_KV_UNKNOWN_MODEL_BYTES
    rows = int(t.train_batch_size) * int(g.n_samples_per_prompt)
    if t.eval_interval > 0 or t.eval_before_train:
        rows = max(rows, int(t.eval_batch_size) * int(g.eval_n_samples_per_prompt))
    rows = min(-(-rows // max(1, engines)), int(ie.max_num_seqs))
    blocks = -(-max_model_len(spec) // CPU_KV_BLOCK_TOKENS)
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * _DTYPE_BYTES[engine_dtype(spec, "cpu")]
    return (rows * blocks + 1) * CPU_KV_BLOCK_TOKENS * per_token


def speculative_config(spec: Any, device: str) -> dict | None:
    """vLLM's speculative_config: the spec's; with MTP heads trained (trainer.mtp) and none given, drafting with
    them at trainer.mtp.num_speculative_tokens, as SkyRL's `_apply_mtp_config` sets it (on GPUs: vLLM's CPU build
    cannot verify drafts, RLC-E520, so a CPU run trains the heads without drafting, as SkyRL's SKYRL_DISABLE_SPEC)."""
    ie, mtp = spec.generator.inference_engine, spec.trainer.mtp
    if ie.speculative_config:
        return dict(ie.speculative_config)
    if mtp.enabled and device != "cpu":
        return {"method": "mtp", "num_speculative_tokens": int(mtp.num_speculative_tokens)}
    return None


def vllm_args(spec: Any, device: str, engine_indices: list[int]) -> VLLMArgs:
    """vLLM's engine arguments, from generator.inference_engine and what the job around the engines needs."""
    t, g, ie = spec.trainer, spec.generator, spec.generator.inference_engine
    lora_rank = int(t.policy.model.lora.rank) if adapter_sync(spec) else 0
    one_gpu = ie.tensor_parallel_size * ie.pipeline_parallel_size == 1
    return VLLMArgs(
        seeds=tuple(seed_for(int(t.seed), 0, i) for i in engine_indices),
        dtype=engine_dtype(spec, device),
        tensor_parallel_size=int(ie.tensor_parallel_size),
        pipeline_parallel_size=int(ie.pipeline_parallel_size),
        # vLLM 0.30's LLM refuses more than 1 (it is one process): then run an engine per data-parallel rank.
        data_parallel_size=int(ie.data_parallel_size),
        enable_expert_parallel=ie.expert_parallel_size > 1,
        gpu_memory_utilization=float(ie.gpu_memory_utilization),
        enforce_eager=bool(ie.enforce_eager),
        enable_prefix_caching=bool(ie.enable_prefix_caching),
        enable_chunked_prefill=bool(ie.enable_chunked_prefill),
        max_num_seqs=int(ie.max_num_seqs),
        max_num_batched_tokens=int(ie.max_num_batched_tokens),
        max_model_len=max_model_len(spec),
        # A one-GPU engine runs its worker in the actor itself ("uni"), on the GPU Ray gave the actor.
        distributed_executor_backend="uni" if one_gpu else str(ie.distributed_executor_backend),
        # Log-probs after penalties, temperature and top-k/top-p/min-p: with those filters off (the default),
        # log_softmax(logits / T), what the trainer computes; vLLM's default (raw) ignores the temperature.
        logprobs_mode="processed_logprobs",
        # The CuMem allocator that lets sleep() hand the GPU to the trainer when both share it (vLLM has no sleep
        # mode on a CPU, and nothing to hand over there).
        enable_sleep_mode=bool(t.placement.colocate_all) and device != "cpu",
        enable_lora=lora_rank > 0,
        max_lora_rank=lora_max_rank(lora_rank) if lora_rank > 0 else 0,
        max_loras=1 if lora_rank > 0 else 0,  # one adapter per engine in spec v1
        fully_sharded_loras=bool(ie.fully_sharded_loras) if lora_rank > 0 else False,
        rope_scaling=dict(g.rope_scaling) if g.rope_scaling else None,
        rope_theta=float(g.rope_theta) if g.rope_theta is not None else None,
        kv_cache_memory_bytes=cpu_kv_cache_bytes(spec, len(engine_indices)) if device == "cpu" else None,
        block_size=CPU_KV_BLOCK_TOKENS if device == "cpu" else None,
        speculative_config=speculative_config(spec, device),
        init_kwargs=dict(ie.engine_init_kwargs or {}),
        enable_return_routed_experts=bool(ie.enable_return_routed_experts),
        # SkyRL's order: the first num_prefill engines prefill, the others decode
        pd_roles=tuple("prefill" if i < int(ie.num_prefill) else "decode" for i in engine_indices)
        if ie.enable_pd
        else (),
        role_init_kwargs={r: dict(getattr(ie, f"{r}_init_kwargs") or {}) for r in ("prefill", "decode")}
        if ie.enable_pd
        else {},
        # The engine core runs in the actor's process: scheduling is deterministic and no serialization stands
        # between the actor and its workers.
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if ie.vllm_v1_disable_multiproc else {},
    )


def weight_sync(spec: Any, device: str) -> WeightSync:
    """How the policy's weights reach the engines after each step.

    "gloo" / "nccl": a broadcast group of policy rank 0 and every engine worker, local or remote (gloo over the host
    network; nccl between GPUs the two sides do not share). "ipc": CUDA IPC buckets, when the fsdp2 policy and local
    engines share GPUs (colocate_all with nccl), where NCCL cannot join two ranks on one GPU. "payload": whole state
    dicts through Ray's object store (local engines) or HTTP bodies (remote ones): for LoRA (only the adapters
    travel), nccl on a CPU run, and a colocated megatron policy. "delta": checkpoint deltas through shared storage
    (weight_sync_backend delta), whatever the device and placement.
    """
    ie, t = spec.generator.inference_engine, spec.trainer
    if ie.weight_sync_backend == "delta":
        return WeightSync(
            transport="delta",
            backend=None,
            override_existing_group=override_update_group(spec),
            delta=delta_sync(ie.delta_weight_sync),
        )
    if adapter_sync(spec):
        transport = "payload"
    elif ie.weight_sync_backend == "gloo":
        transport = "gloo"
    elif device == "cpu":
        transport = "payload"
    elif ie.run_engines_locally and t.placement.colocate_all:
        transport = "ipc" if strategy(spec, "policy") != "megatron" else "payload"
    else:
        transport = "nccl"
    return WeightSync(
        transport=transport,
        backend=transport if transport in ("gloo", "nccl") else None,
        override_existing_group=override_update_group(spec),
        # A bucket larger than any GPU (1 TiB) buys nothing: larger thresholds are that (and stay a finite int).
        ipc_threshold_bytes=int(min(float(ie.weight_transfer_threshold_cuda_ipc_GB) * (1 << 30), float(1 << 40))),
    )


def delta_sync(d: Any) -> DeltaSync:
    """The delta settings; an engine's local copy defaults, as SkyRL's does, to a directory under /tmp named after
    `sync_dir` (so runs publishing elsewhere never share one)."""
    local = d.local_checkpoint_dir
    if local is None:
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(d.sync_dir.rstrip("/")))
        local = f"/tmp/skyrl_delta_checkpoints/{name[:143]}_{hashlib.sha256(d.sync_dir.encode()).hexdigest()[:16]}"
    return DeltaSync(
        sync_dir=d.sync_dir,
        local_checkpoint_dir=local,
        max_file_bytes=int(float(d.max_file_size_in_gb) * (1 << 30)),
        publish_num_workers=d.publish_num_workers,
        cloud_download_workers=d.cloud_download_workers,
    )


def override_update_group(spec: Any) -> bool:
    """Whether an engine still in a weight-update group leaves it for this run's.

    "enable": always; "disable": never (joining fails, naming the group it is in); "auto": for remote engines, as
    SkyRL resolves it: a remote server outlives its runs, so the trainer of a group it is still in is gone once a new
    run starts. Local engines are this run's own, in no group yet.
    """
    ie = spec.generator.inference_engine
    choice = ie.override_existing_update_group
    return choice == "enable" or (choice == "auto" and not ie.run_engines_locally)


def sampling(params: Any) -> Sampling:
    return Sampling(
        max_generate_length=int(params.max_generate_length),
        temperature=float(params.temperature),
        top_p=float(params.top_p),
        top_k=int(params.top_k),
        min_p=float(params.min_p),
        repetition_penalty=float(params.repetition_penalty),
        stop=tuple(params.stop or ()),
        logprobs=params.logprobs is not None,
        additional_kwargs=dict(params.additional_kwargs or {}),
    )
