"""Checkpoint directories: where a step's state goes, which one is `latest`, which ones to delete.

    {ckpt_path}/global_step_{N}/policy/        model + optimizer (torch.distributed.checkpoint) + per-rank extras
    {ckpt_path}/global_step_{N}/critic/        the same for the critic
    {ckpt_path}/global_step_{N}/trainer_state.json
    {ckpt_path}/latest_ckpt_global_step.txt    written last, atomically: the step to resume from

A step is written under a temporary name and renamed into place once complete, then the marker is
replaced. A crash at any moment leaves either the old marker or a complete new step: a partly written
directory is never `latest`, and a directory without a complete `trainer_state.json` is never used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from rlc.core.job import CheckpointSettings
from rlc.runtime.paths import expand
from rlc.runtime.run_error import RunError

MARKER = "latest_ckpt_global_step.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(Exception):
    """A checkpoint asked for cannot be used."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"global_step_{step}"


def staging_dir(root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".global_step_{step}.", dir=root))


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def commit(root: Path, staging: Path, step: int, state: dict) -> Path:
    """Finish a step written into `staging`: trainer state, rename into place, then move the marker."""
    _write_atomic(staging / "trainer_state.json", json.dumps(state, indent=1, sort_keys=True))
    final = step_dir(root, step)
    if final.exists():  # a fresh run (resume_mode none) reaching a step an older run saved
        shutil.rmtree(final)
    os.rename(staging, final)
    _write_atomic(root / MARKER, f"{step}\n")
    return final


def is_complete(directory: Path) -> bool:
    try:
        state = json.loads((directory / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and "global_step" in state and (directory / "policy" / ".metadata").exists()


def latest(root: Path) -> Path | None:
    """The checkpoint the marker names, if complete; else the newest complete one; else None."""
    try:
        marked = step_dir(root, int((root / MARKER).read_text(encoding="utf-8").strip()))
        if is_complete(marked):
            return marked
    except (OSError, ValueError):
        pass
    steps = sorted((int(m.group(1)), p) for p in _children(root) if (m := _STEP_DIR.match(p.name)))
    for _, path in reversed(steps):
        if is_complete(path):
            return path
    return None


def _children(root: Path) -> list[Path]:
    try:
        return list(root.iterdir())
    except OSError:
        return []


def read_state(directory: Path) -> dict:
    if not is_complete(directory):
        raise CheckpointError(
            f"{directory} is not a complete rlc checkpoint (no trainer_state.json or policy/.metadata)"
        )
    return json.loads((directory / "trainer_state.json").read_text(encoding="utf-8"))


def prune(root: Path, keep: int, current: int | None = None) -> list[Path]:
    """Delete all but the newest `keep` complete steps (keep <= 0: keep everything) and stale staging dirs.

    Steps above `current` were left by an older run (a fresh start with resume_mode none); they are not
    this run's to count or delete.
    """
    removed: list[Path] = []
    for p in _children(root):
        if p.name.startswith(".global_step_"):
            shutil.rmtree(p, ignore_errors=True)
    if keep <= 0:
        return removed
    steps = sorted(
        (int(m.group(1)), p)
        for p in _children(root)
        if (m := _STEP_DIR.match(p.name)) and is_complete(p) and (current is None or int(m.group(1)) <= current)
    )
    for _, path in steps[:-keep]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


# -- the run's checkpoints and exports, written by the role workers ---------------------------------------------


class Checkpoints:
    """A run's checkpoints (every role but the ref, then the trainer state) and Hugging Face exports, which the role
    workers (Ray actors) write at the intervals `settings` gives; `workers` maps each role to its ranks."""

    def __init__(self, ray, workers: dict, settings: CheckpointSettings, content_hash: str, model: str):
        self.ray, self.workers, self.settings = ray, workers, settings
        self.root, self.export_root = expand(settings.ckpt_path), expand(settings.export_path)
        self.content_hash, self.model = content_hash, model
        self.last_saved = self.last_exported = 0

    def load(self, directory: Path) -> None:
        """Every trained role's state from a checkpoint directory (the ref's never changes)."""
        for name, workers in self.workers.items():
            if name != "ref":
                self.ray.get([w.load_checkpoint.remote(str(directory / name)) for w in workers])

    def after_step(self, step: int, epoch: int, kl_coef: float) -> Path | None:
        """A checkpoint every ckpt_interval steps, an export every hf_save_interval; the checkpoint written, if any."""
        saved = None
        if self.settings.ckpt_interval > 0 and step % self.settings.ckpt_interval == 0:
            saved = self.save(step, epoch, kl_coef)
        if self.settings.hf_save_interval > 0 and step % self.settings.hf_save_interval == 0:
            self.export(step)
        return saved

    def at_end(self, step: int, epoch: int, kl_coef: float) -> Path | None:
        """The final weights, checkpointed and exported (where the intervals ask for any) unless the last step was."""
        saved = None
        if self.settings.ckpt_interval > 0 and self.last_saved != step:
            saved = self.save(step, epoch, kl_coef)
        if self.settings.hf_save_interval > 0 and self.last_exported != step:
            self.export(step)
        return saved

    def save(self, step: int, epoch: int, kl_coef: float) -> Path:
        staging = staging_dir(self.root, step)
        for name, workers in self.workers.items():
            if name != "ref":
                self.ray.get([w.save_checkpoint.remote(str(staging / name)) for w in workers])
        state = {
            "global_step": step,
            "epoch": epoch,
            "kl_coef": kl_coef,
            "content_hash": self.content_hash,
            "world_sizes": {k: len(v) for k, v in self.workers.items()},
        }
        final = commit(self.root, staging, step, state)
        prune(self.root, self.settings.max_ckpts_to_keep, current=step)
        self.last_saved = step
        return final

    def export(self, step: int) -> None:
        target = self.export_root / f"global_step_{step}"
        for name in ("policy", "critic"):
            if name in self.workers:
                self.ray.get([w.export_hf.remote(str(target / name), self.model) for w in self.workers[name]])
        self.last_exported = step


def resume_from(settings: CheckpointSettings, content_hash: str) -> tuple[int, dict, Path | None]:
    """`resume_point` of a run's checkpoint settings."""
    path = expand(settings.resume_path) if settings.resume_path else None
    return resume_point(settings.resume_mode, path, expand(settings.ckpt_path), content_hash)


def resume_hint(settings: CheckpointSettings) -> str:
    """What a failed run tells its user of where to continue from."""
    last = latest(expand(settings.ckpt_path))
    where = f"the last complete checkpoint is {last}" if last else "no checkpoint was written yet"
    return f"{where}; rerun with trainer.resume_mode=latest to continue from it"


def resume_point(
    resume_mode: str | None, resume_path: Path | None, root: Path, content_hash: str
) -> tuple[int, dict, Path | None]:
    """Where a run starts: step 0, or the step (and trainer state and directory) of the checkpoint that
    `trainer.resume_mode` names (`from_path`: `resume_path`; `latest`: the newest complete one under `root`)."""
    if resume_mode in (None, "none"):
        return 0, {}, None
    if resume_mode == "from_path":
        assert resume_path is not None  # RLC-E306: the compiler refuses from_path without a resume_path
        try:
            state = read_state(resume_path)
        except CheckpointError as exc:
            raise RunError(str(exc)) from None
        return int(state["global_step"]), state, resume_path
    found = latest(root)
    if found is None:
        return 0, {}, None
    state = read_state(found)
    if state.get("content_hash") not in (None, content_hash):
        print(
            f"rlc: note: {found} was written by another compile of the job (its resolved config differs); "
            "resuming from it",
            flush=True,
        )
    return int(state["global_step"]), state, found
