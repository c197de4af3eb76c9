"""`rlc migrate --from verl`: a verl PPO/GRPO job (`python3 -m verl.trainer.main_ppo` overrides, a Hydra run
directory, or a verl YAML with its own `defaults:`) turned into spec v1, every written key accounted for.

The job is composed as verl composes it (rlc.compiler.importers.verl.compose), then mapped key by key
(rlc.compiler.importers.verl.mapping): what verl reads is carried with its provenance, what verl accepts but its
main_ppo never reads is reported as such, and what rlc cannot run is refused by name before anything is written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlc.compiler.importers.base import Change, Imported, NotImportable, spec_text
from rlc.compiler.importers.verl import multiturn
from rlc.compiler.importers.verl.compose import (
    Composed,
    ComposeError,
    compose_overrides,
    compose_run_dir,
    compose_yaml,
)
from rlc.compiler.importers.verl.hydra_overrides import MISSING, Override, lookup
from rlc.compiler.importers.verl.mapping import ALG, A, M, R, T, map_config
from rlc.compiler.importers.verl.record import SETTINGS, VerlImport
from rlc.compiler.load import Document, document_from_text, parse, read_text
from rlc.core.plain import plain_yaml

VL_MODEL = re.compile(r"(?i)(?:[-_/]vl[-_]|vl$|vision|glm-?4\.?1v|minicpm-o|llava|geo3k)")
# Keys verl accepts, and its main_ppo never reads (see docs/verl.md): reported, never carried.
LEGACY_REWARD = ("reward_model", "custom_reward_function", "sandbox_fusion")


def refusal(c: Composed) -> str | None:
    """Why rlc does not run this verl job, in a verl user's words, or None."""
    get = _getter(c)
    if c.engine in ("veomni", "torchtitan"):
        return f"verl's {c.engine} engine (model_engine={c.engine}); rlc trains with FSDP2 or Megatron-Core"
    strategy = str(get(f"{A}.strategy") or "fsdp")
    if strategy not in ("fsdp", "fsdp2", "megatron"):
        return f"{A}.strategy={strategy}; rlc trains with FSDP2 or Megatron-Core"
    if str(get(f"{T}.device") or "cuda") == "npu":
        return f"Ascend NPUs ({T}.device=npu, torch_npu); rlc runs on NVIDIA GPUs or the CPU"
    search = get("hydra.searchpath")
    if not _verls_own(search) and (search or c.is_written("hydra.searchpath")):
        what = "the mlite engine" if "mlite" in str(search) else "configs from an external search path"
        return f"{what} (hydra.searchpath); rlc composes verl's own configs only"
    choices = get("hydra.group_choices")
    if choices:
        shown = ", ".join(f"{k}={v}" for k, v in choices.items())
        return f"a config group choice ({shown}) of configs rlc does not vendor; rlc composes verl's own defaults"
    if get(f"{R}.multi_turn.enable"):
        why = multiturn.refusal(get, R)
        if why:
            return f"{why}; rlc's multi-turn rollouts step SkyRL-Gym environments (docs/multiturn.md)"
    loop = get(f"{R}.agent.default_agent_loop")
    if get(f"{R}.agent.agent_loop_config_path") or loop not in (None, "single_turn_agent"):
        return f"agent loops ({R}.agent.*); rlc's multi-turn rollouts come from environments"
    if c.is_written("data.image_key") or c.is_written("data.video_key") or VL_MODEL.search(str(get(f"{M}.path"))):
        return "vision-language data (images or video in the prompts); rlc trains on text"
    if get("distillation.enabled"):
        return "on-policy distillation (distillation.enabled=true); rlc trains with rewards only"
    if get("reward.reward_model.enable") or (get("reward_model.enable") and get("reward.reward_manager") is None):
        return "a model-based reward (reward_model.enable=true); rlc scores with environments"
    mode = get(f"{T}.v1.trainer_mode")
    if mode not in (None, "sync"):
        return f"verl's {mode} trainer ({T}.v1.trainer_mode={mode}); rlc imports the synchronous main_ppo trainer"
    return None


def _getter(c: Composed):
    def get(key: str) -> Any:
        found = lookup(c.config, key)
        return None if found is MISSING else found

    return get


def import_composed(c: Composed, source: str) -> Imported:
    why = refusal(c)
    if why:
        raise NotImportable(f"{why}: rlc does not run that, so nothing was written")
    imp = VerlImport(c)
    map_config(imp)
    _reward(imp)
    _leftovers(imp)
    if imp.settings:
        imp.result.spec[SETTINGS] = dict(imp.settings)
        imp.result.sources[SETTINGS] = ["verl's own settings the spec has no place for: they apply when "
                                        "launch.trainer is verl"]  # fmt: skip
    changes = imp.result.changes
    header = (
        f"Imported from the verl job {source} by `rlc migrate --from verl`:\n{c.how} (verl-project/verl@"
        f"{c.commit[:9]}).\nComments name the verl keys each value came from (line numbers are the source's); "
        "the report lists what was dropped."
    )
    return Imported(
        spec_text(imp.result.spec, _comments(imp.result.sources), header),
        f"verl job -> spec v1 ({c.how})",
        changes,
        [f"{'  !! ' if ch.severity == 'error' else '  '}{ch.describe()}" for ch in changes],
        f"{sum(ch.severity == 'error' for ch in changes)} change(s) alter what runs (marked !!); review them "
        "before launching",
    )


def _comments(sources: dict[str, list[str]]) -> dict[str, str]:
    return {path: f"verl: {', '.join(s for s in found if s)}" for path, found in sources.items() if any(found)}


RF = "environment.skyrl_gym.reward_function"
# verl's reward managers that score each row as the naive one does, with what else each does (none changes a value).
SAME_SCORES = {
    "naive": "",
    "batch": "",
    "prime": "verl's prime reward manager scores each row as the naive one does, in parallel processes with 300 s "
    "a row (0 past it); rlc's environments score on environment.skyrl_gym.max_env_workers threads (an "
    "environment call past 600 s ends its trajectory): the same scores",
    "rate_limited": "verl's rate_limited reward manager scores as the naive one does, its calls throttled; rlc "
    "does not throttle them: the same scores",
    "gdpo": "verl's gdpo reward manager scores as the naive one does, with trainer.experiment_name in each row's "
    "extra_info (carried as environment.skyrl_gym.reward_function.experiment_name with a reward function) and its "
    "dict's entries feeding algorithm.gdpo_reward_keys (carried as trainer.algorithm.gdpo_reward_keys)",
}


def _reward(imp: VerlImport) -> None:
    """verl's reward: HEAD reads `reward.*` on main_ppo (the legacy sections only on the fully-async path);
    older releases read the legacy sections."""
    live = "reward" if imp.has("reward.reward_manager") else ""
    manager_key = "reward.reward_manager.name" if live else "reward_model.reward_manager"
    kwargs_key = "reward.reward_kwargs" if live else "reward_model.reward_kwargs"
    custom = "reward.custom_reward_function" if live else "custom_reward_function"
    manager = imp.get(manager_key, "naive")
    if live and imp.get("reward.reward_manager.source", "register") != "register":
        imp.problem(manager_key, "a reward manager class of your own (reward.reward_manager.source: importlib); "
                    "not carried: write its scoring as a reward function file (environment.skyrl_gym."
                    "reward_function)")  # fmt: skip
    elif manager == "dapo":
        _overlong_buffer(imp, manager_key, kwargs_key)
    elif manager in SAME_SCORES:
        if SAME_SCORES[manager]:
            imp.problem(manager_key, SAME_SCORES[manager], severity="info")
    else:
        imp.problem(manager_key, f"verl's {manager!r} reward manager is not carried; the environment scores as "
                    "the naive manager does")  # fmt: skip
    if imp.get(f"{custom}.path"):
        _custom_reward_function(imp, custom)
        if manager == "gdpo":
            imp.put(f"{RF}.experiment_name", str(imp.get("trainer.experiment_name", "")), "trainer.experiment_name",
                    reason="verl's gdpo reward manager adds it to each row's extra_info")  # fmt: skip
    imp.read(manager_key, f"{custom}.path", custom, "reward.reward_manager", kwargs_key,
             "reward.num_workers", "reward.sandbox_fusion", "reward.reward_model")  # fmt: skip
    if not live:
        imp.read("reward_model.reward_manager", "custom_reward_function", "reward_model.enable")
    for section in LEGACY_REWARD if live else ():
        imp.drop(section, "verl accepts it but its main_ppo never reads it (only the fully-async trainer migrates "
                 "the legacy reward keys): it changes nothing in verl either", "warning")  # fmt: skip


def _overlong_buffer(imp: VerlImport, manager_key: str, kwargs_key: str) -> None:
    """verl's dapo reward manager: the naive manager's score plus DAPO's soft overlong penalty when
    reward_kwargs.overlong_buffer_cfg.enable; rlc's trainer.algorithm.overlong_buffer_* is the same arithmetic."""
    cfg = f"{kwargs_key}.overlong_buffer_cfg"
    if not imp.get(f"{cfg}.enable"):
        imp.problem(manager_key, "verl's dapo reward manager without its overlong buffer scores as the naive one "
                    "does: the same scores", severity="info")  # fmt: skip
        return
    length, factor = imp.get(f"{cfg}.len"), imp.get(f"{cfg}.penalty_factor", 1.0)
    alg = "trainer.algorithm"
    imp.put(f"{alg}.overlong_buffer_len", length, f"{cfg}.len", f"{cfg}.enable", manager_key)
    imp.put(f"{alg}.overlong_buffer_penalty_factor", factor, f"{cfg}.penalty_factor")
    imp.read(f"{cfg}.log")  # which metrics verl logs
    most = imp.get(f"{kwargs_key}.max_resp_len")
    generated = imp.result.spec.get("generator.sampling_params.max_generate_length")
    if most is not None and most != generated:
        imp.problem(f"{kwargs_key}.max_resp_len", f"verl counts the overlong buffer back from max_resp_len={most}; "
                    f"rlc counts it back from max_generate_length={generated}, the longest response")  # fmt: skip
    imp.read(f"{kwargs_key}.max_resp_len")


def _custom_reward_function(imp: VerlImport, custom: str) -> None:
    """verl's custom_reward_function (path, name, reward_kwargs) as env_class reward_function: the same function, in
    verl's signature, scores each row in the trainer."""
    imp.result.changes = [c for c in imp.result.changes if c.new != "environment.env_class"]
    imp.put("environment.env_class", "reward_function", f"{custom}.path",
            reason="each row is scored by your compute_score file, as verl's custom_reward_function scores it")  # fmt: skip
    imp.put(f"{RF}.path", str(imp.get(f"{custom}.path")), f"{custom}.path")
    imp.put(f"{RF}.name", str(imp.get(f"{custom}.name", "compute_score")), f"{custom}.name")
    if imp.get(f"{custom}.reward_kwargs"):
        imp.put(f"{RF}.kwargs", dict(imp.get(f"{custom}.reward_kwargs")), f"{custom}.reward_kwargs")
    imp.read(f"{custom}.reward_kwargs")


def _leftovers(imp: VerlImport) -> None:
    """Every written verl key no section read: reported, never silently dropped."""
    for key in sorted(imp.c.written):
        if key in imp.used or any(key.startswith(u + ".") for u in imp.used):
            continue
        if any(k.startswith(key + ".") for k in imp.c.written):
            continue  # a section: its leaves are reported one by one
        if key.startswith("hydra."):
            imp.drop(key, "Hydra's own settings (output directories, logging); rlc writes its own")
        elif key.startswith(f"{ALG}.rollout_correction") or key.startswith(f"{A}.router_replay"):
            imp.drop(key, "no rlc counterpart; not carried", "error")
        else:
            imp.drop(key, "no rlc counterpart that verl's main_ppo reads; not carried", "warning")
    imp.result.changes.sort(key=lambda ch: (ch.severity != "error", ch.line or 10**9))


def import_overrides(overrides: list[Override], source: str, config_name: str = "ppo_trainer") -> Imported:
    """`python3 -m verl.trainer.main_ppo [--config-name NAME] OVERRIDES` as spec v1."""
    try:
        composed = compose_overrides(overrides, config_name)
    except ComposeError as exc:
        raise NotImportable(compose_failure(exc, overrides)) from None
    return import_composed(composed, source)


def _verls_own(search) -> bool:
    """A search path naming verl's own trainer configs only (`file://verl/trainer/config`, which verl's
    sglang_multiturn configs name from its repository root): those are the configs rlc composes."""
    paths = search if isinstance(search, list) else [search]
    return bool(search) and all(
        str(p).rstrip("/").replace("pkg://verl.trainer.config", "verl/trainer/config").endswith("verl/trainer/config")
        for p in paths
    )


def unvendored(overrides: list[Override]) -> str | None:
    """Why a job that does not compose needs configs rlc does not vendor (an extra search path, a group choice),
    said before the keys those configs would have added are reported as absent."""
    for o in overrides:
        key = o.text.strip().lstrip("+~").partition("=")[0]
        if key == "hydra.searchpath":
            what = "the mlite engine" if "mlite" in o.text else "configs from an external search path"
            return f"{what} (hydra.searchpath, line {o.line}); rlc composes verl's own configs only"
    for o in overrides:
        key = o.text.strip().lstrip("+~").partition("=")[0]
        if "@" in key or "/" in key:
            return f"a config group choice ({o.text.strip()}, line {o.line}) of configs rlc does not vendor"
    return None


def compose_failure(exc: ComposeError, overrides: tuple[Override, ...] | list[Override] = ()) -> str:
    why = unvendored(list(overrides))
    if why:
        return f"{why}: rlc does not run that, so nothing was written"
    parts = [f"line {line}: {msg}" if line else msg for line, msg in exc.problems]
    return "verl would refuse this job as it starts: " + "; ".join(parts)


class Verl:
    """A verl job (launch overrides, Hydra run directory or verl YAML) written as a new spec v1 file."""

    name = "verl"
    what = "verl job"
    rewrites = False  # a new spec is written: no --in-place, --check or --diff
    reads_paths = True  # a Hydra run directory is a directory: convert_path reads it

    def convert(self, doc: Document) -> Imported:
        data = plain_yaml(doc.data)

        def line_of(path: str) -> int:
            return doc.locate(tuple(int(p) if p.isdigit() else p for p in path.split("."))).line

        if not isinstance(data, dict):
            raise NotImportable("not a verl config (a mapping with actor_rollout_ref or defaults)")
        try:
            if "defaults" in data:
                sft = [e for e in data.get("defaults") or [] if isinstance(e, str) and "sft" in e]
                if sft:
                    raise NotImportable(f"defaults: {sft[0]} makes this a verl supervised fine-tuning (SFT) config; "
                                        "rlc compiles RL jobs only, so nothing was written")  # fmt: skip
                composed = compose_yaml(data, line_of)
            elif "actor_rollout_ref" in data:
                composed = compose_run_dir(data, [])
            else:
                raise NotImportable("not a verl config: it has no actor_rollout_ref section and no defaults list")
        except ComposeError as exc:
            raise NotImportable(compose_failure(exc)) from None
        return import_composed(composed, doc.name)

    def convert_path(self, path: str) -> Imported:
        """A Hydra run directory (or its .hydra folder), an overrides.yaml (a list of overrides), or a verl YAML.
        Raises LoadError for a file that cannot be read as YAML (rendered as a diagnostic). A launch script goes
        through rlc.compiler.importers.scripts (VerlScript)."""
        if not Path(path).is_dir():
            text = read_text(Path(path), path)
            data: Any = parse(text, path)
            if isinstance(data, list):  # a Hydra overrides.yaml
                seq: Any = data
                return import_overrides(_listed_overrides(list(seq), lambda i: seq.lc.item(int(i))[0] + 1), path)
            return self.convert(document_from_text(text, path))
        folder = Path(path)
        if (folder / ".hydra").is_dir():
            folder = folder / ".hydra"
        config_file = folder / "config.yaml"
        if not config_file.is_file():
            raise NotImportable(f"{path} is a directory without .hydra/config.yaml: not a Hydra run directory")
        config = plain_yaml(_read_yaml(config_file))
        if not isinstance(config, dict) or "actor_rollout_ref" not in config:
            raise NotImportable(f"{config_file} is not a verl config (no actor_rollout_ref section)")
        overrides: list[Override] = []
        if (folder / "overrides.yaml").is_file():
            listed: Any = _read_yaml(folder / "overrides.yaml")
            if not isinstance(listed, list):
                raise NotImportable(f"{folder / 'overrides.yaml'} is not a list of overrides")
            overrides = _listed_overrides(list(listed), lambda i: _item_line(listed, i))
        choices: dict = {}
        if (folder / "hydra.yaml").is_file():
            hydra = plain_yaml(_read_yaml(folder / "hydra.yaml")) or {}
            runtime = ((hydra.get("hydra") or {}).get("runtime") or {}) if isinstance(hydra, dict) else {}
            choices = runtime.get("choices") or {}
        try:
            composed = compose_run_dir(config, overrides, choices if isinstance(choices, dict) else {})
        except ComposeError as exc:
            raise NotImportable(compose_failure(exc)) from None
        return import_composed(composed, str(path))


def _item_line(seq: Any, index: str) -> int:
    """The line of item `index` of a round-trip YAML list."""
    return seq.lc.item(int(index))[0] + 1


def _read_yaml(path: Path) -> Any:
    """A YAML file's round-trip tree (LoadError, rendered as a diagnostic, when it cannot be read)."""
    return parse(read_text(path, str(path)), str(path))


def _listed_overrides(items: list, line_of) -> list[Override]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise NotImportable(f"item {i + 1} of the overrides is {item!r}, not a Hydra override string")
        out.append(Override(item, line_of(str(i))))
    return out


__all__ = ["Change", "Verl", "import_composed", "import_overrides"]
