"""What this rlc runtime can execute: a spec value it cannot run yet is refused at compile time.

A compiled spec must never fail on the cluster for lack of an implementation. Values the CPU runtime
lacks are errors. The Megatron strategy is a warning for now:
their launch files are still worth checking, and the runtime stops at start-up, before any model loads.
"""

from __future__ import annotations

from rlc.compiler.rules.base import Context, num, rule
from rlc.core.runtime_facts import BUILTIN_ENVS

ALG = "trainer.algorithm"


def _extension_envs() -> set[str]:
    from rlc.spec.model import default_model

    return {p.rsplit(".", 1)[1] for p in default_model().extensions.sections if p.startswith("environment.")}


@rule("RLC-E902", "the runtime has this environment", "environment.env_class")
def environment_exists(c: Context):
    if c.s.environment.env_class not in BUILTIN_ENVS and c.s.environment.env_class not in _extension_envs():
        yield c.error(
            "RLC-E902",
            "environment.env_class",
            f"environment {c.s.environment.env_class!r} is not one this rlc runtime has",
            f"use one of {', '.join(BUILTIN_ENVS)}",
        )


def _unsupported(c: Context):
    """(key, what is set, fix) for every feature the runtime does not execute yet."""
    t, g = c.t, c.s.generator
    checks = [
        ("generator.max_turns", (num(g.max_turns) or 0) > 1, "multi-turn rollouts"),
        ("generator.step_wise_trajectories", g.step_wise_trajectories, "step-wise trajectories"),
        (
            "generator.inference_engine.enable_http_endpoint",
            g.inference_engine.enable_http_endpoint,
            "the HTTP endpoint",
        ),
        ("generator.chat_template.name_or_path", bool(g.chat_template.name_or_path), "a custom chat template"),
        ("trainer.logger", t.logger == "mlflow", "mlflow logging"),
        ("trainer.update_ref_every_epoch", t.update_ref_every_epoch, "refreshing the reference model"),
        ("trainer.rope_scaling", bool(t.rope_scaling), "RoPE scaling overrides"),
        ("trainer.rope_theta", t.rope_theta is not None, "RoPE base overrides"),
        ("trainer.policy.use_torch_compile", t.policy.use_torch_compile, "torch.compile"),
        (
            "trainer.max_tokens_per_microbatch",
            (num(t.max_tokens_per_microbatch) or 0) > 0 and c.megatron,
            "token-budget micro-batches under the megatron strategy (fsdp2 runs them)",
        ),
    ]
    found = [
        (key, what, f"remove {key.rsplit('.', 1)[1]} (or set it back to its default)") for key, on, what in checks if on
    ]
    # rlc's hf engine (local, or served over HTTP by rlc.runtime.inference.http) samples with its own
    # parameters only: extra vLLM sampling arguments would be ignored, so the run would differ from the spec.
    for params in ("sampling_params", "eval_sampling_params"):
        if g.inference_engine.backend == "hf" and getattr(g, params).additional_kwargs:
            found.append(
                (
                    f"generator.{params}.additional_kwargs",
                    "extra sampling arguments on the hf engine",
                    "remove additional_kwargs, or use the vllm engine (generator.inference_engine.backend: vllm)",
                )
            )
    return found


FEATURE_KEYS = (
    "generator.max_turns",
    "generator.step_wise_trajectories",
    "generator.inference_engine.enable_http_endpoint",
    "generator.chat_template.name_or_path",
    "trainer.logger",
    "trainer.update_ref_every_epoch",
    "trainer.rope_scaling",
    "trainer.rope_theta",
    "trainer.policy.use_torch_compile",
    "generator.sampling_params.additional_kwargs",
    "generator.eval_sampling_params.additional_kwargs",
    "generator.inference_engine.backend",
    "trainer.max_tokens_per_microbatch",
    "trainer.strategy",
)


@rule("RLC-E903", "the runtime executes every feature the spec turns on", *FEATURE_KEYS)
def runtime_executes_features(c: Context):
    for key, what, fix in _unsupported(c):
        yield c.error("RLC-E903", key, f"{what} ({key}) is in spec v1 but this rlc runtime cannot run it yet", fix)


RULES = (
    environment_exists,
    runtime_executes_features,
)
