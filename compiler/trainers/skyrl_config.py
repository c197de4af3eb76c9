"""SkyRL 0.4.0's `SkyRLTrainConfig` in spec v1's terms: which spec keys it has, its default of each, and the value a
resolved spec gives each one in SkyRL's spelling.

Spec v1's data/trainer/generator/environment hold every field of SkyRL 0.4.0 under the same dotted key with the same
default, except the defaults `spec/skyrl_release.py` lists (tests/compiler/test_skyrl_release.py walks the installed
release to prove it). So SkyRL's keys are the spec's, less the fields rlc added (`rlc_only`, an extension's) and
the older SkyRL fields 0.4.0 dropped (`DROPPED`, which tests/compiler/test_skyrl_trainer.py holds exact).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from rlc.compiler.roles import get
from rlc.spec import fields as meta
from rlc.spec.model import SpecModel, default_model, to_plain
from rlc.spec.skyrl_release import DEFAULT_CHANGES

SECTIONS = ("data", "trainer", "generator", "environment")  # the spec's part that is SkyRLTrainConfig

_ROPE = (
    "trainer.policy.model_config_kwargs.rope_parameters (trainer.policy.megatron_config.transformer_config_kwargs."
    "rope_parameters under megatron) and generator.inference_engine.engine_init_kwargs.hf_overrides.rope_parameters"
)
_HTTP = "SkyRL 0.4.0 always serves its engines over HTTP, on addresses it picks"
# Spec keys of older SkyRL releases that 0.4.0 no longer has (its from_cli_overrides refuses most by name) -> what
# 0.4.0 has instead, for the refusal's hint.
DROPPED: dict[str, str] = {
    "trainer.rope_scaling": f"use {_ROPE}",
    "trainer.rope_theta": f"use {_ROPE}",
    "generator.rope_scaling": "use generator.inference_engine.engine_init_kwargs.hf_overrides.rope_parameters",
    "generator.rope_theta": "use generator.inference_engine.engine_init_kwargs.hf_overrides.rope_parameters",
    "generator.inference_engine.async_engine": "SkyRL 0.4.0 always runs the asynchronous engine",
    "generator.inference_engine.remote_urls": "use generator.inference_engine.external_server_urls (and "
    "external_proxy_url)",
    "generator.inference_engine.enable_http_endpoint": _HTTP,
    "generator.inference_engine.http_endpoint_host": _HTTP,
    "generator.inference_engine.http_endpoint_port": _HTTP,
    "generator.inference_engine.override_existing_update_group": "SkyRL 0.4.0 manages its weight-update groups itself",
    **{
        f"trainer.{role}.megatron_config.torch_profiler_config.{name}": "use trainer.policy.torch_profiler_config"
        for role in ("policy", "ref")
        for name in ("enable", "ranks", "save_path")
    },
    # 0.4.0's from_cli_overrides still reads it, as its old name of remove_microbatch_padding: skyrl_values folds
    # it in, so it is never refused
    "trainer.use_sample_packing": "use trainer.remove_microbatch_padding",
}
# rlc-only fields that only write what SkyRL's own keys carry: the allocation string sets the placement counts.
WRITES_SKYRL_KEYS = frozenset({"trainer.placement.allocation"})
# Paths rlc expands (`~`, $VARIABLES) on the node and SkyRL takes as written (it expands only its own defaults).
PATH_KEYS = (
    "data.train_data",
    "data.val_data",
    "trainer.ckpt_path",
    "trainer.export_path",
    "trainer.resume_path",
    "trainer.log_path",
)
# Keys the command always carries, default or not: where every role and engine runs, and how many there are.
PLACEMENT_KEYS = (
    "trainer.placement.colocate_all",
    "trainer.placement.colocate_policy_ref",
    *(
        f"trainer.placement.{role}_{n}"
        for role in ("policy", "critic", "ref")
        for n in ("num_nodes", "num_gpus_per_node")
    ),
    *(
        f"generator.inference_engine.{k}"
        for k in (
            "num_engines",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
            "expert_parallel_size",
        )
    ),
)
# What SkyRL 0.4.0 registers: its policy losses and advantage estimators (skyrl.backends.skyrl_train.utils.ppo_utils),
# KL estimators (compute_approx_kl), loss reductions (validate_cfg) and skyrl-gym 0.4.0's environments.
ALGORITHM_NAMES: dict[str, tuple[str, ...]] = {
    "trainer.algorithm.policy_loss_type": (
        "regular",
        "dual_clip",
        "gspo",
        "cispo",
        "rollout_is",
        "clip_cov",
        "kl_cov",
        "sapo",
        "cross_entropy",
        "importance_sampling",
        "dppo",
    ),
    "trainer.algorithm.advantage_estimator": ("gae", "grpo", "rloo", "reinforce++", "maxrl"),
    "trainer.algorithm.kl_estimator_type": ("k1", "k2", "k3", "abs"),
    "trainer.algorithm.loss_reduction": (
        "token_mean",
        "token_mean_legacy",
        "sequence_mean",
        "seq_mean_token_sum_norm",
        "prompt_mean",
    ),
}
SKYRL_GYM_ENVS = ("aime", "gsm8k", "gsm8k_multi_turn", "lcb", "search", "searchcode", "text2sql")


@cache
def _base_model() -> SpecModel:
    """Spec v1 without extensions: what an extension adds is rlc's, never SkyRL's."""
    return SpecModel()


@cache
def skyrl_keys() -> dict[str, Any]:
    """Every leaf key of SkyRL 0.4.0's config (an optional section SkyRL leaves null counts as one) -> SkyRL's
    default, read from a default config as SkyRL builds one (a role's section may default differently from its
    class: the critic's learning rate)."""
    model = _base_model()
    defaults = _leaves(model.to_typed({}), model)
    return {k: DEFAULT_CHANGES[k][0] if k in DEFAULT_CHANGES else v for k, v in defaults if has_key(k)}


def has_key(path: str) -> bool:
    """Whether SkyRL 0.4.0's config has spec key `path` (rlc's own fields and older SkyRL's it dropped excepted)."""
    model = _base_model()
    field = model.lookup(path)
    if field is None or path in DROPPED:
        return False
    parts = path.split(".")
    return not any(
        (model.lookup(".".join(parts[:n])) or field).meta.get(meta.RLC_ONLY) for n in range(1, len(parts) + 1)
    )


def dict_key(path: str) -> str | None:
    """The SkyRL key of a free-form dict field (engine_init_kwargs, ...) that `path` writes into, if any."""
    keys = skyrl_keys()
    parts = path.split(".")
    for n in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:n])
        if head in keys:
            field = _base_model().lookup(head)
            free_form = field is not None and field.section is None and "dict" in str(field.tp).lower()
            return head if free_form else None
    return None


@cache
def lacking_keys() -> tuple[str, ...]:
    """The spec v1 keys SkyRL 0.4.0 lacks whose value `lacking` reads (extensions' keys aside)."""
    model = _base_model()
    return tuple(
        path
        for path in model.paths()
        if path.split(".")[0] in SECTIONS
        and "." in path
        and not has_key(path)
        and path not in WRITES_SKYRL_KEYS
        and path != "trainer.use_sample_packing"
        and (field := model.lookup(path)) is not None
        and field.section is None
    )


def lacking(spec: Any) -> list[tuple[str, Any, Any]]:
    """(key, value, default) of every spec key SkyRL 0.4.0 lacks that the spec sets to a value other than its
    default: rlc's own settings and older SkyRL's. (An extension's fields go with its environment or algorithm,
    which SkyRL's trainer refuses by name, RLC-E641 and RLC-E643; without them nothing reads the fields.)"""
    model = _base_model()
    out = []
    for path in lacking_keys():
        value = get(spec, path)
        field = model.lookup(path)
        default = to_plain(field.default()) if field is not None else None
        if to_plain(value) != default:
            out.append((path, to_plain(value), default))
    return out


def _leaves(spec: Any, model: SpecModel | None = None) -> list[tuple[str, Any]]:
    """(dotted key, plain value) of the spec's data/trainer/generator/environment, sections unfolded (an optional
    section that is null is one leaf), in the spec's order; read key by key, as the rules read a spec."""
    model = model or _model()
    out: list[tuple[str, Any]] = []
    null_sections: list[str] = []
    for path in model.paths():
        field = model.lookup(path)
        if path.split(".")[0] not in SECTIONS or "." not in path or field is None:
            continue
        if any(path.startswith(s + ".") for s in null_sections):
            continue
        value = get(spec, path)
        if field.section is None:
            out.append((path, to_plain(value)))
        elif value is None:
            null_sections.append(path)
            out.append((path, None))
    return out


def _model() -> SpecModel:
    """The spec model with the installed extensions: their fields are read too (and SkyRL has none of them)."""
    return default_model()


def skyrl_values(spec: Any) -> dict[str, Any]:
    """Every SkyRL 0.4.0 key -> the value the resolved spec gives it, as SkyRL spells it; an optional section the
    spec fills -> its leaves. A value SkyRL derives the same way itself (the reference model from the policy's, the
    input length from the prompt length, ...) is left to it: null, its default."""
    keys = skyrl_keys()
    values = {k: v for k, v in _leaves(spec) if k in keys or _within_optional(k, keys)}
    t, g = spec.trainer, spec.generator
    if values.get("trainer.strategy") == "fsdp2":
        values["trainer.strategy"] = "fsdp"  # 0.4.0's name of the same backend (fsdp2 is its deprecated alias)
    values["trainer.remove_microbatch_padding"] = bool(t.remove_microbatch_padding and t.use_sample_packing)
    for key in PATH_KEYS:
        if values[key] != keys[key]:  # SkyRL expands its own defaults, the same paths
            values[key] = _expanded(values[key])
    for role in ("policy", "ref"):
        key = f"trainer.{role}.megatron_config.empty_cuda_cache"
        if values[key] is None:  # null: rlc empties the cache when training and inference share the GPUs
            values[key] = bool(t.placement.colocate_all)
    derived_by_skyrl = {
        "trainer.ref.model.path": t.policy.model.path,
        "generator.max_input_length": t.max_prompt_length,
        "trainer.algorithm.temperature": g.sampling_params.temperature,
        "generator.eval_sampling_params": {
            **to_plain(type(g.sampling_params)()),
            "temperature": 0.0,
            "max_generate_length": g.sampling_params.max_generate_length,
        },
    }
    if t.algorithm.loss_reduction != "seq_mean_token_sum_norm":  # the one reduction that reads it; SkyRL derives none
        derived_by_skyrl["trainer.algorithm.max_seq_len"] = _sum(
            g.max_input_length, g.sampling_params.max_generate_length
        )
    for key, derived in derived_by_skyrl.items():
        if key == "generator.eval_sampling_params":
            section = {k.rsplit(".", 1)[1]: v for k, v in values.items() if k.startswith(key + ".")}
            if section == derived:
                values = {k: v for k, v in values.items() if not k.startswith(key + ".")}
                values[key] = None
        elif values.get(key) == derived:
            values[key] = None
    return values


def _within_optional(path: str, keys: dict[str, Any]) -> bool:
    """A leaf of an optional section (mixed_precision, delta_weight_sync, eval_sampling_params) the spec fills."""
    parts = path.split(".")
    return any(".".join(parts[:n]) in keys and keys[".".join(parts[:n])] is None for n in range(1, len(parts)))


def _sum(a: Any, b: Any) -> Any:
    return a + b if isinstance(a, int) and isinstance(b, int) else None


_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _expanded(value: Any) -> Any:
    """A path as rlc reads it (`~` and $VARIABLES expanded on the node) for SkyRL, which takes it as written: the
    same expansion, as OmegaConf's ${oc.env:...} that SkyRL resolves where it runs."""
    if isinstance(value, list):
        return [_expanded(v) for v in value]
    if not isinstance(value, str):
        return value
    if value == "~" or value.startswith("~/"):
        value = "${oc.env:HOME}" + value[1:]
    return _VARIABLE.sub(lambda m: "${oc.env:" + (m.group(1) or m.group(2)) + "}", value)


def requirement_extras(spec: Any) -> tuple[str, ...]:
    """The extras of `skyrl` the job needs: its training backend (fsdp or megatron, each with vLLM) and the cloud
    storage its paths name."""
    extras = ["megatron" if spec.trainer.strategy == "megatron" else "fsdp"]
    paths = [
        p
        for key in PATH_KEYS
        for p in (lambda v: v if isinstance(v, list) else [v])(to_plain(get(spec, key)))
        if isinstance(p, str)
    ]
    for scheme, extra in (("s3://", "aws"), ("gs://", "gcp"), ("az://", "azure"), ("abfs://", "azure")):
        if any(p.startswith(scheme) for p in paths) and extra not in extras:
            extras.append(extra)
    return tuple(extras)
