"""Routing replay (R3): the engines return the experts every token was routed to, and the Megatron policy replays
them in its router instead of routing again (`runtime/inference/routes.py`, `runtime/workers/megatron_replay.py`).

SkyRL's validation (`validate_cfg`, `validate_generator_cfg`, its generator's checks) asks for both flags together,
under the megatron strategy, with routes that stay aligned with the tokens the trainer sees; rlc adds that the model
is a mixture of experts, and refuses what its own runtime does not replay yet.
"""

from __future__ import annotations

from typing import Any

from rlc.compiler.rules.base import Context, rule

IE = "generator.inference_engine"
FLAG = f"{IE}.enable_return_routed_experts"
REPLAY = "trainer.{role}.megatron_config.moe_enable_routing_replay"
ROLES = ("policy", "ref")


def _replaying(c: Context) -> list[str]:
    """The Megatron roles that replay routes (their moe_enable_routing_replay is on)."""
    if not c.megatron:
        return []
    return [role for role in ROLES if getattr(c.t, role).megatron_config.moe_enable_routing_replay is True]


@rule(
    "RLC-E535",
    "routing replay (R3): the engines return routed experts (enable_return_routed_experts) exactly when the megatron "
    "policy replays them (megatron_config.moe_enable_routing_replay), as SkyRL's validate_cfg asks",
    FLAG,
    "trainer.strategy",
    "trainer.policy.megatron_config.moe_enable_routing_replay",
    "trainer.ref.megatron_config.moe_enable_routing_replay",
)
def replay_flags_pair(c: Context):
    returned = c.ie.enable_return_routed_experts is True
    replaying = _replaying(c)
    if replaying and not returned:
        key = REPLAY.format(role=replaying[0])
        yield c.error(
            "RLC-E535",
            key,
            f"{key} is on but the engines return no routed experts: R3 replays the routes the engines chose "
            "(R2, replaying routes the trainer recorded itself, rlc does not run)",
            f"set {FLAG}: true, or {key}: false",
            [FLAG],
        )
    if returned and not c.megatron:
        yield c.error(
            "RLC-E535",
            FLAG,
            f"{FLAG} is on under strategy {c.t.strategy}: the routes are replayed by Megatron-Core's router, "
            "which only the megatron strategy has",
            f"set trainer.strategy: megatron (and megatron_config.moe_enable_routing_replay: true), or turn {FLAG} off",
            ["trainer.strategy"],
        )
    elif returned and "policy" not in replaying:
        yield c.error(
            "RLC-E535",
            FLAG,
            f"{FLAG} is on but trainer.policy.megatron_config.moe_enable_routing_replay is off: the engines would "
            "return routes that nothing replays",
            f"set trainer.policy.megatron_config.moe_enable_routing_replay: true, or turn {FLAG} off",
            [REPLAY.format(role="policy")],
        )


@rule(
    "RLC-E536",
    "routing replay (R3): routes stay aligned with the tokens the trainer sees: conversation-mode multi-turn "
    "(use_conversation_multi_turn) and the tokenizer's chat template, as SkyRL's generator asks",
    FLAG,
    "generator.use_conversation_multi_turn",
    "generator.chat_template.name_or_path",
)
def replay_routes_align(c: Context):
    if c.ie.enable_return_routed_experts is not True:
        return
    g = c.s.generator
    if g.use_conversation_multi_turn is False:
        yield c.error(
            "RLC-E536",
            "generator.use_conversation_multi_turn",
            "routing replay with use_conversation_multi_turn off: a turn's response gets an EOS appended that the "
            "engine never ran, and the token before it trains on a route nobody chose",
            "set generator.use_conversation_multi_turn: true, or turn routing replay off",
            [FLAG],
        )
    if g.chat_template.name_or_path:
        yield c.error(
            "RLC-E536",
            "generator.chat_template.name_or_path",
            "routing replay with a custom chat template: the conversation is templated again after each turn, so "
            "the tokens the trainer sees are not the ones the engine routed",
            "use the tokenizer's own chat template (remove generator.chat_template), or turn routing replay off",
            [FLAG],
        )


def dense(path: Any) -> bool:
    """A model whose config rlc can read (local, cached, embedded or tabled) and that names no routed experts."""
    # deferred: model_size's shape tables, only when a model's shape is checked
    from rlc.compiler.model_size import find_config

    config = find_config(path)[0] if isinstance(path, str) and path else None
    if not config:
        return False  # a model rlc cannot read: what it is is known at start-up, where a dense one is refused
    sections = [config, *(v for v in config.values() if isinstance(v, dict))]  # a multimodal model's text_config
    keys = ("num_experts", "num_local_experts", "n_routed_experts")
    return not any(isinstance(v, int) and v > 0 for s in sections for v in (s.get(k) for k in keys))


@rule(
    "RLC-E537",
    "routing replay (R3) needs a mixture-of-experts model (a readable model config that names routed experts: "
    "num_experts, num_local_experts or n_routed_experts; a model known only at start-up is checked there)",
    FLAG,
    "trainer.policy.model.path",
)
def replay_needs_experts(c: Context):
    if c.ie.enable_return_routed_experts is True and dense(c.t.policy.model.path):
        yield c.error(
            "RLC-E537",
            FLAG,
            f"{c.t.policy.model.path} is a dense model: it has no router whose choices could be replayed",
            f"turn {FLAG} and moe_enable_routing_replay off, or train a mixture-of-experts model",
            ["trainer.policy.model.path"],
        )


@rule(
    "RLC-E538",
    "routing replay in rlc's runtime: engines it starts (hf or vllm; a remote server returns no routes), Megatron's "
    "unfused router (moe_router_fusion bypasses replay), no virtual pipeline stages and no context parallelism",
    FLAG,
    f"{IE}.backend",
    f"{IE}.run_engines_locally",
    "trainer.strategy",
    "trainer.policy.megatron_config.moe_enable_routing_replay",
    "trainer.ref.megatron_config.moe_enable_routing_replay",
    "trainer.policy.megatron_config.transformer_config_kwargs",
    "trainer.ref.megatron_config.transformer_config_kwargs",
    "trainer.policy.megatron_config.context_parallel_size",
    "trainer.ref.megatron_config.context_parallel_size",
)
def replay_runs_here(c: Context):
    ie = c.ie
    if ie.enable_return_routed_experts is True and (ie.backend == "remote" or not ie.run_engines_locally):
        yield c.error(
            "RLC-E538",
            FLAG,
            "routing replay with engines rlc does not start: an OpenAI-compatible server answers without the "
            "routed experts",
            f"run the engines in the job ({IE}.run_engines_locally: true, backend hf or vllm)",
            [f"{IE}.backend", f"{IE}.run_engines_locally"],
        )
    for role in _replaying(c):
        mc = getattr(c.t, role).megatron_config
        kwargs = mc.transformer_config_kwargs if isinstance(mc.transformer_config_kwargs, dict) else {}
        base = f"trainer.{role}.megatron_config"
        if kwargs.get("moe_router_fusion"):
            yield c.error(
                "RLC-E538",
                f"{base}.transformer_config_kwargs",
                "routing replay with moe_router_fusion: the fused top-k returns before the router consults the "
                "replayed routes, so training would route anew",
                "remove moe_router_fusion from transformer_config_kwargs",
                [REPLAY.format(role=role)],
            )
        vp = kwargs.get("virtual_pipeline_model_parallel_size")
        if isinstance(vp, int) and vp > 1:
            yield c.error(
                "RLC-E538",
                f"{base}.transformer_config_kwargs",
                f"routing replay with {vp} virtual pipeline stages: interleaved chunks take the recomputed "
                "routes out of Megatron's replay queue in another order than they were put in",
                "remove virtual_pipeline_model_parallel_size",
                [REPLAY.format(role=role)],
            )
        cp = mc.context_parallel_size
        if isinstance(cp, int) and cp > 1:
            yield c.error(
                "RLC-E538",
                f"{base}.context_parallel_size",
                f"routing replay with context_parallel_size {cp}: rlc's Megatron worker does not split the routes "
                "over context-parallel ranks yet",
                f"set {base}.context_parallel_size: 1, or turn routing replay off",
                [REPLAY.format(role=role)],
            )


RULES = (replay_flags_pair, replay_routes_align, replay_needs_experts, replay_runs_here)
