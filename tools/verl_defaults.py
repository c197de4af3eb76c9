"""Write the verl defaults rlc's verl importer composes on: compiler/importers/verl/defaults/<release>.json.

Usage: python tools/verl_defaults.py MIRROR   (MIRROR: a git clone of verl-project/verl with its tags)

For each release below the tool reads, with `git show`, the flattened trainer config verl ships: from v0.5.0 the
`_generated_ppo_trainer.yaml` and `_generated_ppo_megatron_trainer.yaml` that verl's
`scripts/generate_trainer_config.sh` writes (the composed `--cfg job` output, interpolations kept), before that
`ppo_trainer.yaml` and `ppo_megatron_trainer.yaml`, which were flat files themselves. Only the values are kept
(comments and layout are not): one JSON file per release, {"release", "commit", "engines": {"dp": tree,
"megatron": tree}, "engine_group": bool, "other_engines": [...]} where engine_group says whether that release
picks its engine with the `model_engine=` group and other_engines names the engines that release composes but rlc
does not run (veomni, torchtitan). Rerun it when verl releases; add the tag to RELEASES.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

# (release name as rlc reports it, git revision). "main" is the snapshot the importer calls newest.
RELEASES = (
    ("v0.2", "v0.2"),
    ("v0.3.0", "v0.3.0.post1"),
    ("v0.4.1", "v0.4.1"),
    ("v0.5.0", "v0.5.0"),
    ("v0.6.1", "v0.6.1"),
    ("v0.7.1", "v0.7.1"),
    ("v0.8.0", "v0.8.0"),
    ("v0.9.0", "v0.9.0"),
    ("v0.9.1", "v0.9.1"),  # the release verl's trainer commands are written against (compiler/trainers/verl_config.py)
    ("main", "1dda039b9"),
)
CONFIG = "verl/trainer/config"
OUT = Path(__file__).resolve().parent.parent / "compiler" / "importers" / "verl" / "defaults"


def show(mirror: Path, rev: str, path: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(mirror), "show", f"{rev}:{path}"], capture_output=True, text=True, check=False
    )
    return done.stdout if done.returncode == 0 else None


def tree(text: str) -> dict:
    data = yaml.safe_load(text)
    data.pop("defaults", None)
    data.pop("hydra", None)
    return data


def release(mirror: Path, name: str, rev: str) -> dict:
    commit = subprocess.run(
        ["git", "-C", str(mirror), "rev-parse", f"{rev}^{{commit}}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    engines, others = {}, []
    for engine, generated, flat in (
        ("dp", "_generated_ppo_trainer.yaml", "ppo_trainer.yaml"),
        ("megatron", "_generated_ppo_megatron_trainer.yaml", "ppo_megatron_trainer.yaml"),
    ):
        text = show(mirror, rev, f"{CONFIG}/{generated}") or show(mirror, rev, f"{CONFIG}/{flat}")
        if text is None:
            raise SystemExit(f"{rev}: neither {generated} nor {flat}")
        engines[engine] = tree(text)
    for engine in ("veomni", "torchtitan"):
        if show(mirror, rev, f"{CONFIG}/_generated_ppo_{engine}_trainer.yaml") is not None:
            others.append(engine)
    main = yaml.safe_load(show(mirror, rev, f"{CONFIG}/ppo_trainer.yaml") or "{}")
    group = any(isinstance(d, dict) and "model_engine" in d for d in main.get("defaults") or [])
    return {"release": name, "commit": commit, "engine_group": group, "engines": engines, "other_engines": others}


def main() -> None:
    mirror = Path(sys.argv[1])
    OUT.mkdir(parents=True, exist_ok=True)
    for name, rev in RELEASES:
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(release(mirror, name, rev), separators=(",", ":"), sort_keys=False) + "\n")
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
