"""Migration step legacy -> 1: SkyRL's flat-key YAML (any historical shape) to spec v1.

Written from SkyRL's history of renamed keys, not from particular files: every
rule below names a key shape, so versions we never saw migrate too. The step is a pure function on the
round-trip document (it edits the tree in place and returns the list of changes it made); comments,
key order and formatting of everything it does not touch stay as they were.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import field
from functools import lru_cache
from typing import Any

from rlc.compiler.importers.base import Change, show_value
from rlc.compiler.importers.skyrl import history as legacy_history
from rlc.compiler.importers.skyrl.history import inert
from rlc.core.algorithms import SEQUENCE_RATIO_LOSS
from rlc.core.dataclass import dataclass
from rlc.spec.model import SpecModel
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import CommentMark
from ruamel.yaml.tokens import CommentToken

# Flat generator.* engine keys that moved under generator.inference_engine (2026-02-25), with renames.
ENGINE_KEYS = {
    "model_dtype": "model_dtype",
    "run_engines_locally": "run_engines_locally",
    "num_inference_engines": "num_engines",
    "backend": "backend",
    "weight_sync_backend": "weight_sync_backend",
    "weight_transfer_threshold_cuda_ipc_GB": "weight_transfer_threshold_cuda_ipc_GB",
    "inference_engine_tensor_parallel_size": "tensor_parallel_size",
    "inference_engine_pipeline_parallel_size": "pipeline_parallel_size",
    "inference_engine_expert_parallel_size": "expert_parallel_size",
    "inference_engine_data_parallel_size": "data_parallel_size",
    "async_engine": "async_engine",
    "vllm_v1_disable_multiproc": "vllm_v1_disable_multiproc",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "enforce_eager": "enforce_eager",
    "fully_sharded_loras": "fully_sharded_loras",
    "enable_ray_prometheus_stats": "enable_ray_prometheus_stats",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "max_num_seqs": "max_num_seqs",
    "remote_inference_engine_urls": "remote_urls",
    "enable_http_endpoint": "enable_http_endpoint",
    "http_endpoint_host": "http_endpoint_host",
    "http_endpoint_port": "http_endpoint_port",
    "served_model_name": "served_model_name",
    "engine_init_kwargs": "engine_init_kwargs",
    "override_existing_update_group": "override_existing_update_group",
    "external_proxy_url": "external_proxy_url",
    "external_server_urls": "external_server_urls",
    "distributed_executor_backend": "distributed_executor_backend",
}

# Plain moves and renames: the value is kept as it is.
MOVES: dict[str, str] = {
    "environment.skygym": "environment.skyrl_gym",
    "megatron_config.policy": "trainer.policy.megatron_config",
    "megatron_config.ref": "trainer.ref.megatron_config",
    "trainer.algorithm.ppo_loss_type": "trainer.algorithm.policy_loss_type",
    "trainer.algorithm.cispo.clip_low": "trainer.algorithm.cispo.cispo_eps_clip_low",
    "trainer.algorithm.cispo.clip_high": "trainer.algorithm.cispo.cispo_eps_clip_high",
    "trainer.step_wise_training": "generator.step_wise_trajectories",
    "trainer.remove_microbatch_padding": "trainer.use_sample_packing",
    "trainer.policy.torch_profiler_config": "trainer.policy.megatron_config.torch_profiler_config",
    "trainer.algorithm.kl_target": "trainer.algorithm.kl_ctrl.kl_target",
    "trainer.algorithm.norm_adv_by_std_in_grpo": "trainer.algorithm.grpo_norm_by_std",
    "trainer.algorithm.ppo_loss_reduction_type": "trainer.algorithm.loss_reduction",
    "trainer.algorithm.tau_pos": "trainer.algorithm.sapo.tau_pos",
    "trainer.algorithm.tau_neg": "trainer.algorithm.sapo.tau_neg",
    "trainer.algorithm.dynamic_sampling.max_resample_batches": "trainer.algorithm.dynamic_sampling.max_sample_batches",
    "generator.step_wise_training": "generator.step_wise_trajectories",
    "generator.max_env_workers": "environment.skyrl_gym.max_env_workers",
    "environment.max_env_workers": "environment.skyrl_gym.max_env_workers",
    "generator.weight_transfer_threshold_cuda_ipc_in_GB": "generator.inference_engine.weight_transfer_threshold_cuda_ipc_GB",
    "generator.vllm_engine_kwargs": "generator.inference_engine.engine_init_kwargs",
    **{
        f"trainer.{role}.model.lora_{k}": f"trainer.{role}.model.lora.{k}"
        for role in ("policy", "critic")
        for k in ("rank", "alpha", "dropout")
    },
    **{f"generator.{old}": f"generator.inference_engine.{new}" for old, new in ENGINE_KEYS.items()},
    **legacy_history.RENAMES,
}

# One legacy value copied to several new keys.
SPLITS: dict[str, tuple[str, ...]] = {
    "trainer.num_warmup_steps": (
        "trainer.policy.optimizer_config.num_warmup_steps",
        "trainer.critic.optimizer_config.num_warmup_steps",
    ),
    "trainer.target_modules": ("trainer.policy.model.lora.target_modules", "trainer.critic.model.lora.target_modules"),
    "trainer.exclude_modules": (
        "trainer.policy.model.lora.exclude_modules",
        "trainer.critic.model.lora.exclude_modules",
    ),
}

_ALTERS = "its value changes what runs"
_REWARD_MODEL = "a reward model (removed upstream 2025-10; rlc scores rollouts with environments)"


def _no_reward_model(data) -> bool:
    return _get(data, "trainer.reward.model.path") in (None, _MISSING)


# Keys removed without a successor. The predicate says when dropping the value changes nothing.
DROPS: list[tuple[str, str, Callable[[Any, Any], bool]]] = [
    (
        "deepspeed_config",
        "DeepSpeed is not supported by rlc (removed upstream 2026-01)",
        lambda v, d: _get(d, "trainer.strategy") != "deepspeed",
    ),
    (
        "trainer.policy.deepspeed_config",
        "DeepSpeed is not supported by rlc",
        lambda v, d: _get(d, "trainer.strategy") != "deepspeed",
    ),
    (
        "trainer.critic.deepspeed_config",
        "DeepSpeed is not supported by rlc",
        lambda v, d: _get(d, "trainer.strategy") != "deepspeed",
    ),
    (
        "trainer.ref.deepspeed_config",
        "DeepSpeed is not supported by rlc",
        lambda v, d: _get(d, "trainer.strategy") != "deepspeed",
    ),
    ("trainer.reward", _REWARD_MODEL, lambda v, d: _no_reward_model(d)),
    ("trainer.placement.colocate_critic_reward", _REWARD_MODEL, lambda v, d: _no_reward_model(d)),
    ("trainer.placement.reward_num_nodes", _REWARD_MODEL, lambda v, d: _no_reward_model(d)),
    ("trainer.placement.reward_num_gpus_per_node", _REWARD_MODEL, lambda v, d: _no_reward_model(d)),
    ("trainer.use_orm_score", _REWARD_MODEL, lambda v, d: not v),
    ("trainer.algorithm.normalize_reward", _REWARD_MODEL, lambda v, d: _no_reward_model(d)),
    ("trainer.rope_parameters", "added and reverted upstream the same day", lambda v, d: inert(v)),
    ("generator.rope_parameters", "added and reverted upstream the same day", lambda v, d: inert(v)),
    ("trainer.log_example_interval", "rlc logs no example rollouts to the console (metrics only)", lambda v, d: True),
    ("trainer.print_example_interval", "rlc logs no example rollouts to the console (metrics only)", lambda v, d: True),
    ("generator.merge_stepwise_output", "merging step-wise outputs is not part of spec v1", lambda v, d: not v),
    ("generator.inference_engine.router_type", "removed upstream; a router is always used", lambda v, d: True),
    ("trainer.policy.model.lora.max_loras", "one adapter per engine in spec v1", lambda v, d: v in (None, 1)),
    ("trainer.policy.model.lora.max_cpu_loras", "one adapter per engine in spec v1", lambda v, d: v is None),
    ("trainer.critic.model.lora.max_loras", "one adapter per engine in spec v1", lambda v, d: v in (None, 1)),
    ("trainer.critic.model.lora.max_cpu_loras", "one adapter per engine in spec v1", lambda v, d: v is None),
]

HYDRA_GROUPS = {
    "deepspeed_config": "DeepSpeed configs (dropped: rlc does not run DeepSpeed)",
    "megatron_config": "Megatron defaults (now the defaults of trainer.{policy,ref}.megatron_config)",
    "skyrl_gym_config": "environment defaults (now the defaults of environment.skyrl_gym)",
    "skygym_config": "environment defaults (now the defaults of environment.skyrl_gym)",
}

SPEC_SECTIONS = {"data", "trainer", "generator", "environment"}

REF = re.compile(r"\$\{([^{}:]+)\}")


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


# -- tree helpers (round-trip maps) ---------------------------------------------------------------------


def _get(data, path: str) -> Any:
    node = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _line_of(parent, key) -> int:
    try:
        return parent.lc.key(key)[0] + 1
    except Exception:
        return 0


def _pop(data, path: str, moving: bool = False) -> tuple[Any, int, Any]:
    """Remove `path`; return (value, line, its end-of-line comment) or (_MISSING, 0, None).

    Comment lines written below the key belong to the key after it; they stay where they were.
    """
    *head, last = path.split(".")
    parent = _get(data, ".".join(head)) if head else data
    if not isinstance(parent, dict) or last not in parent:
        return _MISSING, 0, None
    line = _line_of(parent, last)
    keys = list(parent)
    prev = keys[keys.index(last) - 1] if keys.index(last) > 0 else None
    entry = parent.ca.items.pop(last, None) if hasattr(parent, "ca") else None
    value = parent.pop(last)
    eol, pre = None, entry[1] if entry and len(entry) > 1 else None
    if entry and len(entry) > 2 and entry[2] is not None:
        first, _, rest = entry[2].value.partition("\n")
        if first.strip():
            eol = _comment(first + "\n", entry[2].column)
        if rest.strip():
            _keep_comment(parent, prev, rest)
    if not moving and isinstance(value, dict) and value:
        tail = _trailing_lines(value)  # comment lines after a dropped block belong to the key after it
        if tail:
            _keep_comment(parent, prev, tail)
    if pre and not moving:  # comment lines above a dropped key stay in the file
        _keep_comment(parent, prev, "".join(t.value for t in pre if t is not None))
        pre = None
    eol_comment = [None, pre, eol, None] if (eol is not None or pre) else None
    if head and isinstance(parent, dict) and not parent:
        _pop(data, ".".join(head))  # a section left empty goes too
    return value, line, eol_comment


def _trailing_lines(block) -> str:
    """Comment lines hung after the last key of a nested block (they precede the block's next sibling)."""
    node = block
    while isinstance(node, dict) and node:
        key = list(node)[-1]
        if isinstance(node[key], dict) and node[key]:
            node = node[key]
            continue
        entry = node.ca.items.get(key) if hasattr(node, "ca") else None
        if entry and len(entry) > 2 and entry[2] is not None:
            _, _, rest = entry[2].value.partition("\n")
            return rest if rest.strip() else ""
        return ""
    return ""


def _comment(text: str, column: int = 0):
    return CommentToken(text, CommentMark(column), None)


def _keep_comment(parent, prev, lines: str) -> None:
    """Hang comment lines after `prev` (the deepest last key under it), so they print where they were."""
    if prev is None:
        return
    node, key = parent, prev
    while isinstance(node[key], dict) and len(node[key]) and hasattr(node[key], "ca"):
        node, key = node[key], list(node[key])[-1]
    entry = node.ca.items.setdefault(key, [None, None, None, None])
    while len(entry) < 4:
        entry.append(None)
    if entry[2] is None:
        entry[2] = _comment("\n" + lines)
    else:
        entry[2].value = entry[2].value + lines


def _ensure_map(data, path: str, anchor: tuple | None = None):
    """The map at `path`, created (after `anchor` = (parent_path, sibling_key) when given) if absent."""
    node = data
    parts = path.split(".") if path else []
    for i, part in enumerate(parts):
        child = node.get(part) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            child = CommentedMap()
            if (
                anchor is not None
                and anchor[0] == ".".join(parts[:i])
                and anchor[1] in node
                and hasattr(node, "insert")
            ):
                node.insert(list(node).index(anchor[1]), part, child)
            else:
                node[part] = child
        node = child
    return node


def _put(data, path: str, value: Any, comment: Any = None) -> None:
    *head, last = path.split(".")
    parent = _ensure_map(data, ".".join(head))
    if last in parent and isinstance(parent[last], dict) and isinstance(value, dict):
        for k, v in value.items():  # merge a moved section into an existing one
            parent[last].setdefault(k, v)
    else:
        parent[last] = value
    if comment is not None and hasattr(parent, "ca"):
        parent.ca.items[last] = comment


# -- the step -------------------------------------------------------------------------------------------


@dataclass
class _Step:
    data: Any
    changes: list[Change] = field(default_factory=list)

    def move(self, old: str, new: str) -> None:
        if _get(self.data, old) is _MISSING:
            return
        *ohead, olast = old.split(".")
        nparent = new.rsplit(".", 1)[0]
        existing = _get(self.data, new)
        if isinstance(existing, str) and existing.strip() == "${" + old + "}":
            _pop(self.data, new)  # the new key only pointed at the old one (Hydra-era indirection)
            existing = _MISSING
        # A section created by the move takes the place of the first key moved into it.
        _ensure_map(self.data, nparent, anchor=(".".join(ohead), olast))
        value, line, comment = _pop(self.data, old, moving=True)
        if old == "trainer.algorithm.kl_target" and value is None:
            self.changes.append(Change("dropped", old, None, line, value, reason="null meant the default target"))
            return
        if existing is not _MISSING and not (isinstance(existing, dict) and isinstance(value, dict)):
            same = existing == value
            self.changes.append(
                Change(
                    "dropped",
                    old,
                    new,
                    line,
                    value,
                    severity="info" if same else "warning",
                    reason=f"same value as {new}"
                    if same
                    else f"{new} is also set ({show_value(existing)}); the newer key wins",
                )
            )
            return
        _put(self.data, new, value, comment)
        self.changes.append(Change("moved", old, new, line, value, value))

    def run(self) -> list[Change]:
        self.hydra_defaults()
        self.hydra_references()
        self.strategy()
        self.importance_sampling_level()
        self.get_logprobs()
        for old, news in SPLITS.items():
            self.split(old, news)
        self.kl_estimator()
        self.init_kl_coef()
        self.tis()
        self.token_budget()
        self.model_name()
        for old, new in MOVES.items():
            self.move(old, new)
        self.respelled_values()
        self.engine_sampling()
        self.drops()
        self.retired()
        self.references()
        self.unknown_inert()
        self.wandb_secret()
        return self.changes

    def respelled_values(self) -> None:
        """Values SkyRL spelled otherwise on the way to spec v1 (legacy_history.VALUES), written as spec v1 does."""
        for path, spelled in legacy_history.VALUES.items():
            value = _get(self.data, path)
            if not isinstance(value, str) or value not in spelled:
                continue
            *head, last = path.split(".")
            parent = _get(self.data, ".".join(head))
            parent[last] = spelled[value]
            self.changes.append(
                Change(
                    "transformed",
                    path,
                    path,
                    _line_of(parent, last),
                    value,
                    spelled[value],
                    reason="the same setting as spec v1 spells it",
                )
            )

    def wandb_secret(self) -> None:
        """SkyRL logs to wandb unless told otherwise, reading WANDB_API_KEY from the environment: the spec names it in
        launch.secrets, so the launch files pass it on (by name; the value never reaches a file)."""
        logger = _get(self.data, "trainer.logger")
        if not (logger is _MISSING or logger is None or logger == "wandb"):
            return  # another logger, or a ${...} reference resolved elsewhere
        secrets = _get(self.data, "launch.secrets")
        if isinstance(secrets, list) and "WANDB_API_KEY" in secrets:
            return
        if secrets is _MISSING or secrets is None:
            _put(self.data, "launch.secrets", ["WANDB_API_KEY"])
        elif isinstance(secrets, list):
            secrets.append("WANDB_API_KEY")
        else:
            return  # not a list: validation says so at the key
        why = "SkyRL's default" if logger is _MISSING or logger is None else "trainer.logger"
        self.changes.append(
            Change(
                "added",
                None,
                "launch.secrets",
                0,
                None,
                ["WANDB_API_KEY"],
                reason=f"the run logs to wandb ({why}), which reads WANDB_API_KEY; named here, its value stays on "
                "your machine",
            )
        )

    def hydra_references(self) -> None:
        """Keys that only pointed at a Hydra group (`x: ${megatron_config.policy}`) go: rlc's defaults apply."""
        known_tops = {"data", "trainer", "generator", "environment"}

        def visit(node, path: str) -> None:
            for key, value in list(node.items()):
                where = f"{path}.{key}" if path else str(key)
                m = REF.fullmatch(value.strip()) if isinstance(value, str) else None
                if m and m.group(1).split(".")[0] not in known_tops and _get(self.data, m.group(1)) is _MISSING:
                    line = _line_of(node, key)
                    _pop(self.data, where)
                    self.changes.append(
                        Change(
                            "dropped",
                            where,
                            None,
                            line,
                            value,
                            reason=f"pointed at the Hydra default group {m.group(1)}; rlc's built-in defaults apply",
                        )
                    )
                elif isinstance(value, dict):
                    visit(value, where)

        visit(self.data, "")

    def importance_sampling_level(self) -> None:
        value, line, _ = _pop(self.data, "trainer.algorithm.importance_sampling_level")
        if value is _MISSING:
            return
        loss = _get(self.data, "trainer.algorithm.policy_loss_type")
        if value == "sequence" and loss in (_MISSING, "regular"):
            _ensure_map(self.data, "trainer.algorithm")["policy_loss_type"] = SEQUENCE_RATIO_LOSS
            self.changes.append(
                Change(
                    "transformed",
                    "trainer.algorithm.importance_sampling_level",
                    "trainer.algorithm.policy_loss_type",
                    line,
                    value,
                    SEQUENCE_RATIO_LOSS,
                    reason=f"sequence-level importance sampling is the {SEQUENCE_RATIO_LOSS} loss",
                )
            )
        else:
            self.changes.append(
                Change(
                    "dropped",
                    "trainer.algorithm.importance_sampling_level",
                    None,
                    line,
                    value,
                    reason="token-level importance sampling is what the policy losses do",
                    severity="info" if value == "token" else "error",
                )
            )

    def get_logprobs(self) -> None:
        for section in ("generator.sampling_params", "generator.eval_sampling_params"):
            value, line, _ = _pop(self.data, f"{section}.get_logprobs")
            if value is _MISSING:
                continue
            if _get(self.data, f"{section}.logprobs") is not _MISSING:
                self.changes.append(
                    Change(
                        "dropped",
                        f"{section}.get_logprobs",
                        None,
                        line,
                        value,
                        reason=f"{section}.logprobs is set and decides",
                    )
                )
                continue
            new = 1 if value else None
            _ensure_map(self.data, section)["logprobs"] = new
            self.changes.append(
                Change(
                    "transformed",
                    f"{section}.get_logprobs",
                    f"{section}.logprobs",
                    line,
                    value,
                    new,
                    reason="the flag became the number of log-probs returned",
                )
            )

    def unknown_inert(self) -> None:
        """Keys spec v1 does not know whose values turn nothing on are dropped; others stay for validation to report."""
        import difflib  # deferred: difflib, only for a key spec v1 does not know (start-up, as in validate.py)

        model = _v1_model()

        def visit(node, path: str) -> None:
            for key, value in list(node.items()):
                where = f"{path}.{key}" if path else str(key)
                spec = model.lookup(where)
                if spec is None:
                    siblings = [
                        p.rsplit(".", 1)[-1]
                        for p in model.paths()
                        if p.rsplit(".", 1)[0] == path or ("." not in p and not path)
                    ]
                    typo = difflib.get_close_matches(str(key), siblings, n=1, cutoff=0.8)
                    parent_known = not path or model.lookup(path) is not None
                    if parent_known and inert(value) and not typo:
                        line = _line_of(node, key)
                        _pop(self.data, where)
                        self.changes.append(
                            Change(
                                "dropped", where, None, line, value, reason="not in spec v1; its value turns nothing on"
                            )
                        )
                elif spec.section is not None and isinstance(value, dict):
                    visit(value, where)

        visit(self.data, "")

    def hydra_defaults(self) -> None:
        if "defaults" not in self.data:
            return
        line = _line_of(self.data, "defaults")
        entries = self.data.pop("defaults")
        known: list[tuple[str, str, str, str]] = []
        unknown: list[tuple[str, str, str, str]] = []
        for entry in entries if isinstance(entries, list) else [entries]:
            text = (
                entry
                if isinstance(entry, str)
                else ", ".join(f"{k}: {v}" for k, v in dict(entry).items())
                if isinstance(entry, dict)
                else str(entry)
            )
            if text == "_self_":
                continue
            said, severity, code = legacy_history.hydra_group(text, HYDRA_GROUPS, SPEC_SECTIONS)
            (unknown if code else known).append((said, severity, code, text))
        self.changes.append(
            Change(
                "defaults",
                "defaults",
                None,
                line,
                reason="; ".join(k[0] for k in known)
                or ("only _self_" if not unknown else "groups rlc does not know:"),
            )
        )
        for said, severity, code, text in unknown:
            self.changes.append(Change("defaults", "defaults", None, line, reason=said, severity=severity, code=code))
            top = text.split(":")[0].split("@")[-1].strip()
            if code == legacy_history.HYDRA_OUTSIDE and top in self.data:
                value, top_line, _ = _pop(self.data, top)
                self.changes.append(
                    Change(
                        "dropped",
                        top,
                        None,
                        top_line,
                        value,
                        reason=f"filled by the Hydra group {text}; no stage of the base trainer reads it",
                        severity="warning",
                        code=code,
                    )
                )

    def strategy(self) -> None:
        value = _get(self.data, "trainer.strategy")
        if value == "deepspeed":
            parent = self.data["trainer"]
            parent["strategy"] = "fsdp2"
            self.changes.append(
                Change(
                    "transformed",
                    "trainer.strategy",
                    "trainer.strategy",
                    _line_of(parent, "strategy"),
                    value,
                    "fsdp2",
                    reason="DeepSpeed is not supported by rlc; review the FSDP settings",
                    severity="error",
                )
            )

    def split(self, old: str, news: tuple[str, ...]) -> None:
        value, line, _ = _pop(self.data, old)
        if value is _MISSING:
            return
        if value is None and old != "trainer.num_warmup_steps":
            self.changes.append(
                Change("dropped", old, None, line, value, reason="null (the per-model default applies)")
            )
            return
        for new in news:
            if _get(self.data, new) is _MISSING:
                _put(self.data, new, value)
                self.changes.append(Change("moved", old, new, line, value, value))
            else:
                self.changes.append(Change("dropped", old, new, line, value, reason=f"{new} is already set; it wins"))

    def kl_estimator(self) -> None:
        k3, line3, _ = _pop(self.data, "trainer.algorithm.use_kl_estimator_k3")
        abs_, line_abs, _ = _pop(self.data, "trainer.algorithm.use_abs_kl")
        if k3 is _MISSING and abs_ is _MISSING:
            return
        current = _get(self.data, "trainer.algorithm.kl_estimator_type")
        if abs_ is True:
            new = "abs"
        elif k3 is True:
            new = "k3"
        elif current is not _MISSING:
            new = None  # the flags were false overrides kept next to kl_estimator_type: it decides
        else:
            new = "k1"  # before kl_estimator_type existed, both flags false meant the plain log-ratio
        target = "trainer.algorithm.kl_estimator_type"
        if new is not None:
            _ensure_map(self.data, "trainer.algorithm")["kl_estimator_type"] = new
        for flag, value, line in (("use_kl_estimator_k3", k3, line3), ("use_abs_kl", abs_, line_abs)):
            if value is _MISSING:
                continue
            old = f"trainer.algorithm.{flag}"
            if new is not None and (
                value is True or (abs_ is not True and k3 is not True and flag == "use_kl_estimator_k3")
            ):
                self.changes.append(
                    Change("transformed", old, target, line, value, new, reason="the estimator flags became one enum")
                )
            else:
                decided = new if new is not None else current
                self.changes.append(
                    Change(
                        "dropped",
                        old,
                        target,
                        line,
                        value,
                        reason=f"{show_value(value)}; kl_estimator_type ({decided}) decides",
                    )
                )

    def init_kl_coef(self) -> None:
        value, line, _ = _pop(self.data, "trainer.algorithm.init_kl_coef")
        if value is _MISSING:
            return
        in_reward = _get(self.data, "trainer.algorithm.use_kl_in_reward") is True
        if in_reward and value != _get(self.data, "trainer.algorithm.kl_loss_coef"):
            _ensure_map(self.data, "trainer.algorithm")["kl_loss_coef"] = value
            self.changes.append(
                Change(
                    "transformed",
                    "trainer.algorithm.init_kl_coef",
                    "trainer.algorithm.kl_loss_coef",
                    line,
                    value,
                    value,
                    reason="kl_loss_coef is now the initial KL-in-reward coefficient",
                )
            )
        else:
            self.changes.append(
                Change(
                    "dropped",
                    "trainer.algorithm.init_kl_coef",
                    None,
                    line,
                    value,
                    reason="only used with use_kl_in_reward; kl_loss_coef is the initial coefficient now",
                )
            )

    def tis(self) -> None:
        use, line, _ = _pop(self.data, "trainer.algorithm.use_tis")
        cap, cap_line, _ = _pop(self.data, "trainer.algorithm.tis_imp_ratio_cap")
        if use is True:
            opc = _ensure_map(self.data, "trainer.algorithm.off_policy_correction")
            opc["tis_ratio_type"] = "token"
            self.changes.append(
                Change(
                    "transformed",
                    "trainer.algorithm.use_tis",
                    "trainer.algorithm.off_policy_correction.tis_ratio_type",
                    line,
                    True,
                    "token",
                    reason="deprecated flag replaced by the off_policy_correction block",
                )
            )
            if cap is not _MISSING:
                opc["token_tis_ratio_clip_high"] = cap
                self.changes.append(
                    Change(
                        "moved",
                        "trainer.algorithm.tis_imp_ratio_cap",
                        "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high",
                        cap_line,
                        cap,
                        cap,
                    )
                )
            return
        if use is not _MISSING:
            self.changes.append(
                Change(
                    "dropped",
                    "trainer.algorithm.use_tis",
                    None,
                    line,
                    use,
                    reason="false: off-policy correction stays off",
                )
            )
        if cap is not _MISSING:
            self.changes.append(
                Change(
                    "dropped",
                    "trainer.algorithm.tis_imp_ratio_cap",
                    None,
                    cap_line,
                    cap,
                    reason="only used with use_tis",
                )
            )

    def token_budget(self) -> None:
        """A SkyRL branch's dynamic batching is SkyRL 0.4's trainer.max_tokens_per_microbatch: with
        `use_dynamic_batching: true` the training budget moves there (rlc's forward passes take it too); with the
        flag off or absent (the branch's default) the budgets turned nothing on."""
        target = "trainer.max_tokens_per_microbatch"
        keys = (legacy_history.DYNAMIC_BATCHING, *legacy_history.TOKEN_BUDGETS, legacy_history.FORWARD_BUDGET)
        found = {k: _pop(self.data, k)[:2] for k in keys}
        present = {k: found[k] for k in keys if found[k][0] is not _MISSING}
        if not present:
            return
        flag, flag_line = found[legacy_history.DYNAMIC_BATCHING]
        if flag is not True:
            for key, (value, line) in present.items():
                reason = (
                    "off: micro-batches keep their sample counts"
                    if key == legacy_history.DYNAMIC_BATCHING
                    else "a token budget without use_dynamic_batching: true turns nothing on"
                )
                self.changes.append(Change("dropped", key, None, line, value, reason=reason))
            return
        budget_key = next((k for k in legacy_history.TOKEN_BUDGETS if present.get(k, (None,))[0] is not None), None)
        if budget_key is None:
            self.changes.append(
                Change(
                    "dropped",
                    legacy_history.DYNAMIC_BATCHING,
                    target,
                    flag_line,
                    flag,
                    reason=f"on, but no {' or '.join(legacy_history.TOKEN_BUDGETS)} gives its token budget; "
                    f"set {target}",
                    severity="error",
                    code=legacy_history.TOKEN_BUDGET,
                )
            )
            budget = None
        else:
            budget, line = present[budget_key]
            existing = _get(self.data, target)
            if existing in (_MISSING, None, -1) or existing == budget:
                _ensure_map(self.data, "trainer")["max_tokens_per_microbatch"] = budget
                reason = "the training micro-batches' token budget (use_dynamic_batching: true)"
                self.changes.append(Change("transformed", budget_key, target, line, budget, budget, reason=reason))
            else:
                reason = f"{target} is also set ({show_value(existing)}) and wins"
                self.changes.append(
                    Change("dropped", budget_key, target, line, budget, reason=reason, severity="warning")
                )
            reason = f"on: its budget is {target}"
            self.changes.append(
                Change("dropped", legacy_history.DYNAMIC_BATCHING, target, flag_line, flag, reason=reason)
            )
        for key, (value, line) in present.items():
            if key in (legacy_history.DYNAMIC_BATCHING, budget_key):
                continue
            if value is None or value == budget:
                reason = "the same budget as the training micro-batches'" if value is not None else "null"
                self.changes.append(Change("dropped", key, target, line, value, reason=reason))
                continue
            # The forward passes' own budget (or max_token_len_per_gpu as its fallback beside a _train budget).
            self.changes.append(
                Change(
                    "dropped",
                    key,
                    target,
                    line,
                    value,
                    reason=f"the forward passes' own token budget; rlc's take {target} too; "
                    + legacy_history.WARNING_SAYS[legacy_history.MEMORY_ONLY],
                    severity="warning",
                    code=legacy_history.MEMORY_ONLY,
                )
            )

    def model_name(self) -> None:
        value, line, _ = _pop(self.data, "generator.model_name")
        if value is _MISSING:
            return
        policy = _get(self.data, "trainer.policy.model.path")
        if value in (None, policy, "${trainer.policy.model.path}"):
            self.changes.append(
                Change(
                    "dropped",
                    "generator.model_name",
                    None,
                    line,
                    value,
                    reason="derived from trainer.policy.model.path",
                )
            )
        elif _get(self.data, "generator.served_model_name") in (_MISSING, None):
            _put(self.data, "generator.served_model_name", value)
            self.changes.append(
                Change(
                    "transformed",
                    "generator.model_name",
                    "generator.inference_engine.served_model_name",
                    line,
                    value,
                    value,
                    reason="the name the engines serve the policy under",
                )
            )
        else:
            self.changes.append(
                Change("dropped", "generator.model_name", None, line, value, reason="served_model_name is set and wins")
            )

    def engine_sampling(self) -> None:
        """Sampling arguments vLLM also takes (legacy_history.ENGINE_SAMPLING): a value other than vLLM's default
        moves to the section's additional_kwargs, which reach vLLM as they are; the default has nothing to pass."""
        for section in ("generator.sampling_params", "generator.eval_sampling_params"):
            for key, (name, default) in legacy_history.ENGINE_SAMPLING.items():
                old = f"{section}.{key}"
                value, line, _ = _pop(self.data, old)
                if value is _MISSING:
                    continue
                new = f"{section}.additional_kwargs.{name}"
                if legacy_history.at_engine_default(value, default):
                    reason = f"vLLM's default for {name}; nothing to pass"
                    self.changes.append(Change("dropped", old, None, line, value, reason=reason))
                    continue
                extra = _ensure_map(self.data, f"{section}.additional_kwargs")
                if name in extra:
                    reason = f"{new} is also set and wins"
                    self.changes.append(Change("dropped", old, new, line, value, reason=reason, severity="warning"))
                    continue
                extra[name] = value
                self.changes.append(
                    Change("transformed", old, new, line, value, value, reason="passed to vLLM under its own name")
                )

    def drops(self) -> None:
        for path, reason, is_harmless in DROPS:
            value = _get(self.data, path)
            if value is _MISSING:
                continue
            harmless = is_harmless(value, self.data)
            _, line, _ = _pop(self.data, path)
            self.changes.append(
                Change(
                    "dropped",
                    path,
                    None,
                    line,
                    value,
                    reason=reason if harmless else f"{reason}; its value changes what runs",
                    severity="info" if harmless else "error",
                )
            )

    def retired(self) -> None:
        """Keys from SkyRL's branches and releases with no spec v1 equivalent (legacy_history.RETIRED)."""

        def get(path: str) -> Any:
            value = _get(self.data, path)
            return None if value is _MISSING else value

        present = [(r, _get(self.data, r.path)) for r in legacy_history.RETIRED]
        judged = [(r, value, r.harmless(value, get)) for r, value in present if value is not _MISSING]
        for r, value, harmless in judged:
            _, line, _ = _pop(self.data, r.path)
            self.changes.append(
                Change(
                    "dropped",
                    r.path,
                    None,
                    line,
                    value,
                    reason=r.reason if harmless else f"{r.reason}; {legacy_history.WARNING_SAYS.get(r.code, _ALTERS)}",
                    severity="info" if harmless else r.severity,
                    code="" if harmless else r.code,
                )
            )

    def references(self) -> None:
        renames = dict(MOVES)
        renames.update({old: news[0] for old, news in SPLITS.items()})

        def rewrite(node, path: str) -> None:
            items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
            for key, value in list(items):
                where = f"{path}.{key}" if path else str(key)
                if isinstance(value, str) and "${" in value:
                    new = REF.sub(lambda m: "${" + _renamed(m.group(1), renames) + "}", value)
                    if new != value:
                        node[key] = type(value)(new) if type(value) is not str else new
                        self.changes.append(
                            Change(
                                "reference",
                                None,
                                where,
                                _line_of(node, key) if isinstance(node, dict) else 0,
                                value,
                                new,
                            )
                        )
                elif isinstance(value, (dict, list)):
                    rewrite(value, where)

        rewrite(self.data, "")


@lru_cache(maxsize=1)
def _v1_model():
    """Spec v1 without extensions: what a legacy file is migrated to."""
    return SpecModel()


def _renamed(ref: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        if ref == old or ref.startswith(old + "."):
            return new + ref[len(old) :]
    return ref


def migrate(data) -> list[Change]:
    """Rewrite a legacy document (in place) into spec v1; the list says what changed."""
    changes = _Step(data).run()
    data.insert(0, "version", 1)
    changes.append(Change("added", None, "version", 0, None, 1, reason="marks the file as spec v1"))
    return changes


def legacy_target(path: str) -> str | None:
    """Where a legacy key lives in spec v1 (None if it is not a known legacy key)."""
    if path in MOVES:
        return MOVES[path]
    if path in SPLITS:
        return " and ".join(SPLITS[path])
    return {
        "trainer.algorithm.use_kl_estimator_k3": "trainer.algorithm.kl_estimator_type",
        "trainer.algorithm.use_abs_kl": "trainer.algorithm.kl_estimator_type",
        "trainer.algorithm.init_kl_coef": "trainer.algorithm.kl_loss_coef",
    }.get(path)
