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

from rlc.compiler.importers.base import Imported, NotImportable, environment_reference
from rlc.compiler.importers.shell import Launch, Script, Unknown
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

    def refuse_unlaunched(self, script: Script) -> str | None:
        """Why a script that stops before its launch (a usage check on missing ARGS) is no job rlc imports."""
        modules = _MODULE_IN_TEXT.findall("\n".join(script.lines))
        why = next((w for w in map(refuse_module, modules) if w), None)
        if why and "verl.trainer.main_ppo" not in modules:
            return f"it runs {why}; rlc imports verl's main_ppo jobs, so nothing was written"
        return None

    def convert_launch(self, script: Script, launch: Launch) -> Imported:
        why = refuse_module(launch.program)
        if why:
            raise NotImportable(
                f"line {launch.line}: {launch.program} is {why}; rlc imports verl's main_ppo jobs, so nothing was "
                "written"
            )
        config_name, config_path, overrides = _arguments(launch)
        source = f"{script.name} (line {launch.line})"
        try:
            if config_name in CONFIG_NAMES or config_path is None:
                composed = compose_overrides(overrides, config_name)
            else:
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
    """A variable the script never sets as Hydra reads the environment; a value only running the script gives as a
    plain placeholder (no `${`), which the reader's error about it keeps from being written."""
    if unknown.kind == "env":
        return environment_reference(unknown)
    return f"<{unknown.name or 'unknown'}>"


def _arguments(launch: Launch) -> tuple[str, str | None, list[Override]]:
    """The Hydra options (--config-name, --config-path) and the overrides of a main_ppo command."""
    config_name, config_path = "ppo_trainer", None
    overrides: list[Override] = []
    words = launch.args
    i = 0
    while i < len(words):
        text = words[i].text
        flag, eq, value = text.partition("=")
        if flag in ("--config-name", "-cn", "--config-path", "-cp"):
            if not eq:
                i += 1
                value = words[i].text if i < len(words) else ""
            if flag in ("--config-name", "-cn"):
                config_name = value.removesuffix(".yaml")
            else:
                config_path = value
        elif text.startswith("-"):
            raise NotImportable(f"line {words[i].line}: {text}: a Hydra option rlc does not import (--multirun, ...)")
        else:
            overrides.append(Override(words[i].render(_reference), words[i].line))
        i += 1
    return config_name, config_path, overrides
