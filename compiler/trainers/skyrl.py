"""SkyRL's trainer as the job's trainer (`launch.trainer: skyrl`): the resolved spec as SkyRL's own command line,
`python -m skyrl.train.entrypoints.main_base key=value ...`, as SkyRL's launch scripts write it.

Spec v1's data/trainer/generator/environment are SkyRL 0.4.0's config key for key (`skyrl_config.py`), so the command
carries, under SkyRL's own keys, every value that differs from SkyRL's default and the placement always (so the job
reads where everything runs), then `launch.trainer_settings.skyrl` as written. Each value is written so that
`SkyRLTrainConfig.from_cli_overrides` (OmegaConf reading it as YAML) gives back exactly that value;
tests/compiler/test_skyrl_trainer.py holds that with SkyRL's own code.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from rlc.compiler.rules import skyrl_trainer
from rlc.compiler.trainers.base import TrainerCommand
from rlc.compiler.trainers.skyrl_config import PLACEMENT_KEYS, requirement_extras, skyrl_keys, skyrl_values
from rlc.spec.skyrl_release import SKYRL_RELEASE

if TYPE_CHECKING:
    from rlc.compiler.rules.base import Rule
    from rlc.spec.root import RlcSpec

MAIN_BASE = "skyrl.train.entrypoints.main_base"

# A string YAML reads back as itself when written bare: no quote, space, flow or comment character, not starting
# like a number, and none of YAML 1.1's words for booleans and null (OmegaConf reads values with PyYAML).
_BARE = re.compile(r"[A-Za-z/_~][A-Za-z0-9_./~@+-]*")
_YAML_WORDS = frozenset(
    w
    for word in ("yes", "no", "true", "false", "on", "off", "null", "y", "n", "~")
    for w in (word, word.capitalize(), word.upper())
)


def cli_value(value: Any) -> str:
    """`value` as the right-hand side of a SkyRL `key=value` override: YAML that reads back as exactly `value`
    (JSON's spelling of strings, lists and mappings, as SkyRL's own `overrides_dict_to_dotlist` writes them, and
    YAML's of non-finite floats, which JSON lacks); a plain word is left bare, as SkyRL's scripts write it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, str):
        bare = _BARE.fullmatch(value) and value not in _YAML_WORDS and "${" not in value
        return value if bare else json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k), ensure_ascii=False)}: {_nested(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


def _nested(value: Any) -> str:
    """A value inside a list or mapping: strings always quoted (a bare word there could read as a key)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else cli_value(value)


def overrides(spec: RlcSpec) -> tuple[str, ...]:
    """SkyRL's `key=value` overrides that build the resolved spec's config, then launch.trainer_settings.skyrl."""
    defaults = skyrl_keys()
    out = []
    for key, value in skyrl_values(spec).items():
        # a leaf of an optional section SkyRL leaves null is written whatever its value: it creates the section
        fills_section = key not in defaults
        if fills_section or key in PLACEMENT_KEYS or value != defaults[key]:
            out.append(f"{key}={cli_value(value)}")
    settings = spec.launch.trainer_settings.get("skyrl", {}) if isinstance(spec.launch.trainer_settings, dict) else {}
    out.extend(f"{key}={cli_value(value)}" for key, value in (settings or {}).items())
    return tuple(out)


class SkyRLTrainer:
    name = "skyrl"
    release = SKYRL_RELEASE
    summary = "SkyRL's trainer (skyrl.train.entrypoints.main_base), given every value of the spec as its overrides"

    def command(self, spec: RlcSpec, plan: dict, version: str) -> TrainerCommand:
        extras = ",".join(requirement_extras(spec))
        return TrainerCommand(MAIN_BASE, overrides(spec), (f"skyrl[{extras}]=={version}",))

    def rules(self) -> tuple[Rule, ...]:
        return skyrl_trainer.RULES


SKYRL = SkyRLTrainer()
