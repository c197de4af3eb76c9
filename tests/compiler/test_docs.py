"""The README and docs/ show what rlc prints today, and link only to files that exist.

Every `$ rlc ...` line of a ```console block runs, from a copy of examples/ and tests/fixtures/ (so `-o` and the
build directory land there), and what it prints (stdout and stderr as a terminal shows them) must be the lines shown
under it; a line that is only `...` stands for any number of lines. The blocks of one page run in order in one
directory, so a page may migrate a file and then diff it. Commands that train or start a cluster (`rlc run`,
`rlc launch`, `rlc plot`) are too slow here, wherever they are shown (console or bash blocks): their arguments must
parse, and the spec with its overrides must compile (the e2e tests run the examples).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import click
import pytest
from conftest import ROOT, rlc_executable
from rlc.compiler.cli import cli

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
ELIDED = "..."
SLOW = {"run", "launch", "plot"}  # train, start a cluster, or read a finished run


@dataclass
class Shown:
    """One command of a page: where it is, its words after `rlc`, and the output shown under it (None: not shown)."""

    where: str
    args: list[str]
    output: list[str] | None = None


def rlc_words(command: str) -> list[str] | None:
    """The arguments of an `rlc` (or `.venv/bin/rlc`) command line, comments and a redirection or pipe that follows
    dropped; None for any other command."""
    if command.split(maxsplit=1)[:1] not in (["rlc"], [".venv/bin/rlc"]):
        return None
    words = shlex.split(command, comments=True)
    words = words[: next((i for i, w in enumerate(words) if w in (">", ">>", "|", "&&", ";")), len(words))]
    if words and words[0] in ("rlc", ".venv/bin/rlc"):
        return words[1:]
    return None


def commands(page: Path) -> list[Shown]:
    """Every rlc command of a page's console and bash blocks, with the output shown under console commands."""
    text = page.read_text(encoding="utf-8")
    found: list[Shown] = []
    for block in FENCE.finditer(text):
        lang, body = block.group(1), block.group(2)
        line = text.count("\n", 0, block.start(2)) + 1
        where = f"{page.relative_to(ROOT)}:{line}"
        if lang == "console":
            current: list[str] | None = None
            for i, row in enumerate(body.splitlines()):
                if row.startswith("$ "):
                    words = rlc_words(row[2:])
                    assert words is not None, f"{where}+{i}: a console block shows only rlc commands: {row}"
                    current = []
                    found.append(Shown(f"{where}+{i}", words, output=current))
                else:
                    assert current is not None, f"{where}: output shown before any command"
                    current.append(row.rstrip())
        elif lang in ("bash", "sh"):
            for i, row in enumerate(body.replace("\\\n", " ").splitlines()):
                words = rlc_words(row)
                if words is not None:
                    found.append(Shown(f"{where}+{i}", words))
    return found


def matches(shown: list[str], actual: list[str]) -> bool:
    """Whether `actual` is `shown` with each `...` line standing for any number of lines."""

    @cache
    def at(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(actual)
        if shown[i] == ELIDED:
            return any(at(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and shown[i] == actual[j] and at(i + 1, j + 1)

    return at(0, 0)


def parse(args: list[str]) -> click.Command:
    """Parse `rlc ARGS` as the CLI would (a usage error raises) without running it; returns the command."""
    command: click.Command = cli
    ctx = cli.make_context("rlc", [], resilient_parsing=True)
    rest = list(args)
    while isinstance(command, click.Group):
        assert rest, f"rlc {shlex.join(args)}: no command"
        sub = command.get_command(ctx, rest[0])
        assert sub is not None, f"rlc {shlex.join(args)}: no command {rest[0]!r}"
        name, rest, command = rest[0], rest[1:], sub
        ctx = command.make_context(name, list(rest), parent=ctx) if not isinstance(command, click.Group) else ctx
    return command


def as_compile(args: list[str], out: Path) -> list[str]:
    """`rlc run|launch SPEC [OVERRIDES] [OPTIONS]` as the `rlc compile` of the same spec and overrides."""
    positional, options = [], []
    words = iter(args[1:])
    for word in words:
        if word in ("--address", "--sky-arg", "-o", "--out"):
            next(words, None)
        elif word.startswith("--target"):
            options += [word] if "=" in word else [word, next(words)]
        elif not word.startswith("-"):
            positional.append(word)
    return ["compile", *positional, *options, "-o", str(out)]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # A new user's machine: an empty HOME and no rlc cache (what other tests built there changes `rlc plan`'s
    # "from table" into "from config.json").
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "RLC_DEBUG", "RLC_CACHE")}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1", HOME=str(cwd / "home"))
    return subprocess.run(
        [rlc_executable(), *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def workspace(tmp_path: Path) -> Path:
    """What the pages' commands read, at the same relative paths as in the checkout."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    shutil.copytree(ROOT / "tests" / "fixtures", tmp_path / "tests" / "fixtures")
    (tmp_path / "home").mkdir()
    return tmp_path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_print_what_the_page_shows(page, tmp_path):
    cwd = workspace(tmp_path)
    for n, shown in enumerate(commands(page)):
        command = parse(shown.args)
        if shown.args[0] in SLOW:
            if command.name in ("run", "launch"):
                done = run(as_compile(shown.args, tmp_path / f"slow-{n}"), cwd)
                assert done.returncode == 0, (
                    f"{shown.where}: the spec of `rlc {shlex.join(shown.args)}`:\n{done.stdout}"
                )
            continue
        if shown.args[0] == "data" and importlib.util.find_spec("pyarrow") is None:
            pytest.skip(f"{shown.where}: `rlc data` needs the runtime (pyarrow), which this venv has not")
        done = run(shown.args, cwd)
        if shown.output is None:
            assert done.returncode == 0, f"{shown.where}: `rlc {shlex.join(shown.args)}` failed:\n{done.stdout}"
            continue
        actual = [line.rstrip() for line in done.stdout.rstrip("\n").splitlines()]
        expected = shown.output[:]
        while expected and not expected[-1]:
            expected.pop()
        assert matches(expected, actual), f"{shown.where}: `rlc {shlex.join(shown.args)}` now prints:\n" + "\n".join(
            actual
        )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_name_files(page):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.relative_to(ROOT)}: the link {target} names no file"


def test_the_checker_sees_drift():
    """The matcher the page test relies on: an elision stands for lines, a changed or missing line does not match."""
    actual = ["a: valid", "b", "c", "1 error(s)"]
    assert matches(["a: valid", ELIDED, "1 error(s)"], actual)
    assert matches(["a: valid", "b", "c", "1 error(s)", ELIDED], actual)
    assert not matches(["a: valid", ELIDED, "2 error(s)"], actual)
    assert not matches(["a: valid", "b"], actual)
    with pytest.raises(click.UsageError):
        parse(["validate", "examples/local-cpu.yaml", "--no-such-option"])
