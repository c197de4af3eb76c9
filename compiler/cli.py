"""The `rlc` command line. Each command imports what it needs when it runs, so `rlc` starts fast."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rlc.core.environments import Option as WriterOption
    from rlc.core.environments import Writer

EXIT_OK, EXIT_SPEC, EXIT_USAGE = 0, 1, 2


def _color(stream) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def _parse_overrides(values: tuple[str, ...]):
    # deferred: overrides are parsed only when a command line has some (start-up)
    from rlc.core.overrides import OverrideError, parse_override

    try:
        return [parse_override(v) for v in values]
    except OverrideError as exc:
        msg = str(exc) + (f"\n  help: {exc.hint}" if exc.hint else "")
        raise click.UsageError(msg) from None


def _compile(spec: str, ovs):
    """The one pipeline every command runs; an override that cannot apply to this spec (e.g. below a scalar) is a
    usage error."""
    # deferred: as in _parse_overrides
    from rlc.core.overrides import OverrideError

    try:
        return _pipeline().compile_job(spec, ovs)
    except OverrideError as exc:
        raise click.UsageError(str(exc) + (f"\n  help: {exc.hint}" if exc.hint else "")) from None


def _pipeline():
    """rlc.compiler.pipeline, imported the first time with the cyclic garbage collector paused, then what the import
    built frozen (gc.freeze). Modules, classes, functions and tables live until the process exits: a collection while
    they are built finds nothing to free, and once frozen no later collection, the one at exit included, walks them
    again: about 13 ms of the 105 `rlc validate` took without it (bench/RESULTS.md)."""
    # deferred: gc only for the pipeline's first import (start-up)
    import gc

    if "rlc.compiler.pipeline" in sys.modules or not gc.isenabled():
        # deferred: the pipeline, imported once with the collector paused (see above)
        from rlc.compiler import pipeline

        return pipeline
    gc.disable()
    try:
        # deferred: the pipeline, imported once with the collector paused (see above)
        from rlc.compiler import pipeline
    finally:
        gc.freeze()
        gc.enable()
    return pipeline


def _emit(diags, fmt: str, ok_line: str, **extra) -> int:
    # deferred: the renderers only when there is something to print (start-up)
    from rlc.core.diagnostics import has_errors, render_json, render_text

    if fmt == "json":
        click.echo(render_json(diags, **extra))
    else:
        if diags:
            click.echo(render_text(diags, _color(sys.stderr)), err=True)
        if not has_errors(diags):
            click.echo(ok_line)
    return EXIT_SPEC if has_errors(diags) else EXIT_OK


def _warn(diags) -> None:
    """Warnings of a spec that compiles, on stderr, before a command's own output."""
    # deferred: the renderers only when there is something to print (start-up)
    from rlc.core.diagnostics import render_text

    if diags:
        click.echo(render_text(diags, _color(sys.stderr)), err=True)


FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Diagnostics as compiler text (stderr) or JSON (stdout).",
)


class RegistryChoice(click.Choice):
    """One of a registry's names, read only when a command line that uses it is parsed (importing a registry costs
    start-up time every other command would pay)."""

    def __init__(self, names: Callable[[], tuple[str, ...]]):
        self._names = names
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        return self._names()


def _target_names() -> tuple[str, ...]:
    # deferred: the targets' registry only when --target is parsed (start-up)
    from rlc.compiler.targets import TARGETS

    return tuple(t.name for t in TARGETS)


def _trainer_names() -> tuple[str, ...]:
    # deferred: the trainers' registry only when --trainer is parsed (start-up)
    from rlc.compiler.trainers import TRAINERS

    return tuple(t.name for t in TRAINERS)


def _importer_names() -> tuple[str, ...]:
    # deferred: the importers' registry only when --from is parsed (start-up)
    from rlc.compiler.importers.registry import IMPORTERS

    return tuple(i.name for i in IMPORTERS)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rlc")
def cli() -> None:
    """rlc: check, resolve, plan and launch LLM RL post-training jobs."""


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@FORMAT
def validate(spec: str, overrides: tuple[str, ...], fmt: str) -> None:
    """Check SPEC (plus key=value OVERRIDES) and report every problem.

    Exit 0 when valid, 1 when the spec has errors, 2 on a usage error.
    """
    result = _compile(spec, _parse_overrides(overrides))
    suffix = f" ({result.warnings} warning(s))" if result.warnings else ""
    sys.exit(_emit(result.diagnostics, fmt, f"{spec}: valid{suffix}", file=spec))


@cli.command()
def schema() -> None:
    """Print the JSON Schema of spec v1 (with installed extensions)."""
    # deferred: only `rlc schema` needs it: kept out of the other commands' start-up
    from rlc.spec.model import default_model
    from rlc.spec.schema import build_schema, dumps

    click.echo(dumps(build_schema(default_model())), nl=False)


@cli.command()
@click.argument("key")
def explain(key: str) -> None:
    """Describe KEY: its type, default, doc, accepted values and the rules that involve it."""
    # deferred: only `rlc explain` needs it: kept out of the other commands' start-up
    from rlc.compiler.explain import explain_key

    text, ok = explain_key(key)
    click.echo(text)
    sys.exit(EXIT_OK if ok else EXIT_USAGE)


@cli.command()
@click.argument("old", type=click.Path())
@click.argument("args", nargs=-1)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the migrated spec here (must not exist).")
@click.option("--in-place", is_flag=True, help="Rewrite OLD itself.")
@click.option("--check", is_flag=True, help="Exit 1 when OLD needs migrating; write nothing.")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff instead of the migrated file.")
@click.option("--force", is_flag=True, help="Let -o replace an existing file.")
@click.option(
    "--from",
    "source",
    type=RegistryChoice(_importer_names),
    default=None,
    help="What OLD is: a legacy SkyRL config (the default), an AReaL experiment config (RL only), or a verl job "
    "(a Hydra run directory, its overrides.yaml, a verl YAML) to import. A launch script (.sh, or a bash shebang; "
    "SkyRL's or verl's) is recognised by itself.",
)
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="NAME=VALUE",
    help="A launch script's environment variable (repeatable); it also stands for a value the script computes "
    "with $(...).",
)
@click.option(
    "--cwd",
    type=click.Path(file_okay=False),
    default=None,
    help="The folder a launch script runs in, which its $(pwd) and $PWD stand for (default: for verl's scripts, "
    "the folder above the script holding its --config-path, verl's repository root).",
)
@click.option(
    "--trainer",
    type=RegistryChoice(_trainer_names),
    default=None,
    help="Run the imported job on this trainer (sets launch.trainer): keep SkyRL's or verl's own trainer, with "
    "rlc's checks and launch files.",
)
def migrate(
    old: str,
    args: tuple[str, ...],
    output: str | None,
    in_place: bool,
    check: bool,
    show_diff: bool,
    force: bool,
    source: str | None,
    env: tuple[str, ...],
    cwd: str | None,
    trainer: str | None,
) -> None:
    """Rewrite a legacy SkyRL config OLD as the current spec, keeping comments, and report each change.

    With --from areal, import an AReaL experiment config instead: every key is reported as mapped, dropped or
    not carried, and SFT, DPO and reward-model configs are refused. With --from verl, import a verl main_ppo job
    (a Hydra run directory, overrides.yaml or verl YAML) composed as verl composes it (docs/verl.md). A launch
    script OLD (SkyRL's `uv run ... -m skyrl.train.entrypoints.main_base key=value ...`, verl's `python3 -m
    verl.trainer.main_ppo ...`) is read without running anything and written as a new spec, each value
    commented with its script line; ARGS fill its "$@". Without -o/--in-place
    the result goes to stdout and no file is touched.
    """
    # deferred: only `rlc migrate` needs it: kept out of the other commands' start-up; tree-sitter only for a script
    from rlc.compiler.importers.registry import importer
    from rlc.compiler.importers.scripts import is_script
    from rlc.compiler.migration import OUT, MigrateUsageError, migrate_file, migrate_script
    from rlc.core.diagnostics import render_text

    if output and in_place:
        raise click.UsageError("use either -o/--output or --in-place, not both")
    environment = {}
    for item in env:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise click.BadParameter(f"'{item}' is not NAME=VALUE", param_hint="--env")
        environment[name] = value
    script = source in (None, "verl") and os.path.isfile(old) and is_script(old)
    if not script and (args or env or cwd):
        given = "ARGS" if args else "--env" if env else "--cwd"
        raise click.UsageError(f"{given} applies to a launch script only; {old} is read as a YAML config")
    if cwd is not None and "PWD" in environment:
        raise click.UsageError("--cwd and --env PWD=... both say where the script runs: give one")
    if script and (in_place or check or show_diff):
        raise click.UsageError(
            "a launch script is imported as a new spec: use -o NEW (or stdout), not --in-place/--check/--diff"
        )
    chosen = importer(source or "skyrl")
    if not script and not chosen.rewrites and (in_place or check or show_diff):
        raise click.UsageError(
            f"--from {source} writes a new spec: use -o NEW (or stdout), not --in-place/--check/--diff"
        )
    try:
        if script:
            outcome = migrate_script(old, environment, list(args), output, force, trainer, cwd)
        else:
            outcome = migrate_file(old, chosen, output, in_place, check, show_diff, force, trainer)
    except MigrateUsageError as exc:
        raise click.UsageError(str(exc)) from None
    if outcome.diagnostics:
        click.echo(render_text(outcome.diagnostics, sys.stderr.isatty()), err=True)
    for stream, text in outcome.shown:
        click.echo(text, nl=False, err=stream != OUT)
    sys.exit(outcome.code)


def _trainer_line(spec) -> str:
    """Which trainer runs the job, and its release: `rlc plan`'s first line."""
    # deferred: the trainer registry only for the commands that show it
    from rlc.compiler.trainers import trainer, version_of

    chosen = trainer(spec.launch.trainer)
    version = version_of(spec)
    return f"{chosen.name}{' ' + version if version else ''} ({chosen.summary})"


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option(
    "--svg",
    "svg_path",
    type=click.Path(dir_okay=False),
    help="Write the picture here [default: build/<name>/plan.svg].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="A node x GPU table, or the plan as JSON (stdout).",
)
def plan(spec: str, overrides: tuple[str, ...], svg_path: str | None, fmt: str) -> None:
    """Show which role and engine of SPEC runs on which node and GPU, and the Ray placement groups.

    Also draws the table as an SVG picture. Each GPU's estimated peak memory, capacity and parts are shown whether
    or not it fits. Exit 0 when the job fits, 1 when the spec has errors or the placement or memory does not fit,
    2 on a usage error.
    """
    # deferred: only `rlc plan` needs it: kept out of the other commands' start-up
    import json
    from pathlib import Path

    from rlc.compiler.plan_svg import render_svg, render_table
    from rlc.core.diagnostics import render_json, render_text

    result = _compile(spec, _parse_overrides(overrides))
    diags, layout = result.diagnostics, result.plan
    # A plan whose memory was estimated is shown whether or not every GPU fits: that is when its parts are needed.
    if layout is None or (result.memory is None and not result.ok):
        if fmt == "json":
            click.echo(render_json(diags, file=spec))
        else:
            click.echo(render_text(diags, _color(sys.stderr)), err=True)
        sys.exit(EXIT_SPEC)
    if diags and fmt == "text":
        click.echo(render_text(diags, _color(sys.stderr)), err=True)
    target = Path(svg_path or Path("build") / layout.name / "plan.svg")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render_svg(layout, result.memory), encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot write {target}: {exc.strerror or exc}", param_hint="--svg") from None
    # deferred: the time estimate only when `rlc plan` shows it
    from rlc.compiler.estimate import estimate_time, render_time

    timing = estimate_time(result.spec, layout, result.memory) if result.spec is not None else None
    if fmt == "json":
        data = layout.to_json()
        if result.memory is not None:
            data["memory"] = result.memory.to_json()
        data["time"] = timing.to_json() if timing else None
        if result.decisions is not None:
            data["sandbox"] = result.decisions.to_json()["sandbox"]
        if result.spec is not None:
            data["trainer"] = _trainer_line(result.spec)
        data.update(json.loads(render_json(diags)))  # ok, errors, warnings and the diagnostics beside the plan
        click.echo(json.dumps(data, indent=2))
    else:
        # deferred: the memory and sandbox renderers only for text output
        from rlc.compiler.plan_svg import render_memory, render_sandbox

        if result.spec is not None:
            click.echo(f"trainer: {_trainer_line(result.spec)}")
        click.echo(render_table(layout, _color(sys.stdout)))
        if result.memory is not None:
            click.echo(render_memory(result.memory))
        click.echo(render_time(timing))
        if result.decisions is not None:
            click.echo(render_sandbox(result.decisions.sandbox))
        click.echo(f"picture: {target}")
    sys.exit(EXIT_OK if result.ok else EXIT_SPEC)


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option("--write", is_flag=True, help="Write the changes (and OVERRIDES) into SPEC, comments kept.")
@click.option("--max", "largest", is_flag=True, help="For a job that fits: the largest micro-batches that still fit.")
@click.option(
    "--headroom",
    type=click.FloatRange(0, 0.5),
    default=0.0,
    show_default=True,
    help="Fraction of each GPU to leave free (0: fit as the memory rules do).",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def fit(spec: str, overrides: tuple[str, ...], write: bool, largest: bool, headroom: float, fmt: str) -> None:
    """Propose the smallest set of changes that makes SPEC fit its GPUs, and what each costs.

    Exit 0 when it fits or a proposal was found, 1 when the spec has other errors or nothing tried fits.
    """
    # deferred: only `rlc fit` needs it: kept out of the other commands' start-up
    from rlc.compiler.fit import fit as find_fit
    from rlc.compiler.fit_report import render

    outcome = find_fit(spec, _parse_overrides(overrides), headroom, largest)
    text, code = render(spec, outcome, write, fmt)
    click.echo(text, err=code != EXIT_OK and fmt == "text")
    sys.exit(code)


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option(
    "-o", "--out", "out_dir", type=click.Path(file_okay=False), help="Output directory (default build/<name>)."
)
@click.option(
    "--target",
    "target",
    type=RegistryChoice(lambda: (*_target_names(), "all")),
    default="all",
    show_default=True,
    help="Which launch files to write besides resolved.yaml and plan.json.",
)
@FORMAT
def compile(spec: str, overrides: tuple[str, ...], out_dir: str | None, target: str, fmt: str) -> None:
    """Check SPEC, resolve every value, plan placement and write the compiled job.

    Writes resolved.yaml (every field explicit, provenance as comments, content hash), plan.json, and the
    launch files: sky.yaml (SkyPilot), ray/runtime_env.yaml + ray/submit.sh, kuberay/rayjob.yaml, slurm/job.sbatch.
    """
    # deferred: only `rlc compile` needs it: kept out of the other commands' start-up
    from pathlib import Path

    from rlc.compiler.emit import build, write
    from rlc.compiler.targets import TARGETS
    from rlc.compiler.targets import target as named

    result = _compile(spec, _parse_overrides(overrides))
    diags = result.diagnostics
    if not result.ok or result.spec is None:
        sys.exit(_emit(diags, fmt, ""))
    out = Path(out_dir) if out_dir else Path("build") / result.spec.name
    compiled = build(result, TARGETS if target == "all" else (named(target),), str(out))
    paths = write(compiled, out)
    listing = ", ".join(str(p.relative_to(out)) for p in paths)
    sys.exit(_emit(diags, fmt, f"{spec}: compiled to {out}/ ({listing})", out=str(out), content_hash=compiled.digest))


@cli.command()
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@FORMAT
def diff(a: str, b: str, overrides: tuple[str, ...], fmt: str) -> None:
    """Compare two specs after migrating and resolving both: what will run differently.

    OVERRIDES apply to both sides. Exit 0 when they resolve to the same job, 1 when they differ (or
    a spec has errors).
    """
    # deferred: only `rlc diff` needs it: kept out of the other commands' start-up
    import json

    from rlc.compiler.diff import compare, render_text
    from rlc.compiler.provenance import trace

    ovs = _parse_overrides(overrides)
    sides = []
    for path in (a, b):
        result = _compile(path, ovs)
        if not result.ok or result.plan is None:
            sys.exit(_emit(result.diagnostics, fmt, "", file=path))
        if fmt == "text":  # the warnings every other command shows for this spec
            _warn(result.diagnostics)
        analysis = result.analysis
        sides.append(
            (analysis.spec, trace(analysis.resolution, analysis.doc, analysis.migration), result.plan.to_json())
        )
    result = compare(*sides[0], *sides[1])
    if fmt == "json":
        click.echo(json.dumps({"a": a, "b": b, **result.to_json()}, indent=2, default=str))
    else:
        click.echo(render_text(result, a, b))
    sys.exit(EXIT_OK if result.same else EXIT_SPEC)


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("spec", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option(
    "-o", "--out", "out_dir", type=click.Path(file_okay=False), help="Output directory (default build/<name>)."
)
@click.option(
    "--target",
    "target_name",
    type=RegistryChoice(_target_names),
    help="Where to start the job [default: the spec's launch.target].",
)
@click.option(
    "--sky-arg", "sky_args", multiple=True, help="Extra argument for `sky launch` (repeatable), e.g. --sky-arg=--yes."
)
def launch(
    spec: str, overrides: tuple[str, ...], out_dir: str | None, target_name: str | None, sky_args: tuple[str, ...]
) -> None:
    """Compile SPEC, then start it on its launch target (--target, else the spec's launch.target).

    skypilot: `sky launch` of the SkyPilot task on a cluster named after the job (needs SkyPilot's `sky`:
    `pip install 'rlc[launch]'`, best in its own environment); ray: ray/submit.sh to RAY_ADDRESS (needs `ray`);
    kuberay: `kubectl apply` of the RayJob; slurm: `sbatch` of the batch script, which prints the job id; local:
    trains here, as `rlc run` does.
    """
    # deferred: only `rlc launch` needs it: kept out of the other commands' start-up
    import shutil
    import subprocess
    from pathlib import Path

    from rlc.compiler.emit import build, write
    from rlc.compiler.targets import target as named

    result = _compile(spec, _parse_overrides(overrides))
    if not result.ok or result.spec is None:
        sys.exit(_emit(result.diagnostics, "text", ""))
    _warn(result.diagnostics)
    chosen = named(target_name or result.spec.launch.target)
    if sky_args and chosen.name != "skypilot":
        raise click.UsageError(f"--sky-arg is for the skypilot target, not {chosen.name}")
    out = Path(out_dir) if out_dir else Path("build") / result.spec.name
    compiled = build(result, (chosen,), str(out))
    how = chosen.launch(out, compiled.job)
    command = [*how.argv, *sky_args]
    if how.needs is None:
        _need_runtime("launch")  # the job runs here, on this Python's rlc runtime
    elif (found := shutil.which(how.needs)) is None:
        click.echo(f"rlc launch: the `{how.needs}` command is not on PATH; {how.install_hint}", err=True)
        sys.exit(EXIT_USAGE)
    elif command[0] == how.needs:
        command[0] = found
    write(compiled, out)
    click.echo("$ " + " ".join(command), err=True)
    sys.exit(subprocess.call(command))


def _need_runtime(command: str, names: tuple[str, ...] = ("ray", "torch", "transformers")) -> None:
    """A usage error unless this Python has rlc's runtime and what `command` imports of it."""
    # deferred: only the commands that start the runtime need it (start-up)
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is None:
            click.echo(f"rlc {command}: the runtime needs {name}; pip install 'rlc[runtime]'", err=True)
            sys.exit(EXIT_USAGE)


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option(
    "-o", "--out", "out_dir", type=click.Path(file_okay=False), help="Output directory (default build/<name>)."
)
@click.option("--address", help="Ray address to run on (default: start a local Ray instance).")
@click.option("--no-progress", is_flag=True, help="Print a line per step instead of a progress bar.")
def run(spec: str, overrides: tuple[str, ...], out_dir: str | None, address: str | None, no_progress: bool) -> None:
    """Compile SPEC, then train it here: on a local Ray instance (or --address), as the launch files would.

    Needs the runtime (`pip install 'rlc[runtime]'`). Metrics go to {trainer.log_path}/{trainer.run_name}.
    """
    # deferred: only `rlc run` needs it: kept out of the other commands' start-up
    from pathlib import Path

    from rlc.compiler.emit import build, write
    from rlc.compiler.targets import target as named

    result = _compile(spec, _parse_overrides(overrides))
    if not result.ok or result.spec is None:
        sys.exit(_emit(result.diagnostics, "text", ""))
    _warn(result.diagnostics)
    out = Path(out_dir) if out_dir else Path("build") / result.spec.name
    write(build(result, (named("ray"),), str(out)), out)
    _need_runtime("run")
    # deferred: the runtime (torch, Ray, transformers), only for `rlc run`, once its packages are known to be there
    from rlc.runtime.__main__ import run_job
    from rlc.runtime.config import load

    click.echo(f"{spec}: compiled to {out}/; training", err=True)
    sys.exit(run_job(load(out / "resolved.yaml"), address, progress=not no_progress))


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="PNG to write [default: RUN_DIR/curves.png].")
def plot(run_dir: str, output: str | None) -> None:
    """Draw the reward and loss curves of a run (its metrics.jsonl) into a PNG."""
    # deferred: only `rlc plot` needs it: kept out of the other commands' start-up; matplotlib below
    from pathlib import Path

    try:
        # deferred: matplotlib and the runtime's plot, only for `rlc plot`
        from rlc.runtime.plot import PlotError, plot_run
    except ImportError as exc:
        click.echo(f"rlc plot: needs matplotlib ({exc}); pip install 'rlc[runtime]'", err=True)
        sys.exit(EXIT_USAGE)
    try:
        path = plot_run(Path(run_dir), Path(output) if output else None)
    except PlotError as exc:
        click.echo(f"rlc plot: {exc}", err=True)
        sys.exit(EXIT_SPEC)
    click.echo(f"wrote {path}")


class DataGroup(click.Group):
    """`rlc data`: a command per environment whose dataset rlc writes (`rlc.core.environments.WRITERS`, read only
    when a command line reaches `rlc data`), beside the converters written here."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        # deferred: the environments' table only when `rlc data` is parsed (start-up)
        from rlc.core.environments import WRITERS

        return sorted({*super().list_commands(ctx), *WRITERS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        # deferred: the environments' table only when `rlc data` is parsed (start-up)
        from rlc.core.environments import WRITERS

        writer = WRITERS.get(cmd_name)
        return _writer_command(cmd_name, writer) if writer is not None else super().get_command(ctx, cmd_name)


def _writer_command(env_id: str, writer: Writer) -> click.Command:
    """`rlc data ENV_ID`: the environment's train and validation splits, written by its entry's writer."""
    default_out = f"~/.cache/rlc/data/{env_id}"

    def data_write(out_dir: str, train_rows: int, val_rows: int, seed: int, **options: Any) -> None:
        # deferred: only `rlc data` needs it: kept out of the other commands' start-up; pyarrow below
        from pathlib import Path

        _need_runtime("data", ("pyarrow",))
        # deferred: pyarrow and the runtime's writers, only for `rlc data`
        from rlc.runtime.data import write_dataset

        for option in writer.options:
            if option.names_directory and out_dir == default_out and options[option.keyword] != option.default:
                out_dir += f"-{options[option.keyword]}"
        for path in write_dataset(writer, Path(out_dir).expanduser(), train_rows, val_rows, seed, **options):
            click.echo(f"wrote {path}")

    params: list[click.Parameter] = [
        click.Option(
            ["-o", "--out", "out_dir"],
            type=click.Path(file_okay=False),
            default=default_out,
            show_default=True,
            help="Directory for train.parquet and validation.parquet.",
        ),
        click.Option(
            ["--train", "train_rows"],
            type=click.IntRange(1, writer.train.most),
            default=writer.train.default,
            show_default=True,
        ),
        click.Option(
            [*writer.validation_flags, "val_rows"],
            type=click.IntRange(1, writer.validation.most),
            default=writer.validation.default,
            show_default=True,
        ),
        click.Option(["--seed"], type=int, default=0, show_default=True),
        *(_writer_option(option) for option in writer.options),
    ]
    return click.Command(env_id, callback=data_write, params=params, help=writer.summary)


def _writer_option(option: WriterOption) -> click.Option:
    kind: click.ParamType = (
        click.Choice(option.choices) if option.choices else click.IntRange(option.least, option.most)
    )
    return click.Option(
        [*option.flags, option.keyword], type=kind, default=option.default, show_default=True, help=option.help
    )


@cli.group(cls=DataGroup)
def data() -> None:
    """Write datasets (parquet files of prompt / answer rows) for the built-in environments."""


@data.command("gsm8k")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False), default="~/data/gsm8k", show_default=True)
@click.option("--name", default="train", show_default=True, help="File name (without .parquet) of the converted rows.")
@click.option(
    "--validation",
    "val_rows",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Hold out this many rows as validation.parquet.",
)
@click.option("--seed", type=int, default=0, show_default=True)
def data_gsm8k(source: str, out_dir: str, name: str, val_rows: int, seed: int) -> None:
    """Convert GSM8K records (JSON lines, a JSON list or CSV with question / answer) to parquet."""
    # deferred: only `rlc data gsm8k` needs it: kept out of the other commands' start-up; pyarrow below
    from pathlib import Path

    _need_runtime("data", ("pyarrow",))
    # deferred: pyarrow and the runtime's readers, only for `rlc data gsm8k`
    from rlc.runtime.data import DataError, gsm8k

    try:
        paths = gsm8k(Path(source), Path(out_dir).expanduser(), validation=val_rows, seed=seed, name=name)
    except DataError as exc:
        click.echo(f"rlc data: {exc}", err=True)
        sys.exit(EXIT_SPEC)
    for path in paths:
        click.echo(f"wrote {path}")


@cli.command()
@click.option("--stdio", is_flag=True, help="Talk over stdin/stdout (the only transport; editors pass it).")
def lsp(stdio: bool) -> None:
    """Serve an editor rlc's diagnostics, hover, completion and fixes as you type (a language server).

    Speaks the Language Server Protocol on stdin/stdout; an editor starts it (docs/editors.md).
    """
    # deferred: only `rlc lsp` needs it: kept out of the other commands' start-up (pygls)
    from rlc.compiler.lsp.server import serve

    serve()


def main() -> None:
    try:
        cli.main(prog_name="rlc", standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("rlc: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug in rlc: say so plainly, keep the traceback for RLC_DEBUG=1
        if os.environ.get("RLC_DEBUG"):
            raise
        click.echo(f"rlc: internal error: {type(exc).__name__}: {exc} (rerun with RLC_DEBUG=1 and report it)", err=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
