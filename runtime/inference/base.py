"""What every inference engine shares: the sampling request it takes (`Sampling`, decided by the compiler) and the
completion it returns (`Completion`). The engines (`hf`, `vllm`, `http`'s remote client) build on this module, and
the driver and generator read completions through it; what the driver calls on an engine is written down in
`rlc.runtime.protocols`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlc.core.job import Sampling

__all__ = ["Completion", "Sampling"]


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    # Routing replay (`inference/routes.py`): a (tokens, layers, top_k) tensor of expert ids for the prompt and every
    # generated token but the last, when the engine captures them; else None.
    routed_experts: Any = None
