"""Gather and check historical versions of SkyRL's legacy base config (`ppo_base_config.yaml`).

How the fixture in tests/fixtures/skyrl-history was gathered: this machine cannot reach GitHub, so each
version was read with the code-search index (a stored copy of public repositories, every crawled branch):

1. list the repositories that hold the file at either of its homes over time,
   `skyrl-train/skyrl_train/config/ppo_base_config.yaml` (2025-06 .. 2026-02) and
   `skyrl/train/config/ppo_base_config.yaml` (2026-02 ..);
2. read the stored version of each (repository, path), which names its commit;
3. save its text and run `python tools/skyrl_history.py add FILE --repo OWNER/NAME --commit SHA`.

`add` strips comments (the 13 files in ../shared/corpus keep theirs and test comment round-trips; these
test keys and values), skips a version whose keys and values are already stored, and names the file
`OWNER-NAME_COMMIT12.yaml`. `check` migrates and validates every stored version and the corpus and prints
the counts.
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


def add(path: Path, repo: str, commit: str) -> Path | None:
    text = strip_comments(path.read_text())
    data = _plain(text)
    for existing in sorted(FIXTURE.glob("*.yaml")):
        if _plain(existing.read_text()) == data:
            print(f"{path}: same keys and values as {existing.name}; not stored")
            return None
    target = FIXTURE / f"{repo.replace('/', '-')}_{commit[:12]}.yaml"
    target.write_text(text)
    print(f"wrote {target.relative_to(ROOT)}")
    return target


def check(paths: list[Path]) -> int:
    from rlc.compiler.frontend import analyze
    from rlc.compiler.load import document_from_text
    from rlc.compiler.migration import migrated_text
    from rlc.spec.versions import migrate_data

    migrating = validating = 0
    for p in paths:
        doc = document_from_text(p.read_text(), p.name)
        report = migrate_data(doc.data)
        ok = report is not None and not report.errors
        migrating += ok
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "migrated.yaml"
            out.write_text(migrated_text(doc))
            analysis = analyze(out, env={"WANDB_API_KEY": "x"})
        validating += analysis.ok
        if not (ok and analysis.ok):
            print(f"{p.name}: migrate {'ok' if ok else 'ERRORS'}, validate {'ok' if analysis.ok else 'ERRORS'}")
            for line in report.lines() if report else []:
                if line.startswith("ALTERS"):
                    print(f"  {line}")
            for d in analysis.diagnostics:
                if d.severity == "error":
                    print(f"  {d.code} {d.key}: {d.message}")
    print(f"{len(paths)} version(s): {migrating} migrate without errors, {validating} validate")
    return 0 if migrating == validating == len(paths) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="store one fetched version (comments stripped, duplicates skipped)")
    a.add_argument("file", type=Path)
    a.add_argument("--repo", required=True)
    a.add_argument("--commit", required=True)
    c = sub.add_parser("check", help="migrate and validate every stored version and the corpus")
    c.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    if args.command == "add":
        add(args.file, args.repo, args.commit)
        return 0
    files = args.files or sorted(FIXTURE.glob("*.yaml")) + sorted(CORPUS.glob("*.yaml"))
    return check(files)


if __name__ == "__main__":
    sys.exit(main())
