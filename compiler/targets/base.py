"""Interim (until the spine's compiler/targets/base.py lands): the Target interface of TARGET_INTERFACE.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlc.compiler.targets import _env, _setup_line, heredoc_end, install_requirement, job_dir, node_context

setup_line = _setup_line

__all__ = [
    "Launch",
    "Target",
    "TargetInput",
    "heredoc_end",
    "install_requirement",
    "job_dir",
    "node_context",
    "render",
    "setup_line",
]


@dataclass(frozen=True)
class TargetInput:
    """What every target renders from: the compiled job, already decided and written as text."""

    spec: Any
    plan: dict
    files: Mapping[str, str]
    source: str
    digest: str
    out_dir: str


@dataclass(frozen=True)
class Launch:
    """How `rlc launch` starts a compiled job: the command, run from the current directory."""

    argv: list[str]
    needs: str | None = None
    install_hint: str = ""


class Target(Protocol):
    name: str
    summary: str

    def files(self, job: TargetInput) -> dict[str, str]: ...

    def launch(self, out_dir: Path, job: TargetInput) -> Launch: ...


def render(template: str, **ctx: Any) -> str:
    return _env().get_template(template).render(**ctx)
