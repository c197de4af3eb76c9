"""What the runtime has and how it works that the compiler must know too, written once for both sides: the
compiler's rules and memory model read these, the runtime runs by them."""

from __future__ import annotations

from rlc.core.environments import ENVIRONMENTS

# The environment ids (environment.env_class, a row's env_class) the runtime registers with skyrl-gym
# (rlc.runtime.envs.gym), from the one table of built-in environments: skyrl-gym's own, then rlc's; extensions add
# theirs (ext.add_environment). The compiler checks an id against these without importing skyrl-gym (or pandas).
SKYRL_GYM_ENVS = tuple(sorted(env.id for env in ENVIRONMENTS if env.skyrl_gym))
RLC_ENVS = tuple(sorted(env.id for env in ENVIRONMENTS if not env.skyrl_gym))
BUILTIN_ENVS = SKYRL_GYM_ENVS + RLC_ENVS
# The built-in environments that run what the model wrote (rlc.runtime.envs.code, .sql): in the sandbox. An
# extension's environment may too: the compiler counts every environment it does not know among them.
MODEL_CODE_ENVS = tuple(sorted(env.id for env in ENVIRONMENTS if env.runs_model_code))


def runs_model_code(env_class: str) -> bool:
    """Whether an environment runs what the model wrote: the built-in code environments and any extension's."""
    return env_class in MODEL_CODE_ENVS or env_class not in BUILTIN_ENVS


# What an hf engine keeps of a multi-turn step's prompts (their keys and values) for the trajectories' next turn, which
# then runs only its new tokens (rlc.runtime.inference.hf.PromptCache).
MULTI_TURN_PROMPT_CACHE_BYTES = 2 << 30

# The chat templates generator.chat_template names with source: name (rlc.runtime.chat.NAMED_TEMPLATES).
CHAT_TEMPLATE_NAMES = ("qwen3_with_thinking", "qwen3_without_thinking")

# Tokens the trainer scores at a time (rlc.runtime.algorithms.losses.score_tokens): its float32 work space is a few
# [LOGPROB_CHUNK_TOKENS, vocab] blocks (about 0.3 GB each at Qwen's 152k vocabulary) whatever the micro-batch, and the
# memory model counts the same blocks.
# trainer.logprobs_chunk_size (SkyRL's default 1024, null: unchunked) asks for chunks of at most that many tokens:
# rlc's are never longer than LOGPROB_CHUNK_TOKENS (its scorer's work space, which the memory model counts), and as
# long as the setting asks when it asks for fewer. The values are the same either way.
LOGPROB_CHUNK_TOKENS = 512
# The factor of a chunk's logits SkyRL's automatic entropy chunks budget for (vocab_entropy_chunk_size: 0).
ENTROPY_CHUNK_PEAK_FACTOR = 4


def logprob_chunk(logprobs_chunk: int | None) -> int:
    """The tokens scored at a time for trainer.logprobs_chunk_size: it, at most LOGPROB_CHUNK_TOKENS."""
    return LOGPROB_CHUNK_TOKENS if logprobs_chunk is None else max(1, min(int(logprobs_chunk), LOGPROB_CHUNK_TOKENS))


def score_chunk(
    tokens: int,
    logprobs_chunk: int | None,
    entropy_chunk: int | None = None,
    entropy_memory_mb: int = 512,
    local_vocab: int = 0,
    logit_bytes: int = 4,
) -> int:
    """Tokens the trainer scores at a time (rlc.runtime.algorithms.losses.score_tokens) of `tokens`.

    `logprobs_chunk` is trainer.logprobs_chunk_size, within rlc's own bound (`logprob_chunk`). `entropy_chunk`
    (trainer.vocab_entropy_chunk_size, read where the entropy is computed in the same pass under megatron) bounds it
    further: None adds no bound, a positive number is its own bound, 0 sizes it from `entropy_memory_mb`
    (vocab_entropy_chunk_memory_mb) as SkyRL does: the largest power of two of tokens, at most `tokens`, whose
    `local_vocab` logits of `logit_bytes`, times ENTROPY_CHUNK_PEAK_FACTOR, fit in the budget. rlc computes log-probs and entropy in the same
    chunks, so the smaller bound holds for both (either alone gives the same values: only the work space changes).
    """
    chunk = logprob_chunk(logprobs_chunk)
    if entropy_chunk is not None and entropy_chunk > 0:
        chunk = min(chunk, int(entropy_chunk))
    elif entropy_chunk == 0 and local_vocab > 0:
        per_token = local_vocab * logit_bytes * ENTROPY_CHUNK_PEAK_FACTOR
        fit = max(1, min(tokens, (int(entropy_memory_mb) << 20) // per_token))
        chunk = min(chunk, 1 << (fit.bit_length() - 1))
    return max(1, min(chunk, tokens))


# What rlc's Megatron LoRA puts adapters on: each Megatron linear layer of a decoder layer -> the Hugging Face
# projections it fuses (in its output order) and its parallel style. RLC-E510 accepts these names in target_modules.
# in_proj and out_proj are Qwen3.5's Gated DeltaNet layers' (a model without them has nothing there to adapt).
MEGATRON_LORA_LAYERS: dict[str, tuple[tuple[str, ...], str]] = {
    "linear_qkv": (("q_proj", "k_proj", "v_proj"), "column"),
    "linear_proj": (("o_proj",), "row"),
    "linear_fc1": (("gate_proj", "up_proj"), "column"),
    "linear_fc2": (("down_proj",), "row"),
    "in_proj": (("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), "column"),
    "out_proj": (("out_proj",), "row"),
}


def megatron_lora_targets(target_modules: str, exclude_modules: str | None = None) -> list[str]:
    """The Megatron layers (MEGATRON_LORA_LAYERS' keys) that get adapters, from PEFT-style target and exclude
    module names: a layer is chosen by its own name, a projection it fuses, or all-linear."""

    def names(spec: str | None) -> set[str]:
        return {n.strip() for n in (spec or "").replace(",", " ").split() if n.strip()}

    wanted, excluded = names(target_modules), names(exclude_modules)
    out = []
    for layer, (projections, _) in MEGATRON_LORA_LAYERS.items():
        chosen = {p for p in projections if "all-linear" in wanted or p in wanted or layer in wanted} - excluded
        if chosen and layer not in excluded:
            out.append(layer)
    return out


def megatron_lora_projections(target_modules: str, exclude_modules: str | None = None) -> str:
    """The Hugging Face projections that carry Megatron's adapters when they are synced unmerged: every projection
    of each adapted layer (a fused layer's adapter covers all it fuses), as PEFT's target_modules (a string is a
    pattern every module name must match whole)."""
    layers = megatron_lora_targets(target_modules, exclude_modules)
    return r".*\.(" + "|".join(p for layer in layers for p in MEGATRON_LORA_LAYERS[layer][0]) + ")"


# A routed expert's Megatron layer -> the fused Hugging Face parameter (transformers 5's [experts, out, in]) holding
# its weight for every expert: where the engines put each expert's adapters, as PEFT's target_parameters.
MEGATRON_LORA_EXPERT_PARAMETERS = {"linear_fc1": "mlp.experts.gate_up_proj", "linear_fc2": "mlp.experts.down_proj"}


def megatron_lora_expert_parameters(target_modules: str, exclude_modules: str | None = None) -> tuple[str, ...]:
    """The fused expert parameters that carry the routed experts' adapters synced unmerged (a dense model has none
    of them, and PEFT then adapts nothing there)."""
    layers = megatron_lora_targets(target_modules, exclude_modules)
    return tuple(p for layer, p in MEGATRON_LORA_EXPERT_PARAMETERS.items() if layer in layers)


def corrects_off_policy(
    tis_ratio_type: str | None,
    sequence_mask_metric: str | None,
    outlier_low: float | None,
    outlier_high: float | None,
    token_low: float | None,
    token_high: float | None,
    rejection_sampling: list[str] | None = None,
    m2po_threshold: float | None = None,
) -> bool:
    """Whether trainer.algorithm.off_policy_correction changes anything (rlc.runtime.algorithms.off_policy applies
    it): as SkyRL, one outlier bound is enough, but the token mask needs both of its bounds; verl's rejection
    sampling and AReaL's M2PO are two more."""
    return (
        tis_ratio_type is not None
        or sequence_mask_metric is not None
        or outlier_low is not None
        or outlier_high is not None
        or (token_low is not None and token_high is not None)
        or bool(rejection_sampling)
        or m2po_threshold is not None
    )


def off_policy_section_corrects(opc) -> bool:
    """`corrects_off_policy` of a trainer.algorithm.off_policy_correction section."""
    return corrects_off_policy(
        opc.tis_ratio_type,
        opc.sequence_mask_metric,
        opc.outlier_token_is_threshold_low,
        opc.outlier_token_is_threshold_high,
        opc.token_mask_is_threshold_low,
        opc.token_mask_is_threshold_high,
        opc.rejection_sampling,
        opc.m2po_threshold,
    )
