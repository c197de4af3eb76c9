"""Gather and check historical versions of SkyRL's legacy base config (`ppo_base_config.yaml`).

The fixture in tests/fixtures/skyrl-history comes from two places.

Released packages (`pypi`): every version of SkyRL's packages on PyPI that ships the base config. For each
package (default: skyrl-train, skyrl, skyrl-gym, skyrl-tx) the tool lists its versions with
`pip index versions --pre --ignore-requires-python`, downloads each version's wheel and sdist with
`pip download --no-deps` (into --dl, a scratch folder; nothing is built or installed), and looks in each
archive for `.../config/ppo_base_config.yaml`. For each base config found it stores two files:

- `PACKAGE_VERSION.yaml`: the base config as shipped (comments stripped), `defaults:` list included;
- `PACKAGE_VERSION.composed.yaml`: the same config with its Hydra default groups composed in the way Hydra
  does (`_self_` first, so a group's values win; a group lands at the package the `defaults:` entry names,
  else at its file's `# @package` header, else at the group name), i.e. what `--cfg job` prints and
  what a user who saved a resolved config holds.

A wheel and an sdist of the same version that ship the same files store once. As of this writing only
skyrl-train 0.2.0, 0.3.0 and 0.3.1 ship the file (skyrl-train 0.1.0's archives left the YAML files out;
`skyrl` 0.1.0 onwards defines its config as Python dataclasses, and skyrl-gym and skyrl-tx have none).

Dataclass releases (`add --package skyrl --version V`): `skyrl` 0.1.0 onwards ships no YAML; its base config
is the `SkyRLTrainConfig` dataclass, whose defaults SkyRL itself writes out as YAML with
`get_config_as_yaml_str`. Each `PACKAGE_VERSION.dataclass.yaml` is that output for one release, made in a
scratch Python 3.12 virtual environment (omegaconf, pyyaml, pandas, requests, func_timeout, loguru, pydantic,
cloudpathlib; no torch) with the release's wheel and the skyrl-gym release it pins unpacked on sys.path:
`yaml.safe_dump(get_config_as_dict(SkyRLTrainConfig()), sort_keys=False)`. From 0.3.0 the top-level
`__post_init__` imports the torch backends, so there every section is built from its default factory
(each section's own `__post_init__` runs) and the top-level one is skipped: values it would derive from
others stay at their declared defaults.

Branches and forks (`add --repo OWNER/NAME --commit SHA`): this machine cannot reach GitHub, so those versions were read with the
code-search index (a stored copy of public repositories, every crawled branch):

1. list the repositories that hold the file at either of its homes over time,
   `skyrl-train/skyrl_train/config/ppo_base_config.yaml` (2025-06 .. 2026-02) and
   `skyrl/train/config/ppo_base_config.yaml` (2026-02 ..);
2. read the stored version of each (repository, path), which names its commit, and read it again at the commit
   the listing names where that differs (the index holds up to two versions of a path per repository);
3. save its text and run `python tools/skyrl_history.py add FILE --repo OWNER/NAME --commit SHA`.

`add` and `pypi` strip comments (the 13 files in ../shared/corpus keep theirs and test comment round-trips;
these test keys and values) and skip a version whose keys and values are already stored. `check` migrates,
validates and round-trips (a second migration changes nothing) every stored version and the corpus, and
prints the counts. A version whose shipped defaults turn on a branch's feature rlc does not run (e.g. hybrid
environment sampling on) migrates with RLC-E030..E032 findings only, each on its own ALTERS WHAT RUNS line:
`check` counts it as refused by design, not as a failure; so is a version whose defaults set a spec v1
(SkyRL 0.4) field this runtime refuses with a "not supported yet" rule (RLC-E801..E824) and nothing else.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "skyrl-history"
CORPUS = ROOT.parent / "shared" / "corpus" / "skyrl-legacy"
_COMMENT = re.compile(r"\s+#.*$")


def strip_comments(text: str) -> str:
    """Drop comment lines and end-of-line comments outside quotes; keep blank-line structure light."""
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if "#" in line and not re.search(r"[\"'][^\"']*#", line):
            line = _COMMENT.sub("", line)
        out.append(line.rstrip())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def _plain(text: str):
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(text)


def _store(text: str, name: str) -> Path | None:
    """Write `name` into the fixture unless a stored file has the same keys and values."""
    data = _plain(text)
    for existing in sorted(FIXTURE.glob("*.yaml")):
        if _plain(existing.read_text()) == data:
            print(f"{name}: same keys and values as {existing.name}; not stored")
            return None
    target = FIXTURE / name
    target.write_text(text)
    print(f"wrote {target.relative_to(ROOT)}")
    return target


def add(path: Path, name: str) -> Path | None:
    return _store(strip_comments(path.read_text()), name)


# -- released packages ------------------------------------------------------------------------------------

PACKAGES = ("skyrl-train", "skyrl", "skyrl-gym", "skyrl-tx")
_BASE = "config/ppo_base_config.yaml"
_HEADER = re.compile(r"^#\s*@package\s+(\S+)", re.M)


def _merge(into: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


def _at(path: str, value: dict) -> dict:
    for part in reversed([p for p in path.split(".") if p and p != "_global_"]):
        value = {part: value}
    return value


def compose(base: str, groups: dict[str, str]) -> dict:
    """The base config with its `defaults:` groups merged in as Hydra composes them.

    `groups` maps "group/option" to that file's text. Entries before `_self_` go under the base config's
    own values, entries after it over them; a group whose file is missing is an error.
    """
    data = _plain(base) or {}
    entries = data.pop("defaults", []) or []
    before: dict = {}
    after: dict = {}
    seen_self = False
    for entry in entries:
        if entry == "_self_":
            seen_self = True
            continue
        ((key, option),) = entry.items() if isinstance(entry, dict) else ((entry, None),)
        group, _, package = str(key).partition("@")
        text = groups[f"{group}/{option}"]
        header = _HEADER.search(text)
        target = package or (header.group(1) if header else group)
        if target == "_group_":
            target = group
        _merge(after if seen_self else before, _at(target, _plain(text) or {}))
    return _merge(_merge(before, data), after)


def _dump(data: dict) -> str:
    import io

    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    buf = io.StringIO()
    yaml.dump(data, buf)
    return buf.getvalue()


def _archive_configs(archive: Path) -> dict[str, str]:
    """{path relative to the config folder: text} for the base config and the YAML files beside it."""
    import tarfile
    import zipfile

    files: dict[str, str] = {}
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            names = {n: n for n in z.namelist()}
            read = lambda n: z.read(n).decode()  # noqa: E731
            files = _pick(names, read)
    else:
        with tarfile.open(archive) as t:
            names = {m.name: m.name for m in t.getmembers() if m.isfile()}
            read = lambda n: t.extractfile(n).read().decode()  # type: ignore[union-attr]  # noqa: E731
            files = _pick(names, read)
    return files


def _pick(names: dict[str, str], read) -> dict[str, str]:
    base = sorted(n for n in names if n.endswith(_BASE))
    if not base:
        return {}
    folder = base[0][: -len("ppo_base_config.yaml")]
    return {n[len(folder) :]: read(n) for n in names if n.startswith(folder) and n.endswith(".yaml")}


def _pip(*args: str) -> str:
    import subprocess

    cmd = [sys.executable, "-m", "pip", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600).stdout


def versions(package: str) -> list[str]:
    out = _pip("index", "versions", "--pre", "--ignore-requires-python", package)
    m = re.search(r"Available versions:\s*(.+)", out)
    return [v.strip() for v in m.group(1).split(",")] if m else []


def pypi(packages: list[str], dl: Path) -> list[tuple[str, str, str]]:
    """Download every released version's wheel and sdist; store each distinct base config found.

    Returns (package, version, what) rows: the stored file names, or why nothing was stored.
    """
    rows = []
    for package in packages:
        found = versions(package)
        print(f"{package}: {len(found)} version(s) on the index: {', '.join(found) or '-'}")
        for version in found:
            where = dl / package / version
            where.mkdir(parents=True, exist_ok=True)
            for kind in ("--only-binary=:all:", "--no-binary=:all:"):
                _pip(
                    "download", "--no-deps", "--ignore-requires-python", kind, "-d", str(where), f"{package}=={version}"
                )
            configs = [c for a in sorted(where.iterdir()) if (c := _archive_configs(a))]
            if not configs:
                rows.append((package, version, "no ppo_base_config.yaml in its wheel or sdist"))
                continue
            if any(c != configs[0] for c in configs[1:]):
                print(f"{package} {version}: wheel and sdist configs differ; storing the wheel's")
            files = configs[0]
            stem = f"{package}_{version}"
            base = files["ppo_base_config.yaml"]
            groups = {k[: -len(".yaml")]: v for k, v in files.items() if "/" in k}
            stored = [
                _store(strip_comments(base), f"{stem}.yaml"),
                _store(_dump(compose(base, groups)), f"{stem}.composed.yaml"),
            ]
            rows.append((package, version, ", ".join(p.name if p else "duplicate" for p in stored)))
    for row in rows:
        print("  ".join(row))
    return rows


def check(paths: list[Path]) -> int:
    from rlc.compiler.importers.versions import migrate_data, migrated_text
    from rlc.compiler.load import document_from_text
    from rlc.compiler.pipeline import analyze
    from rlc.core.plain import plain_yaml

    migrating = refused = validating = unsupported = round_trip = 0
    for p in paths:
        doc = document_from_text(p.read_text(), p.name)
        legacy = plain_yaml(doc.data)
        report = migrate_data(doc.data)
        ok = report is not None and not report.errors
        migrating += ok
        # A version whose shipped defaults turn on a branch feature rlc does not run is refused by design: only
        # history findings (RLC-E030..E032), each on its own ALTERS WHAT RUNS line.
        by_design = (
            report is not None and bool(report.errors) and all(c.code.startswith("RLC-E03") for c in report.errors)
        )
        refused += by_design
        new = migrated_text(doc)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "migrated.yaml"
            out.write_text(new)
            analysis = analyze(out, env={"WANDB_API_KEY": "x"})
        validating += analysis.ok
        # Likewise a default that sets a spec v1 (SkyRL 0.4) field this runtime does not run yet: validation refuses
        # it with one of the "not supported yet" rules (RLC-E801..E824) and nothing else.
        errors = [d.code for d in analysis.diagnostics if d.severity == "error"]
        not_yet = bool(errors) and all(re.fullmatch(r"RLC-E8\d\d", c) for c in errors)
        unsupported += not_yet
        # Every top-level key survives or has a report line, and a second migration changes nothing.
        accounted = {c.old.split(".")[0] for c in report.changes if c.old} if report else set()
        kept = set(legacy) - {"defaults"} <= set(plain_yaml(doc.data)) | accounted
        again = migrate_data(document_from_text(new, "again.yaml").data) is None
        round_trip += kept and again
        if not (ok and analysis.ok and kept and again):
            said = "ok" if ok else "refused (alters what runs)" if by_design else "ERRORS"
            valid = "ok" if analysis.ok else "refused (not supported yet)" if not_yet else "ERRORS"
            print(f"{p.name}: migrate {said}, validate {valid}, round-trip {'ok' if kept and again else 'FAILS'}")
            for line in report.lines() if report else []:
                if line.startswith("ALTERS"):
                    print(f"  {line}")
            for d in analysis.diagnostics:
                if d.severity == "error":
                    print(f"  {d.code} {d.key}: {d.message}")
    print(
        f"{len(paths)} version(s): {migrating} migrate without errors, {refused} refused with findings that alter "
        f"what runs, {validating} validate, {unsupported} refused by a not-supported-yet rule, {round_trip} round-trip"
    )
    return 0 if migrating + refused == validating + unsupported == round_trip == len(paths) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="store one fetched version (comments stripped, duplicates skipped)")
    a.add_argument("file", type=Path)
    a.add_argument("--repo", help="OWNER/NAME of a branch or fork (with --commit)")
    a.add_argument("--commit")
    a.add_argument("--package", help="a released package whose dataclass defaults FILE holds (with --version)")
    a.add_argument("--version")
    q = sub.add_parser("pypi", help="download every released version and store each distinct base config")
    q.add_argument("packages", nargs="*", default=list(PACKAGES))
    q.add_argument("--dl", type=Path, default=Path(tempfile.gettempdir()) / "skyrl-dl", help="download folder")
    c = sub.add_parser("check", help="migrate, validate and round-trip every stored version and the corpus")
    c.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.command == "add":
        if args.repo and args.commit:
            add(args.file, f"{args.repo.replace('/', '-')}_{args.commit[:12]}.yaml")
        elif args.package and args.version:
            add(args.file, f"{args.package}_{args.version}.dataclass.yaml")
        else:
            parser.error("add needs --repo and --commit, or --package and --version")
        return 0
    if args.command == "pypi":
        pypi(args.packages, args.dl)
        return 0
    files = args.files or sorted(FIXTURE.glob("*.yaml")) + sorted(CORPUS.glob("*.yaml"))
    return check(files)


if __name__ == "__main__":
    sys.exit(main())
