"""A verl launch script imported: its training command found by the static reader (rlc.compiler.importers.shell,
through rlc.compiler.importers.scripts), its Hydra arguments composed and mapped as any verl job
(rlc.compiler.importers.verl.importer). Nothing is run.

`--config-name`/`--config-path` are read as Hydra reads them: `ppo_trainer` and `ppo_megatron_trainer` are verl's
own; another name is the script's own YAML (`<config-path>/<name>.yaml`, relative to the script), composed with
its `defaults:` list. A variable the script reads and never sets stays the environment's (`${oc.env:NAME}`, which
Hydra resolves where the job runs, as verl would); a value only running the script gives is an error of the
reader, with the `--env NAME=VALUE` that fixes it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlc.compiler.importers.base import Imported, NotImportable, environment_reference, names_run
from rlc.compiler.importers.shell import Launch, Script, Unknown, Word
from rlc.compiler.importers.verl.compose import CONFIG_NAMES, ComposeError, compose_overrides, compose_yaml
from rlc.compiler.importers.verl.hydra_overrides import Override
from rlc.compiler.importers.verl.importer import compose_failure, import_composed, refusal
from rlc.compiler.load import LoadError, parse, read_text
from rlc.core.plain import plain_yaml

# verl's other entry points, as a launch command names them, and what they are.
MODULES = {
    "verl.trainer.sft_trainer": "supervised fine-tuning (SFT)",
    "verl.trainer.fsdp_sft_trainer": "supervised fine-tuning (SFT)",
    "verl.trainer.main_generation": "generation only (no training)",
    "verl.trainer.main_generation_server": "generation only (no training)",
    "verl.trainer.main_eval": "evaluation only (no training)",
}
# The settings that name the run and where its logs, checkpoints and dumps go: a date in them changes nothing of
# what runs.
RUN_NAMES = frozenset(
    f"trainer.{k}"
    for k in (
        "project_name", "experiment_name", "default_local_dir", "default_hdfs_dir", "rollout_data_dir",
        "validation_data_dir",
    )
)  # fmt: skip
_MODULE_IN_TEXT = re.compile(r"-m\s+(verl[\w.]*)")


def refuse_module(module: str) -> str | None:
    """Why a launch's module is not a verl job rlc imports, or None for main_ppo."""
    if module == "verl.trainer.main_ppo":
        return None
    if module in MODULES:
        return MODULES[module]
    if "sft" in module:
        return "supervised fine-tuning (SFT)"
    if "fully_async" in module or "one_step_off" in module:
        return f"verl's asynchronous trainer ({module})"
    return f"the program {module}, which is not verl's main_ppo"


class VerlScript:
    """A launch script of verl's trainer (`python3 -m verl.trainer.main_ppo ...`), written as a new spec v1 file."""

    name = "verl"
    what = "verl launch script"

    def accepts(self, launch: Launch) -> bool:
        return launch.module and launch.program.split(".")[0] in ("verl", "verl_mlite")

    def names_run(self, word: Word) -> bool:
        return names_run(word, RUN_NAMES)

    def refuse_unlaunched(self, script: Script) -> str | None:
        """Why a script that stops before its launch (a usage check on missing ARGS) is no job rlc imports."""
        modules = _MODULE_IN_TEXT.findall("\n".join(script.lines))
        why = next((w for w in map(refuse_module, modules) if w), None)
        if why and "verl.trainer.main_ppo" not in modules:
            return f"it runs {why}; rlc imports verl's main_ppo jobs, so nothing was written"
        return None

    def working_directory(self, script: Script, launch: Launch) -> tuple[str, str] | None:
        """verl's scripts name their configs `--config-path="$(pwd)/examples/..."` and are documented to run from
        verl's repository root: the nearest folder above the script that holds that config, and why."""
        try:
            config_name, config_path, _ = _arguments(launch)
        except NotImportable:
            return None
        if config_path is None or not config_path.pieces or not _is_pwd(config_path.pieces[0]):
            return None
        rest = "".join(p if isinstance(p, str) else "\0" for p in config_path.pieces[1:]).lstrip("/")
        if "\0" in rest:
            return None
        start = Path(script.name).resolve().parent
        for folder in (start, *start.parents):
            if (folder / rest / f"{config_name}.yaml").is_file():
                return str(folder), f"the folder above the script that holds {rest} (verl runs its scripts there)"
        return None

    def convert_launch(self, script: Script, launch: Launch) -> Imported:
        why = refuse_module(launch.program)
        if why:
            raise NotImportable(
                f"line {launch.line}: {launch.program} is {why}; rlc imports verl's main_ppo jobs, so nothing was "
                "written"
            )
        config_name, config_word, overrides = _arguments(launch)
        source = f"{script.name} (line {launch.line})"
        try:
            if config_name in CONFIG_NAMES or config_word is None:
                composed = compose_overrides(overrides, config_name)
            else:
                config_path = _config_path(config_word)
                own = (Path(script.name).parent / config_path / f"{config_name}.yaml").resolve()
                try:
                    data: Any = parse(read_text(own, str(own)), str(own))
                except LoadError as exc:
                    raise NotImportable(f"--config-name={config_name}: {exc.diagnostic.message}") from None
                if not isinstance(data, dict):
                    raise NotImportable(f"{own} is not a verl config")
                composed = compose_yaml(plain_yaml(data), lambda key: 0, overrides)
                source += f" with {own.name}"
        except ComposeError as exc:
            raise NotImportable(compose_failure(exc, overrides)) from None
        why = refusal(composed)
        if why:
            raise NotImportable(f"{why}: rlc does not run that, so nothing was written")
        return import_composed(composed, source)


def _reference(unknown: Unknown) -> str:
    """A variable the script never sets as Hydra reads the environment; a date as the import's (an error keeps it
    from being written unless it only names the run); a value only running the script gives as a
    plain placeholder (no `${`), which the reader's error about it keeps from being written."""
    if unknown.kind in ("env", "clock"):
        return environment_reference(unknown)
    return f"<{unknown.name or 'unknown'}>"


def _is_pwd(piece) -> bool:
    return isinstance(piece, Unknown) and piece.kind == "env" and piece.name == "PWD"


def _config_path(word: Word) -> str:
    """The folder --config-path names; one only running the script knows is refused, with the option that fixes it."""
    if word.known:
        return word.text
    if word.pieces and _is_pwd(word.pieces[0]):
        raise NotImportable(
            f"line {word.line}: --config-path={word.text} is under the folder the script runs in, and no folder above "
            "the script holds it: pass --cwd DIR (verl's repository root), so nothing was written"
        )
    unknown = word.unknowns[0]
    raise NotImportable(
        f"line {word.line}: --config-path={word.text} holds `{unknown.source}`, which only running the script gives:"
        f" pass --env {unknown.name or 'NAME'}=VALUE, so nothing was written"
    )


def _arguments(launch: Launch) -> tuple[str, Word | None, list[Override]]:
    """The Hydra options (--config-name, --config-path) and the overrides of a main_ppo command."""
    config_name: str = "ppo_trainer"
    config_path: Word | None = None
    overrides: list[Override] = []
    words = launch.args
    i = 0
    while i < len(words):
        text = words[i].text
        flag, eq, value = text.partition("=")
        if flag in ("--config-name", "-cn", "--config-path", "-cp"):
            word = words[i]
            if not eq:
                i += 1
                word = words[i] if i < len(words) else Word(("",), word.file, word.line, word.column)
                value = word.text
            if flag in ("--config-name", "-cn"):
                config_name = value.removesuffix(".yaml")
            else:
                config_path = _value_of(word) if eq else word
        elif text.startswith("-"):
            raise NotImportable(f"line {words[i].line}: {text}: a Hydra option rlc does not import (--multirun, ...)")
        else:
            overrides.append(Override(words[i].render(_reference), words[i].line))
        i += 1
    return config_name, config_path, overrides


def _value_of(word: Word) -> Word:
    """The value of a `--flag=value` word, its unknown parts kept."""
    head, *tail = word.pieces
    if not isinstance(head, str) or "=" not in head:  # the flag itself is computed: its text is all there is
        return Word((word.text.split("=", 1)[1],), word.file, word.line, word.column)
    rest = head.split("=", 1)[1]
    return Word(tuple(p for p in (rest, *tail) if p != ""), word.file, word.line, word.column)
