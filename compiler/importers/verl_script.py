"""A verl launch script imported: its training command found by the static reader (rlc.compiler.importers.shell),
its Hydra arguments composed and mapped as any verl job (rlc.compiler.importers.verl). Nothing is run.

`--config-name`/`--config-path` are read as Hydra reads them: `ppo_trainer` and `ppo_megatron_trainer` are verl's
own; another name is the script's own YAML (`<config-path>/<name>.yaml`, relative to the script), composed with
its `defaults:` list. A value the reader cannot know (a `$(...)`, a variable the script requires) refuses the
import with its line and the `--env NAME=VALUE` that fixes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlc.compiler.importers.base import NotImportable
from rlc.compiler.importers.hydra_overrides import Override
from rlc.compiler.importers.shell import Launch, read_script
from rlc.compiler.importers.verl_compose import CONFIG_NAMES
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
# Keys whose value is only a name: a part the reader cannot know (a `$(date ...)`) is kept as the script writes it.
LABELS = ("trainer.experiment_name", "trainer.project_name")
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


@dataclass
class ScriptJob:
    """The main_ppo command a script runs: its overrides, and the config it composes on."""

    source: str  # "run.sh (line 42)"
    config_name: str  # ppo_trainer, ppo_megatron_trainer, or the name of the script's own YAML
    own: dict | None  # the script's own YAML (--config-path), when it names one
    overrides: list[Override]  # a part the reader cannot know is written <NAME> (see `unread`)
    unread: str | None = None  # why some values cannot be known statically (with the --env that fixes them)


def read_job(path: str, env: dict[str, str] | None = None, argv: tuple[str, ...] = ()) -> ScriptJob:
    """The main_ppo command of a launch script, read statically; NotImportable names why there is none."""
    script = read_script(Path(path), name=path, env=env, argv=argv)
    launch, diagnostics = script.command(accept=lambda x: x.module)
    if launch is None:
        modules = _MODULE_IN_TEXT.findall("\n".join(script.lines))
        why = next((w for w in map(refuse_module, modules) if w), None)
        if why and "verl.trainer.main_ppo" not in modules:
            raise NotImportable(f"{path} runs {why}; rlc imports verl's main_ppo jobs, so nothing was written")
        raise NotImportable(_problems([d for d in diagnostics if d.is_error]))
    why = refuse_module(launch.program)
    if why:
        raise NotImportable(
            f"line {launch.line}: {launch.program} is {why}; rlc imports verl's main_ppo jobs, so nothing was written"
        )
    labels = {w.line for w in launch.args if not w.known and _key(w.text) in LABELS}
    errors = [d for d in diagnostics if d.is_error and (d.location is None or d.location.line not in labels)]
    unknown = [w for w in launch.args if not w.known and _key(w.text) not in LABELS]
    config_name, config_path, overrides = _arguments(launch)
    unread = _problems(errors, unknown) if errors or unknown else None
    source = f"{path} (line {launch.line})"
    if config_name in CONFIG_NAMES or config_path is None:
        return ScriptJob(source, config_name, None, overrides, unread)
    own = (Path(path).parent / config_path / f"{config_name}.yaml").resolve()
    try:
        data: Any = parse(read_text(own, str(own)), str(own))
    except LoadError as exc:
        raise NotImportable(f"--config-name={config_name}: {exc.diagnostic.message}") from None
    if not isinstance(data, dict):
        raise NotImportable(f"{own} is not a verl config")
    return ScriptJob(f"{source} with {own.name}", config_name, plain_yaml(data), overrides, unread)


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
            overrides.append(Override(words[i].render(_placeholder), words[i].line))
        i += 1
    return config_name, config_path, overrides


def _placeholder(unknown) -> str:
    """An unknown part as a plain word (no `${`, which Hydra would read as an interpolation)."""
    if unknown.name:
        return f"<{unknown.name}>"
    command = re.match(r"\$\(\s*([\w.-]+)", unknown.source)  # `$(date +%m%d)` -> <date>
    return f"<{command.group(1) if command else 'unknown'}>"


def _key(word: str) -> str:
    return word.partition("=")[0].lstrip("+~")


def _problems(diagnostics: list, unknown: list | None = None) -> str:
    parts = []
    for d in diagnostics:
        at = f"line {d.location.line}: " if d.location is not None and d.location.line else ""
        parts.append(f"{at}{d.message}" + (f" ({d.hint})" if d.hint else ""))
    said = {d.location.line for d in diagnostics if d.location is not None}
    for word in unknown or []:
        if word.line in said:
            continue
        names = sorted({u.name for u in word.unknowns if u.name})
        fix = f" (pass {' '.join(f'--env {n}=VALUE' for n in names)})" if names else ""
        parts.append(f"line {word.line}: {word.text} depends on what the script does not set{fix}")
    return "the launch cannot be read statically: " + "; ".join(parts)
