"""Extensions: separately installed packages that add fields, sections and accepted values to the spec.

A package declares an entry point in the group ``rlc.extensions`` that names a callable taking an
``Extensions`` object::

    [project.entry-points."rlc.extensions"]
    my_env = "my_pkg.rlc_ext:register"

    def register(ext):
        ext.add_fields("trainer.algorithm", MyAlgorithmKnobs)      # extra fields on a section
        ext.add_section("environment.my_env", MyEnvConfig)        # a new section
        ext.add_values("trainer.algorithm.policy_loss_type", ["my_loss"])
        ext.add_environment("my_env", MyEnvConfig)                # an env_class, with its section (optional)

An environment the extension declares is also registered for the runtime: an entry point in the group
``rlc.environments`` names its SkyRL-Gym class (entry-point name = env id)::

    [project.entry-points."rlc.environments"]
    my_env = "my_pkg.envs:MyEnv"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import field

from rlc.core.dataclass import dataclass

ENTRY_POINT_GROUP = "rlc.extensions"


class ExtensionError(Exception):
    """An extension declared something the spec cannot take."""


@dataclass
class Extensions:
    fields: dict[str, list[type]] = field(default_factory=dict)
    sections: dict[str, type] = field(default_factory=dict)
    values: dict[str, list[str]] = field(default_factory=dict)
    environments: list[str] = field(default_factory=list)  # env_class ids the extension's packages register
    origin: dict[str, str] = field(default_factory=dict)  # dotted path -> extension name, for explain
    current: str = "<direct>"

    def add_fields(self, section_path: str, cls: type) -> None:
        _require_dataclass(cls)
        self.fields.setdefault(section_path, []).append(cls)
        for f in dataclasses.fields(cls):
            self.origin[_join(section_path, f.name)] = self.current

    def add_section(self, path: str, cls: type) -> None:
        _require_dataclass(cls)
        if path in self.sections:
            raise ExtensionError(f"section {path} is registered twice")
        self.sections[path] = cls
        self.origin[path] = self.current

    def add_values(self, field_path: str, values: Iterable[str]) -> None:
        self.values.setdefault(field_path, []).extend(values)
        self.origin.setdefault(field_path + "#values", self.current)

    def add_environment(self, env_id: str, config: type | None = None) -> None:
        """An `environment.env_class` value; `config` (a dataclass) becomes `environment.skyrl_gym.<env_id>`, the
        settings the environment is built with."""
        if env_id in self.environments:
            raise ExtensionError(f"environment {env_id} is declared twice")
        self.environments.append(env_id)
        self.origin[f"environment.env_class#{env_id}"] = self.current
        if config is not None:
            self.add_section(f"environment.skyrl_gym.{env_id}", config)

    def is_empty(self) -> bool:
        return not (self.fields or self.sections or self.values or self.environments)


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


def _require_dataclass(cls: type) -> None:
    if not dataclasses.is_dataclass(cls):
        raise ExtensionError(f"{cls!r} is not a dataclass")


def _declared() -> dict[str, str]:
    """Every installed ``rlc.extensions`` entry point, name -> ``module:attr``, read from the metadata folders on
    sys.path as importlib.metadata reads them: the first distribution of a name on sys.path wins.

    importlib.metadata itself is not imported: it costs more than the whole rest of `rlc validate`.
    """
    import os
    import re
    import sys

    marker = f"[{ENTRY_POINT_GROUP}]"
    found: dict[str, str] = {}
    seen: set[str] = set()
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            dist = re.sub(r"[-_.]+", "_", name.rsplit(".", 1)[0].split("-")[0]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(entry or ".", name, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            if marker not in text:
                continue
            import configparser  # only where an extension is installed: its class body alone costs milliseconds

            parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            parser.optionxform = str  # type: ignore[assignment,method-assign]  # entry-point names keep their case
            try:
                parser.read_string(text)
            except configparser.Error:
                continue  # a broken metadata file: importlib.metadata would not load it either
            for ep_name, value in parser.items(ENTRY_POINT_GROUP):
                found.setdefault(ep_name, value)
    return found


def _load(value: str) -> Callable[[Extensions], None]:
    """The object an entry point's ``module:attr [extras]`` names."""
    import importlib

    module, _, attr = value.split("[", 1)[0].strip().partition(":")
    obj = importlib.import_module(module.strip())
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj  # type: ignore[return-value]


def load_installed() -> Extensions:
    """Run every installed ``rlc.extensions`` entry point, in the order of their names."""
    ext = Extensions()
    for name, value in sorted(_declared().items()):
        ext.current = name
        _load(value)(ext)
    ext.current = "<direct>"
    return ext
