"""Generator, inference-engine, environment and data sections of spec v1 (SkyRL's names and defaults)."""

from typing import Any

from rlc.core.dataclass import dataclass
from rlc.core.environments import ENVIRONMENTS
from rlc.spec.fields import section, setting

INFERENCE_BACKENDS = ("vllm", "hf")


@dataclass
class SamplingParams:
    max_generate_length: int = setting(1024, "Most tokens generated per trajectory.", minimum=1)
    repetition_penalty: float = setting(1.0, "Repetition penalty (1 disables).", exclusive_minimum=0)
    temperature: float = setting(1.0, "Sampling temperature (0 is greedy).", minimum=0)
    top_p: float = setting(1.0, "Nucleus sampling mass.", exclusive_minimum=0, maximum=1)
    min_p: float = setting(0.0, "Minimum token probability relative to the top token.", minimum=0, maximum=1)
    top_k: int = setting(-1, "Top-k sampling; -1 disables.", minimum=-1)
    logprobs: int | None = setting(1, "Log-probs returned per token: 0 or 1 (the chosen token's).", minimum=0)
    stop: list[str] | None = setting(None, "Stop strings.")
    additional_kwargs: dict[str, Any] | None = setting(
        None, "Extra sampling arguments passed to the engine.", passthrough=True
    )


@dataclass
class ChatTemplateConfig:
    source: str = setting(
        "name",
        "What name_or_path is: name (qwen3_with_thinking, qwen3_without_thinking) or file (a Jinja template).",
        enum=("name", "file"),
    )
    name_or_path: str | None = setting(
        None,
        "A custom chat template; null keeps the tokenizer's. In conversation mode the whole conversation is "
        "templated again every turn and the loss mask is its {% generation %} blocks (no engine log-probs).",
    )


@dataclass
class DeltaWeightSyncConfig:
    sync_dir: str | None = setting(
        None,
        "Where the trainer publishes weight deltas: a path every node sees, s3://bucket/prefix or gs://bucket/prefix.",
    )
    local_checkpoint_dir: str | None = setting(
        None,
        "Each engine's patched copy of the checkpoint (engines of a node share it); null: a directory under "
        "/tmp/skyrl_delta_checkpoints named after sync_dir.",
    )
    publish_staging_dir: str | None = setting(
        None, "SkyRL 0.4: local staging of payload files before a cloud upload (rlc uploads from memory: unused)."
    )
    max_file_size_in_gb: float = setting(
        1.0, "Largest payload file of compressed patches a publish writes.", exclusive_minimum=0
    )
    cloud_download_workers: int = setting(4, "Payload files an engine downloads at once.", minimum=1)
    publish_num_workers: int | None = setting(
        None, "Threads computing and compressing patches on trainer rank 0; null: min(8, CPUs).", minimum=1
    )
    checkpoint_load_format: str = setting(
        "vllm_multi_thread_safetensors",
        "SkyRL 0.4: the vLLM iterator an engine reloads its copy with (rlc's engines read it tensor by tensor: unused).",
        enum=("vllm_multi_thread_safetensors", "vllm_fastsafetensors"),
    )
    multi_thread_safetensors_max_workers: int = setting(
        8, "SkyRL 0.4: threads of vllm_multi_thread_safetensors (unused by rlc's engines).", minimum=1
    )


@dataclass
class InferenceEngineConfig:
    model_dtype: str = setting(
        "bfloat16",
        "Engine weight dtype (weights are cast to it on sync).",
        enum=("bfloat16", "float16", "float32", "auto"),
    )
    run_engines_locally: bool = setting(True, "Start the engines in this Ray cluster (false: use remote servers).")
    num_engines: int = setting(1, "Inference engine replicas; derived from cluster when unset.", minimum=1)
    backend: str = setting(
        "vllm", "Inference engine (hf is the CPU Hugging Face generate engine).", enum=INFERENCE_BACKENDS
    )
    weight_sync_backend: str = setting(
        "nccl",
        "How weights reach the engines: a nccl or gloo broadcast, or delta: checkpoint deltas published to shared "
        "storage (delta_weight_sync), SkyRL 0.4's format.",
        enum=("nccl", "gloo", "delta"),
    )
    fp8_weight_sync_mode: str | None = setting(
        None,
        "SkyRL 0.4: send FP8 weights to the engines (blockwise, mxfp8, auto).",
        enum=("blockwise", "mxfp8", "auto"),
    )
    delta_weight_sync: DeltaWeightSyncConfig | None = setting(
        None, "Where and how delta weight sync publishes (weight_sync_backend: delta); null with any other backend."
    )
    weight_transfer_threshold_cuda_ipc_GB: float = setting(
        1.0, "Batch size in GB of CUDA-IPC weight transfers.", exclusive_minimum=0
    )
    tensor_parallel_size: int = setting(1, "Tensor-parallel size of each engine.", minimum=1)
    pipeline_parallel_size: int = setting(1, "Pipeline-parallel size of each engine.", minimum=1)
    expert_parallel_size: int = setting(1, "Expert-parallel size (spans dp x tp, adds no GPUs).", minimum=1)
    data_parallel_size: int = setting(1, "Data-parallel ranks inside each engine.", minimum=1)
    async_engine: bool = setting(True, "Use the asynchronous engine.")
    vllm_v1_disable_multiproc: bool = setting(True, "Set VLLM_ENABLE_V1_MULTIPROCESSING=0 for reproducibility.")
    enable_prefix_caching: bool = setting(True, "Reuse KV cache across shared prefixes.")
    enable_chunked_prefill: bool = setting(True, "Split long prefills into chunks.")
    max_num_batched_tokens: int = setting(8192, "Most tokens per engine step.", minimum=1)
    enforce_eager: bool = setting(True, "Disable CUDA graphs (stable; false is faster).")
    fully_sharded_loras: bool = setting(False, "Shard LoRA computation across tensor-parallel ranks.")
    enable_ray_prometheus_stats: bool = setting(False, "Export vLLM metrics through Ray's Prometheus logger.")
    gpu_memory_utilization: float = setting(
        0.8, "Share of GPU memory the engine may take.", exclusive_minimum=0, maximum=1
    )
    max_num_seqs: int = setting(1024, "Most sequences per engine step.", minimum=1)
    enable_return_routed_experts: bool = setting(
        False,
        "Routing replay (R3): engines return the experts each token was routed to (with moe_enable_routing_replay).",
    )
    enable_return_sample_support_set: bool = setting(False, "SkyRL 0.4: engines return each token's support set.")
    offload_kv_for_weight_sync: bool = setting(False, "SkyRL 0.4: offload the KV cache during weight sync.")
    use_expandable_segments: bool = setting(
        False, "SkyRL 0.4: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True on the engine processes."
    )
    language_model_only: bool = setting(
        False,
        "SkyRL 0.4: vLLM's language_model_only: serve a multimodal checkpoint (Qwen3.5) without its vision encoder.",
    )
    speculative_config: dict[str, Any] | None = setting(
        None,
        "SkyRL 0.4: vLLM's speculative_config, passed to the vllm engine on GPUs as it is (e.g. {method: ngram, "
        "num_speculative_tokens: 3}, or {method: mtp, ...} for a checkpoint with MTP heads). vLLM verifies each "
        "drafted token against the policy, so samples and log-probs stay the policy's. With trainer.mtp.enabled and "
        "none given, {method: mtp, num_speculative_tokens: trainer.mtp.num_speculative_tokens} on GPUs, the heads "
        "the policy trains synced to the drafter.",
        passthrough=True,
    )
    enable_pd: bool = setting(
        False,
        "SkyRL 0.4: prefill-decode disaggregation: the first num_prefill engines prefill, the others decode, the KV "
        "cache handed over by vLLM's kv_transfer_config (in engine_init_kwargs, or in both role kwargs); rlc routes "
        "each sample through a prefill engine to a decode engine.",
    )
    num_prefill: int = setting(0, "SkyRL 0.4: prefill engines when enable_pd is on.", minimum=0)
    prefill_init_kwargs: dict[str, Any] = setting(
        doc="SkyRL 0.4: vLLM kwargs of the prefill engines, in place of engine_init_kwargs.",
        factory=dict,
        passthrough=True,
    )
    decode_init_kwargs: dict[str, Any] = setting(
        doc="SkyRL 0.4: vLLM kwargs of the decode engines, in place of engine_init_kwargs.",
        factory=dict,
        passthrough=True,
    )
    router_init_kwargs: dict[str, Any] = setting(
        doc="SkyRL 0.4: kwargs of the vllm-router (rlc routes itself: refused).", factory=dict, passthrough=True
    )
    remote_urls: list[str] = setting(doc="host:port of remote engines (run_engines_locally=false).", factory=list)
    enable_http_endpoint: bool = setting(False, "Serve an OpenAI-compatible endpoint in front of the engines.")
    http_endpoint_host: str = setting("127.0.0.1", "Host of the HTTP endpoint.")
    http_endpoint_port: int = setting(8000, "Port of the HTTP endpoint.", minimum=1, maximum=65535)
    served_model_name: str | None = setting(None, "Model name the HTTP endpoint expects; null uses the model path.")
    distributed_executor_backend: str = setting(
        "ray", "vLLM executor: ray (multi-node) or mp (one node).", enum=("ray", "mp")
    )
    engine_init_kwargs: dict[str, Any] = setting(
        doc="Pass-through engine arguments; names must match the engine's.", factory=dict, passthrough=True
    )
    override_existing_update_group: str = setting(
        "auto", "Replace an engine's existing weight-update group (remote engines).", enum=("auto", "enable", "disable")
    )
    external_proxy_url: str | None = setting(None, "Data-plane URL of an external load-balanced router.")
    external_server_urls: list[str] | None = setting(None, "Control-plane URLs of external inference servers.")


@dataclass
class GeneratorConfig:
    inference_engine: InferenceEngineConfig = section(InferenceEngineConfig, "Inference engines.")
    n_samples_per_prompt: int = setting(5, "Samples per prompt (the GRPO group size).", minimum=1)
    batched: bool = setting(
        False,
        "Single-turn only: the whole batch in one generate call, each environment stepped once (no turn loop, "
        "no EOS after stop strings).",
    )
    max_turns: int = setting(
        1,
        "Most turns per trajectory: sample, step the environment, append its observation, repeat until the "
        "environment is done, this many turns, or the context passes max_input_length. Environments get it too.",
        minimum=1,
    )
    max_input_length: int | None = setting(
        None,
        "Most tokens of a trajectory's context before a turn (prompt, turns, observations); a longer one ends "
        "the trajectory (stop reason length). Derived from trainer.max_prompt_length.",
        minimum=1,
    )
    chat_template: ChatTemplateConfig = section(ChatTemplateConfig, "Chat template.")
    chat_template_kwargs: dict[str, Any] = setting(
        doc="Keyword arguments of every tokenizer.apply_chat_template call (prompts, observations), e.g. "
        "enable_thinking: false.",
        factory=dict,
        passthrough=True,
    )
    sampling_params: SamplingParams = section(SamplingParams, "Sampling during training rollouts.")
    use_conversation_multi_turn: bool = setting(
        True,
        "true: each response and observation is a chat message of its own (an observation is templated as a "
        "user turn plus the next assistant prompt); false: observations continue one assistant message as plain "
        "tokens, a turn's EOS removed.",
    )
    append_eos_token_after_stop_str_in_multi_turn: bool = setting(
        True,
        "In conversation mode with stop strings: a turn ending in a stop string gets the EOS token appended "
        "(outside the loss), so the next message starts cleanly.",
    )
    eval_sampling_params: SamplingParams | None = setting(
        None, "Sampling during evaluation; derived as greedy with the training max_generate_length."
    )
    eval_n_samples_per_prompt: int = setting(1, "Samples per prompt in evaluation.", minimum=1)
    zero_reward_on_non_stop: bool = setting(False, "Give reward 0 to truncated or aborted generations.")
    apply_overlong_filtering: bool = setting(False, "Mask the loss of truncated trajectories (DAPO).")
    rope_scaling: dict[str, Any] | None = setting(
        None, "Engine RoPE scaling; derived from trainer.rope_scaling.", passthrough=True
    )
    rope_theta: float | None = setting(None, "Engine RoPE base; derived from trainer.rope_theta.")
    step_wise_trajectories: bool = setting(
        False,
        "Train on each turn as a row of its own (prompt = the conversation before it, templated again); a "
        "trajectory's rows share its last turn's advantage. Needs conversation mode and grpo or rloo.",
    )
    use_cache_salt: bool = setting(True, "SkyRL 0.4: salt the engines' prefix cache per weight version.")
    vision_language_generator: bool = setting(False, "SkyRL 0.4: generate from image and text prompts.")
    merge_stepwise_output: bool = setting(False, "SkyRL 0.4: merge step-wise trajectories into one.")


@dataclass
class Text2SQLEnvConfig:
    db_path: str = setting(
        "/home/ray/default/sql_data",
        "Directory of the text2sql databases: <db_path>/spider/database/<db_id>/<db_id>.sqlite (bird: "
        "bird/train/train_databases, synsql: SynSQL-2.5M/databases), by each row's data and db_id.",
    )


@dataclass
class GSM8kLLMJudgeEnvConfig:
    model: str = setting("gpt-4o-mini", "Judge model name.")
    base_url: str | None = setting(
        None, "OpenAI-compatible base URL of the judge (null: OpenAI's); the key comes from OPENAI_API_KEY."
    )


@dataclass
class SearchEnvConfig:
    log_requests: bool = setting(False, "Log each retrieval request.")
    search_url: str = setting(
        "http://127.0.0.1:8000/retrieve",
        "Retrieval server the search environment POSTs {query, topk, return_scores} to (SkyRL's retriever API).",
    )
    topk: int = setting(3, "Documents returned per search.", minimum=1)
    timeout: int = setting(
        30, "Seconds one retrieval request may take (a failed one is retried up to 10 times).", minimum=1
    )


@dataclass
class RewardFunctionConfig:
    path: str | None = setting(
        None,
        "Python file of your reward function (env_class reward_function), as verl's custom_reward_function.path; "
        "relative to the directory rlc runs in. It runs in the trainer, not the sandbox: your code, trusted.",
        rlc_only=True,
    )
    name: str = setting(
        "compute_score",
        "The function: compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> a "
        "float, or a dict with the float under 'score'.",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        pattern_hint="write a Python function name, e.g. compute_score",
        rlc_only=True,
    )
    kwargs: dict[str, Any] = setting(
        doc="Keyword arguments added to every call (verl's custom_reward_function.reward_kwargs).",
        factory=dict,
        passthrough=True,
        rlc_only=True,
    )
    experiment_name: str | None = setting(
        None,
        "Added to each row's extra_info as experiment_name, as verl's gdpo reward manager adds its "
        "trainer.experiment_name (a function may read it); null adds nothing.",
        rlc_only=True,
    )
    source: str | None = setting(
        None,
        "The file's text, written into resolved.yaml by the compiler so that every launch target carries it; "
        "leave it unset.",
        rlc_only=True,
    )


@dataclass
class SkyRLGymConfig:
    max_env_workers: int = setting(
        32, "Threads stepping environments in parallel (tool calls, queries, code runs).", minimum=1
    )
    text2sql: Text2SQLEnvConfig = section(Text2SQLEnvConfig, "text2sql environment.")
    llm_as_a_judge: GSM8kLLMJudgeEnvConfig = section(GSM8kLLMJudgeEnvConfig, "LLM-as-a-judge environment.")
    search: SearchEnvConfig = section(SearchEnvConfig, "search environment.")
    reward_function: RewardFunctionConfig = section(
        RewardFunctionConfig, "reward_function environment: rows scored by your own Python function (rlc's)."
    )


SANDBOX_ISOLATION = ("bubblewrap", "unisolated")  # rlc.runtime.envs.sandbox.ISOLATION_LEVELS holds the same


@dataclass
class SandboxConfig:
    isolation: str = setting(
        "bubblewrap",
        "How model-written code (lcb, searchcode's python tool, text2sql's SQL, an extension's code) is isolated: "
        "bubblewrap (a jail: read-only interpreter, private scratch and /tmp, no network, no trainer file, own "
        "PID namespace and uid; the run is refused where the machine cannot give it) or unisolated (limits and a "
        "clean environment only, in the trainer's filesystem, network and uid: for code you trust). docs/sandbox.md.",
        enum=SANDBOX_ISOLATION,
        rlc_only=True,
    )
    memory_mb: int = setting(
        1024,
        "Memory of one sandbox, all its processes together where rlc can make a cgroup, else of each process.",
        minimum=16,
        rlc_only=True,
    )
    max_processes: int = setting(64, "Processes and threads one sandbox may have at once.", minimum=1, rlc_only=True)
    file_mb: int = setting(
        64,
        "The largest file a sandbox may write, and the size of its scratch, /tmp and /dev/shm.",
        minimum=1,
        rlc_only=True,
    )
    output_kb: int = setting(
        1024,
        "Output (stdout and stderr) the trainer reads from one run; the program is killed past it.",
        minimum=1,
        rlc_only=True,
    )
    python_tool_seconds: float = setting(
        10.0,
        "Wall clock of one python tool call (searchcode), as skyrl-gym's tool.",
        exclusive_minimum=0,
        rlc_only=True,
    )


@dataclass
class EnvironmentConfig:
    env_class: str = setting(
        "gsm8k",
        "SkyRL-Gym environment of rows without an env_class column: skyrl-gym's "
        f"({', '.join(env.id for env in ENVIRONMENTS if env.skyrl_gym)}), rlc's "
        f"({', '.join(env.id for env in ENVIRONMENTS if not env.skyrl_gym)}) or an extension's.",
    )
    skyrl_gym: SkyRLGymConfig = section(SkyRLGymConfig, "Settings of the built-in environments.")
    sandbox: SandboxConfig = section(
        SandboxConfig, "Where and under which limits model-written code runs (rlc's; SkyRL has no such section)."
    )


@dataclass
class DataLoaderConfig:
    num_workers: int | None = setting(
        None, "Prompt loader worker processes; rlc loads prompts in the driver (null or 0).", minimum=0
    )
    persistent_workers: bool = setting(False, "Keep loader workers alive across epochs (needs num_workers > 0).")


@dataclass
class DataConfig:
    train_data: list[str] = setting(doc="Training parquet files.", factory=lambda: ["~/data/gsm8k/train.parquet"])
    val_data: list[str] = setting(doc="Validation parquet files.", factory=lambda: ["~/data/gsm8k/validation.parquet"])
    dataloader: DataLoaderConfig = section(DataLoaderConfig, "How prompts are loaded.")
