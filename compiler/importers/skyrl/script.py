"""A SkyRL launch script (`uv run ... -m skyrl.train.entrypoints.main_base key=value ... "$@"`) as spec v1.

SkyRL's main_base builds its config from its dataclass defaults and the command line's `key=value` overrides
(`SkyRLTrainConfig.from_cli_overrides`), and spec v1 is that dataclass API: each override becomes the spec key of
the same name, a legacy key is migrated as `rlc migrate` migrates a legacy file, and each value keeps as a
comment the script line it came from. A variable the script reads from the environment and never sets stays
the environment's (`${oc.env:NAME}`, resolved where the job runs) unless --env gives it.
"""

from __future__ import annotations

from rlc.compiler.importers.base import (
    Change,
    Imported,
    NotImportable,
    environment_reference,
    leaves,
    names_run,
    spec_text,
)
from rlc.compiler.importers.shell import Launch, Script, Word
from rlc.compiler.importers.versions import upgrade
from rlc.compiler.load import Document
from rlc.core.diagnostics import COMMAND_LINE
from rlc.core.overrides import Override, OverrideError, parse_override
from rlc.core.plain import plain_yaml
from rlc.spec.skyrl_release import DEFAULT_CHANGES, SKYRL_RELEASE
from ruamel.yaml.comments import CommentedMap

MAIN_BASE = "skyrl.train.entrypoints.main_base"
# The settings that name the run and where its logs, checkpoints and exports go: a date in them changes nothing
# of what runs.
RUN_NAMES = frozenset(
    [
        *(f"trainer.{k}" for k in ("run_name", "project_name", "log_path", "ckpt_path", "export_path")),
        "generator.inference_engine.delta_weight_sync.local_checkpoint_dir",
    ]
)
ALG = "trainer.algorithm"
# SkyRL's DAPO entrypoints: main_base's trainer with DAPO's soft overlong penalty added to the rewards, read from two
# fields their config adds to main_base's (spec v1 has both), each with what rlc does differently, if anything.
DAPO_ENTRYPOINTS = {
    "examples.train.algorithms.dapo.main_dapo": "",
    "examples.train.algorithms.dapo.main_dapo_fully_async": "",
    "examples.train.tis_correction.main_tis_dapo": (
        "main_tis_dapo counts the overlong buffer back from the context's end (max_input_length + "
        "max_generate_length, less the prompt's length); rlc counts it back from max_generate_length, as main_dapo "
        "does, so a response to a prompt shorter than max_input_length is penalised from fewer tokens on"
    ),
}
# main_dapo's defaults of its two fields (DAPOAlgorithmConfig), written where a script leaves them unset.
DAPO_DEFAULTS = {f"{ALG}.overlong_buffer_len": 512, f"{ALG}.overlong_buffer_penalty_factor": 1.0}


class SkyRLScript:
    """A launch script of SkyRL's standard entrypoint, written as a new spec v1 file."""

    name = "skyrl"
    what = "SkyRL launch script"

    def accepts(self, launch: Launch) -> bool:
        return launch.module and (launch.program == MAIN_BASE or launch.program in DAPO_ENTRYPOINTS)

    def names_run(self, word: Word) -> bool:
        return names_run(word, RUN_NAMES)

    def convert_launch(self, script: Script, launch: Launch) -> Imported:
        overrides: list[tuple[Override, Word]] = []
        for word in launch.args:
            text = word.render(environment_reference)
            if text.startswith("trainer.override_entrypoint="):
                raise NotImportable(
                    f"{_where(word, script.name)}: {word.text} hands the job to the integration entrypoint "
                    f"{text.split('=', 1)[1]}, which reads config fields of its own; rlc runs SkyRL's standard "
                    "trainer only, so nothing was written"
                )
            try:
                overrides.append((parse_override(text), word))
            except OverrideError as exc:
                why = str(exc).replace(
                    "'+' prefix (add a new key) is not supported",
                    "'+' prefix is refused by SkyRL too (SkyRLTrainConfig.from_cli_overrides)",
                )
                raise NotImportable(f"{_where(word, script.name)}: {why}; nothing was written") from None
            if launch.program == MAIN_BASE and overrides[-1][0].key in DAPO_DEFAULTS:
                raise NotImportable(
                    f"{_where(word, script.name)}: {overrides[-1][0].key} is a field of SkyRL's DAPO entrypoint "
                    f"(examples.train.algorithms.dapo.main_dapo), which {MAIN_BASE}'s strict config parse refuses: "
                    "SkyRL would stop at start; launch the script with main_dapo, so nothing was written"
                )
        return _spec(script, launch, overrides)


def _where(word: Word, script: str = "") -> str:
    """A word's place as a comment shows it: `line 12` in the script itself, `other.sh:12` in one it runs."""
    if word.file == COMMAND_LINE:
        return "the command line"
    return f"line {word.line}" if word.file == script else f"{word.file}:{word.line}"


def _spec(script: Script, launch: Launch, overrides: list[tuple[Override, Word]]) -> Imported:
    doc = Document(script.name, "", CommentedMap([("version", 1)]))
    report = upgrade(doc, [o for o, _ in overrides])
    migrated = report.changes if report is not None else []
    where = {o.key: _where(w, script.name) for o, w in overrides}
    line = {o.key: w.line for o, w in overrides}
    for c in migrated:  # a legacy key's change is reported at the script line that wrote it
        c.line = line.get(c.old or "", c.line)
    last = {o.key: i for i, (o, _) in enumerate(overrides)}
    changes = [
        Change("added", None, o.key, w.line, new_value=o.value, reason=_where(w, script.name))
        if last[o.key] == i
        else Change(
            "dropped",
            o.key,
            None,
            0,
            o.value,
            reason=f"{_where(w, script.name)} is set again at {where[o.key]}; the last value wins, as on SkyRL's "
            "command line",
        )
        for i, (o, w) in enumerate(overrides)
        if all(c.old != o.key for c in migrated)
    ] + migrated
    origin = dict(where)
    for c in migrated:
        for new in (c.new or "").split(" and "):
            if c.old in where and new:
                origin.setdefault(new, where[c.old])
    data = plain_yaml(doc.data)
    data.pop("version", None)
    spec = dict(leaves(data))
    comments = {path: _origin(path, origin) for path in spec}
    for key, value in _release_defaults(spec).items():
        spec[key] = value
        comments[key] = f"SkyRL {SKYRL_RELEASE}'s default; spec v1's is not"
        changes.append(Change("added", None, key, 0, new_value=value, reason=f"SkyRL {SKYRL_RELEASE}'s default"))
    if launch.program in DAPO_ENTRYPOINTS:
        changes += _dapo(spec, comments, launch.program)
    text = spec_text(
        spec,
        comments,
        f"Imported from the SkyRL launch script {script.name} by `rlc migrate` ({launch.program}, "
        f"{len(launch.args)} override(s)).\nComments name the script line each value came from.",
    )
    return Imported(
        text,
        f"SkyRL launch script ({launch.program}, {_where_launch(script, launch)}) -> spec v1",
        changes,
        [f"{'  !! ' if c.severity == 'error' else '  '}{c.describe()}" for c in changes],
        f"{len([c for c in changes if c.severity == 'error'])} change(s) alter what runs (marked !!); "
        "review them before launching",
    )


def _dapo(spec: dict, comments: dict, program: str) -> list[Change]:
    """A DAPO entrypoint's overlong penalty: main_dapo's defaults where the script sets none (spec v1's is off), and
    what rlc counts differently from this entrypoint, if anything."""
    changes = []
    name = program.rsplit(".", 1)[-1]
    for key, value in DAPO_DEFAULTS.items():
        if key not in spec:
            spec[key] = value
            comments[key] = f"{name}'s default; spec v1's is not"
            changes.append(Change("added", None, key, 0, new_value=value, reason=f"{name}'s default"))
    if DAPO_ENTRYPOINTS[program]:
        key = f"{ALG}.overlong_buffer_len"
        value = spec[key]
        changes.append(Change("transformed", key, key, 0, value, value, DAPO_ENTRYPOINTS[program], "error"))
    return changes


def _release_defaults(spec: dict) -> dict:
    """SkyRL's defaults where spec v1 keeps its own (spec/skyrl_release.py) and the script sets nothing: written, so
    that the spec means what the script ran (CUDA graphs on, vLLM's metrics exported, 0.4.0's CISPO clip range).
    The strategy is left out: fsdp2 and SkyRL's fsdp are the same backend."""
    return {
        key: value
        for key, (value, _why) in DEFAULT_CHANGES.items()
        if key != "trainer.strategy" and not any(p == key or p.startswith(key + ".") for p in spec)
    }


def _where_launch(script: Script, launch: Launch) -> str:
    return f"line {launch.line}" if launch.file == script.name else f"{launch.file}:{launch.line}"


def _origin(path: str, origin: dict[str, str]) -> str:
    """Where a spec key came from: its own override, or the override of the section it sits in."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        found = origin.get(".".join(parts[:n]))
        if found:
            return found
    return ""
