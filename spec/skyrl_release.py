"""SkyRL's newest release that spec v1 covers field for field, and the defaults v1 keeps differently.

Spec v1 has every field of `skyrl` 0.4.0's `SkyRLTrainConfig` (tests/compiler/test_skyrl_release.py walks the
installed package to prove it). Where 0.4.0 changed a default that v1 already had, v1 keeps its own so a v1
file keeps its meaning; `rlc explain KEY` shows both.
"""

from __future__ import annotations

from typing import Any

SKYRL_RELEASE = "0.4.0"

_CISPO = (
    "v1 keeps the clip range SkyRL had when v1 was fixed, so a CISPO spec trains as before; "
    "set it explicitly to get 0.4.0's"
)

# dotted key -> (SkyRL 0.4.0's default, why v1 keeps its own)
DEFAULT_CHANGES: dict[str, tuple[Any, str]] = {
    "trainer.strategy": ("fsdp", "fsdp is an alias of fsdp2 in rlc; both run FSDP2, v1 names the backend it runs"),
    "trainer.policy.megatron_config.empty_cuda_cache": (
        True,
        "null lets rlc decide: it empties the cache between phases only when training and inference share GPUs",
    ),
    "trainer.ref.megatron_config.empty_cuda_cache": (
        True,
        "null lets rlc decide: it empties the cache between phases only when training and inference share GPUs",
    ),
    "trainer.algorithm.cispo.cispo_eps_clip_low": (1.0, _CISPO),
    "trainer.algorithm.cispo.cispo_eps_clip_high": (4.0, _CISPO),
    "generator.inference_engine.enforce_eager": (
        False,
        "v1 keeps CUDA graphs off (eager): slower, but no graph capture memory and no capture failures",
    ),
    "generator.inference_engine.enable_ray_prometheus_stats": (
        True,
        "v1 keeps the export of vLLM's metrics through Ray's Prometheus logger off unless asked for",
    ),
}


def default_change(key: str) -> str | None:
    """How SkyRL's newest release differs from v1 on `key`'s default, in words; None where they agree."""
    if key not in DEFAULT_CHANGES:
        return None
    import json

    value, why = DEFAULT_CHANGES[key]
    return f"SkyRL {SKYRL_RELEASE} defaults to {json.dumps(value)}; {why}"
