"""The assumptions of `rlc plan`'s time and cost estimate (docs/estimate.md): each one printed beside the estimate
and overridable here. They are read by the compiler only; the runtime ignores them."""

from rlc.core.dataclass import dataclass
from rlc.spec.fields import setting


@dataclass
class EstimateConfig:
    gpu_hour_price: float | None = setting(
        None, "Price of one GPU-hour in USD; null takes rlc's dated table for the accelerator.", minimum=0
    )
    dataset_rows: int | None = setting(
        None,
        "Prompts in the training data, to count a whole run's steps (null: trainer.max_training_steps).",
        minimum=1,
    )
    prompt_fill: float = setting(
        0.5,
        "Mean prompt length as a fraction of its limit: generator.max_input_length, or trainer.max_prompt_length "
        "in a multi-turn job (where max_input_length bounds the whole conversation).",
        exclusive_minimum=0,
        maximum=1,
    )
    response_fill: float = setting(
        0.5, "Mean response length (of each turn) as a fraction of max_generate_length.", exclusive_minimum=0, maximum=1
    )
    turns: float | None = setting(
        None,
        "Mean turns of a multi-turn trajectory (generator.max_turns > 1); null: half of max_turns, at least 1.",
        minimum=1,
    )
    observation_tokens: int | None = setting(
        None,
        "Mean tokens an environment's answer adds to a multi-turn context after each turn but the last (its chat "
        "template's wrapping included); null: as many as a turn's response.",
        minimum=0,
    )
    inert_fraction: float | None = setting(
        None,
        "Share of the policy's rows its update leaves out, their loss being exactly zero (a GRPO group whose rewards "
        "are all equal, under a loss weighted by the advantage with no KL or entropy term): a run's "
        "inert_row_fraction. Their training passes are not counted. null: 2/(n+1) for groups of n samples of a "
        "right-or-wrong reward (the chance that n samples agree when a prompt's success rate is unknown), else 0.",
        minimum=0,
        maximum=1,
    )
    train_mfu: float = setting(
        0.35,
        "Share of the accelerator's peak FLOPs reached by training and log-prob forwards.",
        exclusive_minimum=0,
        maximum=1,
    )
    moe_exchange_ms: float = setting(
        6.0,
        "Megatron mixture of experts: fixed cost of one all-to-all token exchange of an expert layer at a "
        "micro-batch's few thousand tokens (the dispatcher waits for its token counts on the host); two a forward, two "
        "a backward, per expert layer and micro-batch. Fitted to SkyRL's Qwen3-30B-A3B job (docs/estimate.md).",
        minimum=0,
    )
    prefill_mfu: float = setting(
        0.5, "Share of the peak FLOPs reached by the engines' prefill.", exclusive_minimum=0, maximum=1
    )
    bandwidth_use: float = setting(
        0.6, "Share of the memory bandwidth reached by the engines' decoding.", exclusive_minimum=0, maximum=1
    )
    peak_tflops: float | None = setting(
        None,
        "Dense 16-bit peak TFLOP/s of one device; null takes rlc's table (CPU: its own profile).",
        exclusive_minimum=0,
    )
    memory_bandwidth_gbs: float | None = setting(
        None, "Memory bandwidth of one device in GB/s; null takes rlc's table.", exclusive_minimum=0
    )
    link_gbs: float | None = setting(
        None,
        "Bandwidth in GB/s of the link weight sync uses; null takes rlc's table for the chosen transport.",
        exclusive_minimum=0,
    )
    decode_step_overhead_ms: float | None = setting(
        None,
        "Fixed cost of one decoding step of an engine (scheduling, kernel launches); null takes the profile's.",
        minimum=0,
    )
    step_overhead_s: float | None = setting(
        None,
        "Fixed cost of one training step (actors, offload and wake-up, rewards); null takes the profile's.",
        minimum=0,
    )
    call_overhead_ms: float | None = setting(
        None,
        "Fixed cost of each call into the workers (generate, a forward, a mini-batch, weight sync): Ray, the batch's "
        "tensors, the optimizer step of a small model; null takes the profile's (0 on a GPU: in step_overhead_s).",
        minimum=0,
    )
