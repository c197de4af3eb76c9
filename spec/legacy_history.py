"""Keys SkyRL's base config carried on branches and releases, beyond the mainline renames in `legacy`.

Each entry says what the key did in SkyRL, when dropping it changes nothing, and which finding it gets when
dropping it would change what runs. Written from the history of SkyRL's `ppo_base_config.yaml` on every
branch we could read (tests/fixtures/skyrl-history holds those versions; tools/skyrl_history.py says how
they were gathered).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Finding codes for history keys (docs/rules.md lists them).
FEATURE = "RLC-E030"  # the value turns on a SkyRL feature rlc does not run
HYDRA_IN_SPEC = "RLC-E031"  # an unknown Hydra default group writes into a spec section
TOKEN_BUDGET = "RLC-E032"  # micro-batches cut by a token budget instead of a sample count
MEMORY_ONLY = "RLC-W030"  # changes memory use or debug output, not the training
HYDRA_OUTSIDE = "RLC-W031"  # an unknown Hydra default group rlc's stages never read
SAFETY_LIMIT = "RLC-W032"  # a wall-clock limit rlc does not enforce (changes only runs that hit it)

# Old names of keys spec v1 has (SkyRL renamed them before the generator.inference_engine move).
RENAMES: dict[str, str] = {
    "generator.use_http_server_inference_engine_client": "generator.inference_engine.enable_http_endpoint",
    "generator.http_server_inference_engine_client_host": "generator.inference_engine.http_endpoint_host",
    "generator.http_server_inference_engine_client_port": "generator.inference_engine.http_endpoint_port",
    # A branch's early name for the off-policy correction block; its sub-keys are checked against the new one.
    "trainer.algorithm.rollout_correction": "trainer.algorithm.off_policy_correction",
}


@dataclass(frozen=True)
class Retired:
    """A key with no spec v1 equivalent."""

    path: str
    reason: str  # what the key did in SkyRL
    harmless: Callable[[Any, Callable[[str], Any]], bool]  # (value, get) -> dropping it changes nothing
    code: str = FEATURE

    @property
    def severity(self) -> str:
        return "warning" if self.code.startswith("RLC-W") else "error"


def _off(value: Any, get: Callable[[str], Any]) -> bool:
    return value is None or value is False or value == 0 or value == {} or value == []


def _block_off(value: Any, get: Callable[[str], Any]) -> bool:
    from rlc.spec.legacy import inert

    return inert(value)


def _unset(value: Any, get: Callable[[str], Any]) -> bool:
    return value is None


def _only_with(flag: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless unless `flag` (read before anything is dropped) is true."""
    return lambda value, get: get(flag) is not True


def _adamw(value: Any, get: Callable[[str], Any]) -> bool:
    return value is None or str(value).lower() in ("adam", "adamw")


def _optimizer_of(role: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    def harmless(value: Any, get: Callable[[str], Any]) -> bool:
        chosen = [get(f"trainer.{role}.optimizer_config.{k}") for k in ("optimizer_type", "optimizer")]
        return not any(isinstance(c, str) and c.lower() == "muon" for c in chosen)

    return harmless


_TOKEN_BUDGET = (
    "cuts micro-batches by a token budget (dynamic batch size); rlc cuts them by "
    "trainer.micro_train_batch_size_per_gpu / micro_forward_batch_size_per_gpu samples"
)

_PROFILER_SCHEDULE = (
    "skip_first",
    "wait",
    "warmup",
    "active",
    "repeat",
    "activities",
    "record_shapes",
    "profile_memory",
    "with_stack",
    "with_flops",
    "with_modules",
    "export_type",
    "use_gzip",
)

RETIRED: list[Retired] = [
    Retired(
        "trainer.min_samples_per_env",
        "minimum samples per environment in hybrid environment sampling",
        _only_with("trainer.use_hybrid_env_sampling"),
    ),
    Retired(
        "trainer.use_hybrid_env_sampling",
        "hybrid environment sampling (a floor of samples per environment in each batch); rlc samples batches uniformly",
        _off,
    ),
    Retired(
        "generator.trajectory_timeout_seconds",
        "a wall-clock limit per trajectory; rlc ends trajectories only at their length and turn limits",
        _off,
        SAFETY_LIMIT,
    ),
    Retired(
        "generator.context_folding",
        "folds (summarises) long multi-turn contexts; rlc's generator keeps the whole conversation",
        _block_off,
    ),
    Retired(
        "reward_inference",
        "a separate reward-model inference service; rlc scores rollouts with environments",
        _block_off,
    ),
    Retired(
        "generator.context_warning_threshold",
        "when to warn the model that its context is filling up (with inject_context_status)",
        _only_with("generator.inject_context_status"),
    ),
    Retired(
        "generator.inject_context_status",
        "injects context-usage messages into multi-turn conversations; rlc's generator does not",
        _off,
    ),
    Retired("trainer.max_token_len_per_gpu", _TOKEN_BUDGET, _unset, TOKEN_BUDGET),
    Retired("trainer.max_token_len_per_gpu_forward", _TOKEN_BUDGET, _unset, TOKEN_BUDGET),
    Retired("trainer.max_token_len_per_gpu_train", _TOKEN_BUDGET, _unset, TOKEN_BUDGET),
    Retired("trainer.algorithm.dro", "the DRO policy loss; not one of rlc's policy losses", _block_off),
    Retired(
        "trainer.loss_chunk_size",
        "computes the loss in chunks of this many tokens to save memory (same result); rlc computes it whole",
        _unset,
        MEMORY_ONLY,
    ),
    Retired("trainer.off_policy", "an off-policy training block; rlc's knobs are trainer.fully_async", _block_off),
    Retired("trainer.replay", "a replay buffer of past rollouts; rlc trains on fresh rollouts only", _block_off),
    Retired("trainer.deterministic", "forces deterministic kernels; rlc does not", _off),
    Retired(
        "generator.retokenize",
        "re-tokenizes generated text before training; rlc trains on the token ids the engine returned",
        _off,
    ),
    Retired(
        "data.env_filter",
        "keeps only the rows of the named environments; rlc trains on every row",
        _block_off,
    ),
    Retired(
        "trainer.dump_training_trajectories",
        "writes each training batch's trajectories to disk (debug output only)",
        _off,
        MEMORY_ONLY,
    ),
    *(
        Retired(
            f"trainer.{role}.optimizer_config.{key}",
            "the optimizer class; rlc trains with AdamW",
            _adamw,
        )
        for role in ("policy", "critic")
        for key in ("optimizer_type", "optimizer")
    ),
    # SkyRL 0.3.0 moved the profiler to trainer.policy.torch_profiler_config (all strategies) and gave it a
    # schedule; `legacy.MOVES` brings the block to the megatron one, whose enable/ranks/save_path spec v1 has.
    *(
        Retired(
            f"trainer.policy.megatron_config.torch_profiler_config.{key}",
            f"torch.profiler's {key} (which steps are traced and what a trace records; debug output only)",
            _only_with("trainer.policy.megatron_config.torch_profiler_config.enable"),
            MEMORY_ONLY,
        )
        for key in _PROFILER_SCHEDULE
    ),
    *(
        Retired(
            f"trainer.{role}.optimizer_config.muon_lr",
            "the Muon optimizer's learning rate (only read when the optimizer is Muon)",
            _optimizer_of(role),
        )
        for role in ("policy", "critic")
    ),
]


def hydra_group(entry: str, known: dict[str, str], sections: set[str]) -> tuple[str, str, str]:
    """(text, severity, code) for one entry of a `defaults:` list."""
    group, _, option = entry.partition(":")
    name, _, package = group.strip().partition("@")
    name = name.strip()
    option = option.strip()
    if name in known:
        return f"{entry} -> {known[name]}", "info", ""
    target = package.strip() or name
    if target.split(".")[0] in sections:
        return (
            f"{entry} -> unknown group: its values land in {target}, which rlc runs; write them out in the "
            "spec (this alters what runs)",
            "error",
            HYDRA_IN_SPEC,
        )
    return (
        f"{entry} -> unknown group: it fills the top-level key {target!r}, which no stage of the base trainer "
        "reads (does not alter what runs)",
        "warning",
        HYDRA_OUTSIDE,
    )
