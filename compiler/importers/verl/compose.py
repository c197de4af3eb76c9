"""verl's config as verl composes it: a release's flattened defaults, Hydra's overrides, then the interpolations.

The defaults are vendored per release in `defaults/<release>.json` (written by tools/verl_defaults.py from
verl's own `_generated_ppo_*trainer.yaml`, or the flat `ppo_*trainer.yaml` before v0.5). A job names no release,
so the newest release on which every override composes is taken, and the report says which. Three inputs:
overrides (a launch command's arguments), a Hydra run directory (`.hydra/config.yaml`, the exact composed config,
with `overrides.yaml`), and a verl YAML whose `defaults:` list names `ppo_trainer` or `ppo_megatron_trainer`.
"""

from __future__ import annotations

import copy
import json
from dataclasses import field
from functools import cache
from importlib import resources
from typing import Any

from rlc.compiler.importers.verl.hydra_overrides import (
    MISSING,
    Override,
    OverrideError,
    Parsed,
    apply,
    lookup,
    parse,
    resolve,
)
from rlc.core.dataclass import dataclass

RELEASES = ("main", "v0.9.0", "v0.8.0", "v0.7.1", "v0.6.1", "v0.5.0", "v0.4.1", "v0.3.0", "v0.2")  # newest first
CONFIG_NAMES = {"ppo_trainer": "dp", "ppo_megatron_trainer": "megatron"}
ENGINES = ("dp", "megatron", "veomni", "torchtitan")


class ComposeError(Exception):
    """The job does not compose in any vendored verl release; `problems` are (line, message) pairs."""

    def __init__(self, problems: list[tuple[int, str]]):
        super().__init__("; ".join(m for _, m in problems))
        self.problems = problems


@dataclass
class Composed:
    """A verl job's config as verl reads it, and where each written key came from."""

    config: dict  # resolved: every interpolation replaced by its value
    release: str  # the vendored release it composed on ("main" = verl-project/verl at the commit below)
    commit: str
    engine: str  # dp | megatron | veomni | torchtitan
    written: dict[str, int] = field(default_factory=dict)  # dotted key (and every leaf under it) -> its line
    how: str = ""  # one line: what was composed on what

    def line(self, key: str) -> int:
        """The line the key (or the first written key under it) came from; 0 when it is verl's default."""
        if key in self.written:
            return self.written[key]
        return next((n for k, n in self.written.items() if k.startswith(key + ".")), 0)

    def is_written(self, key: str) -> bool:
        return key in self.written or any(k.startswith(key + ".") for k in self.written)


@cache
def defaults(release: str) -> dict:
    text = resources.files("rlc.compiler.importers.verl").joinpath(f"defaults/{release}.json").read_text("utf-8")
    return json.loads(text)


def _leaves(node: Any, prefix: str):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}")
    yield prefix


def _mark(written: dict[str, int], key: str, value: Any, line: int) -> None:
    for leaf in _leaves(value, key):
        written.setdefault(leaf, line)


def _engine_of(parsed: list[Parsed], config_name: str, group: bool) -> tuple[str, list[Parsed]]:
    """The engine the config name and a `model_engine=` group choice pick, and the overrides that remain."""
    engine = CONFIG_NAMES.get(config_name, "dp")
    rest = []
    for p in parsed:
        if p.key == "model_engine" and group and p.prefix in ("", "++"):
            engine = str(p.value)
            if engine not in ENGINES:
                raise ComposeError(
                    [(p.source.line, f"model_engine={engine}: verl has no such engine ({', '.join(ENGINES)})")]
                )
            continue
        rest.append(p)
    return engine, rest


def compose_overrides(
    overrides: list[Override], config_name: str = "ppo_trainer", release: str | None = None
) -> Composed:
    """The config `python3 -m verl.trainer.main_ppo OVERRIDES` reads, on the newest release it composes on."""
    if config_name not in CONFIG_NAMES:
        raise ComposeError([(0, f"--config-name={config_name}: rlc composes ppo_trainer and ppo_megatron_trainer")])
    parsed, problems = [], []
    for o in overrides:
        try:
            parsed.append(parse(o))
        except OverrideError as exc:
            problems.append((o.line, str(exc)))
    if problems:
        raise ComposeError(problems)
    failures: list[tuple[str, ComposeError]] = []
    for name in [release] if release else RELEASES:
        if failures and not _may_compose(name, parsed):
            continue
        try:
            return _compose_on(name, parsed, config_name)
        except ComposeError as exc:
            failures.append((name, exc))
    # the release the job comes nearest to composing on (the newest of those): its problems are the job's
    name, nearest = min(failures, key=lambda f: len(f[1].problems))
    if len(failures) > 1:
        nearest.problems = [(line, f"on verl {name}'s defaults: {msg}") for line, msg in nearest.problems]
    raise nearest


def _may_compose(release: str, parsed: list[Parsed]) -> bool:
    """False when a plain override names a key this release's dp and megatron defaults both lack (and no `+`
    override before it adds it): the release cannot compose the job, no need to try."""
    engines = defaults(release)["engines"]
    added: list[str] = []
    for p in parsed:
        if p.prefix in ("+", "++"):
            added.append(p.key)
        elif p.prefix == "" and "/" not in p.key and not p.key.startswith("hydra.") and p.key != "model_engine":
            if any(p.key == a or p.key.startswith(a + ".") for a in added):
                continue
            if all(lookup(tree, p.key) is MISSING for tree in engines.values()):
                return False
    return True


def _compose_on(release: str, parsed: list[Parsed], config_name: str) -> Composed:
    vendored = defaults(release)
    engine, rest = _engine_of(parsed, config_name, vendored["engine_group"])
    if engine not in vendored["engines"]:
        # veomni and torchtitan are refused by name later; their defaults are not vendored, so compose on dp's
        # to read the rest of the job (a key only they have is then reported by the refusal, not as absent).
        tree = copy.deepcopy(vendored["engines"]["dp"])
    else:
        tree = copy.deepcopy(vendored["engines"][engine])
    written = _apply_all(tree, rest, lenient=engine not in vendored["engines"])
    how = f"composed on verl {release}'s {config_name if engine == 'dp' else engine} defaults"
    return _finish(release, tree, engine, written, how)


def _apply_all(tree: dict, parsed: list[Parsed], lenient: bool = False) -> dict[str, int]:
    """Apply the overrides in order; the keys they wrote, each with its line. `lenient`: a change of an absent key
    is only recorded (the engine's own defaults are not vendored)."""
    written: dict[str, int] = {}
    problems = []
    for p in parsed:
        if p.key.startswith("hydra."):  # Hydra's own settings, kept under `hydra` for the importer to judge
            if p.has_value:
                apply(tree, Parsed("++", p.key, p.value, True, p.source))
            written[p.key] = p.source.line
            continue
        if "/" in p.key or "@" in p.key:  # a config group choice: kept for the importer to refuse by name
            tree.setdefault("hydra", {}).setdefault("group_choices", {})[p.key] = p.value
            written[f"hydra.group_choices.{p.key}"] = p.source.line
            continue
        try:
            apply(tree, p)
        except OverrideError as exc:
            if lenient and p.prefix == "":
                written[p.key] = p.source.line
            else:
                problems.append((p.source.line, str(exc)))
            continue
        if p.prefix == "~":
            written[p.key] = p.source.line
        else:
            _mark(written, p.key, p.value, p.source.line)
    if problems:
        raise ComposeError(problems)
    return written


def _finish(release: str, tree: dict, engine: str, written: dict[str, int], how: str) -> Composed:
    try:
        config = resolve(tree)
    except OverrideError as exc:
        raise ComposeError([(0, str(exc))]) from None
    return Composed(config, release, defaults(release)["commit"], engine, written, how)


def compose_run_dir(config: dict, overrides: list[Override], choices: dict | None = None) -> Composed:
    """A Hydra run directory: `config.yaml` is the config verl composed (exact), `overrides.yaml` what was
    written. The release is the newest vendored one whose keys hold every key of the config, for the report."""
    try:
        parsed = [parse(o) for o in overrides]
    except OverrideError as exc:
        raise ComposeError([(0, str(exc))]) from None
    engine = str((choices or {}).get("model_engine") or "")
    if not engine:
        engine = next((str(p.value) for p in parsed if p.key == "model_engine"), "")
    if not engine:
        strategy = lookup(config, "actor_rollout_ref.actor.strategy")
        engine = "megatron" if strategy == "megatron" else "dp"
    written: dict[str, int] = {}
    for p in parsed:
        if p.key != "model_engine" and not p.key.startswith("hydra."):
            _mark(written, p.key, p.value, p.source.line)
    release = _nearest_release(config, engine)
    how = f"the run directory's config.yaml as verl composed it (its keys are nearest verl {release}'s)"
    return _finish(release, copy.deepcopy(config), engine, written, how)


def _nearest_release(config: dict, engine: str) -> str:
    keys = set(_leaves(config, ""))
    best, best_missing = RELEASES[0], None
    for name in RELEASES:
        engines = defaults(name)["engines"]
        known = set(_leaves(engines.get(engine, engines["dp"]), ""))
        missing = len(keys - known)
        if best_missing is None or missing < best_missing:
            best, best_missing = name, missing
    return best


def compose_yaml(data: dict, line_of, overrides: list[Override] = ()) -> Composed:  # type: ignore[assignment]
    """A verl YAML with its own `defaults:` list (`ppo_trainer` or `ppo_megatron_trainer`, `_self_`): its keys
    merged over the release's defaults as Hydra merges a primary config (new keys allowed), then any overrides."""
    entries = data.get("defaults") or []
    if not isinstance(entries, list):
        raise ComposeError([(line_of("defaults"), "defaults: must be a list")])
    base, self_first, engine_choice = None, False, None
    problems = []
    for i, entry in enumerate(entries):
        if entry == "_self_":
            self_first = base is None
        elif isinstance(entry, str) and entry in CONFIG_NAMES:
            base = entry
        elif isinstance(entry, dict) and list(entry) == ["model_engine"]:
            engine_choice = str(entry["model_engine"])
        else:
            problems.append(
                (
                    line_of(f"defaults.{i}"),
                    f"defaults entry {entry!r}: rlc composes ppo_trainer or "
                    "ppo_megatron_trainer with _self_ (and a model_engine choice) only",
                )
            )
    if base is None:
        problems.append((line_of("defaults"), "the defaults list names neither ppo_trainer nor ppo_megatron_trainer"))
    if problems:
        raise ComposeError(problems)
    own = {k: v for k, v in data.items() if k != "defaults"}
    written: dict[str, int] = {}
    for leaf in _leaves(own, ""):
        key = leaf.lstrip(".")
        if key:
            written[key] = line_of(key)
    choice = [Override(f"model_engine={engine_choice}")] if engine_choice else []
    first: ComposeError | None = None
    for release in RELEASES:
        vendored = defaults(release)
        try:
            engine, _ = _engine_of([parse(o) for o in choice], base or "ppo_trainer", vendored["engine_group"])
            tree = copy.deepcopy(vendored["engines"].get(engine, vendored["engines"]["dp"]))
            merged = _merge_primary(tree, own, self_first)
            applied = _apply_all(merged, [parse(o) for o in overrides])
            return _finish(
                release,
                merged,
                engine,
                {**written, **applied},
                f"the file's keys over verl {release}'s {base} defaults",
            )
        except (ComposeError, OverrideError) as exc:
            first = first or (exc if isinstance(exc, ComposeError) else ComposeError([(0, str(exc))]))
    assert first is not None
    raise first


def _merge_primary(tree: dict, own: dict, self_first: bool) -> dict:
    def merge(into: dict, new: dict) -> None:
        for k, v in new.items():
            if isinstance(into.get(k), dict) and isinstance(v, dict):
                merge(into[k], v)
            else:
                into[k] = copy.deepcopy(v)

    if self_first:  # `_self_` before the base: the base's values win
        out = copy.deepcopy(own)
        merge(out, tree)
        return out
    merge(tree, own)
    return tree


__all__ = ["MISSING", "ComposeError", "Composed", "Override", "compose_overrides", "compose_run_dir", "compose_yaml"]
