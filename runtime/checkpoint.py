"""Checkpoint directories: where a step's state goes, which one is `latest`, which ones to delete.

    {ckpt_path}/global_step_{N}/policy/        model + optimizer (torch.distributed.checkpoint) + per-rank extras
    {ckpt_path}/global_step_{N}/critic/        the same for the critic
    {ckpt_path}/global_step_{N}/manifest.json  the size and SHA-256 of every file above (runtime/manifest.py)
    {ckpt_path}/global_step_{N}/trainer_state.json   written last: the step is complete once it is there
    {ckpt_path}/latest_ckpt_global_step.txt    written last, atomically: the step to resume from

A step is written under a temporary name, its manifest and trainer state last, and renamed into place once complete,
then the marker is replaced. A crash at any moment leaves either the old marker or a complete new step. Where a
rename is not atomic (a bucket mount copies a directory file by file), the manifest still tells a half-copied step
from a whole one: a step is used only when its every file has the manifest's size, and on resume its bytes match.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from rlc.core.job import CheckpointSettings
from rlc.runtime import manifest
from rlc.runtime.paths import expand
from rlc.runtime.run_error import RunError, os_cause

MARKER = "latest_ckpt_global_step.txt"
STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_DELETING = ".deleting."  # a step being deleted is renamed to this prefix first: a half-deleted one is never a step


class CheckpointError(Exception):
    """A checkpoint asked for cannot be used."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"global_step_{step}"


def staging_dir(root: Path, step: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".global_step_{step}.", dir=root))


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def commit(root: Path, staging: Path, step: int, state: dict) -> Path:
    """Finish a step written into `staging`: its manifest, the trainer state, rename into place, then the marker."""
    manifest.write(staging)
    _write_atomic(staging / STATE, json.dumps({**state, "manifest": manifest.MANIFEST}, indent=1, sort_keys=True))
    final = step_dir(root, step)
    if final.exists():  # a fresh run (resume_mode none) reaching a step an older run saved
        _delete(final)
    os.rename(staging, final)
    _write_atomic(root / MARKER, f"{step}\n")
    return final


def _state(directory: Path) -> dict | None:
    try:
        state = json.loads((directory / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "global_step" in state else None


def is_complete(directory: Path) -> bool:
    """Every file written: the trainer state, the policy's metadata, and each file at its manifest's size (a step
    written before rlc kept manifests has none to check)."""
    state = _state(directory)
    if state is None or not (directory / "policy" / ".metadata").exists():
        return False
    return "manifest" not in state or not manifest.problems(directory, digests=False)


def problems(directory: Path) -> list[str]:
    """Why `directory` cannot be resumed from (nothing: []): incomplete, or a file whose bytes changed since the save."""
    state = _state(directory)
    if state is None:
        return [f"no complete {STATE}"]
    if not (directory / "policy" / ".metadata").exists():
        return ["no policy/.metadata"]
    return manifest.problems(directory, digests=True) if "manifest" in state else []


def _steps(root: Path) -> list[tuple[int, Path]]:
    return sorted((int(m.group(1)), p) for p in _children(root) if (m := _STEP_DIR.match(p.name)))


def _marked(root: Path) -> Path | None:
    try:
        return step_dir(root, int((root / MARKER).read_text(encoding="utf-8").strip()))
    except (OSError, ValueError):
        return None


def latest(root: Path) -> Path | None:
    """The checkpoint the marker names, if complete; else the newest complete one; else None."""
    marked = _marked(root)
    if marked is not None and is_complete(marked):
        return marked
    for _, path in reversed(_steps(root)):
        if is_complete(path):
            return path
    return None


def newest_intact(root: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose files are whole and unchanged (the marked one first), and each newer step passed
    over with why: what a resume falls back through."""
    marked = _marked(root)
    order = [p for _, p in reversed(_steps(root))]
    if marked is not None and marked in order:
        order = [marked] + [p for p in order if p != marked]
    passed: list[str] = []
    for path in order:
        found = problems(path)
        if not found:
            return path, passed
        passed.append(f"{path}: {'; '.join(found[:3])}")
    return None, passed


def _children(root: Path) -> list[Path]:
    try:
        return list(root.iterdir())
    except OSError:
        return []


def read_state(directory: Path) -> dict:
    found = problems(directory)
    if found:
        raise CheckpointError(f"{directory} is not a usable rlc checkpoint: {'; '.join(found[:3])}")
    state = _state(directory)
    assert state is not None  # problems() found it
    return state


def _delete(path: Path) -> None:
    """Rename, then delete: a deletion cut short leaves a `.deleting.` folder the next cleanup removes, never a
    half-deleted global_step_N that looks like a step."""
    doomed = path.with_name(f"{_DELETING}{path.name}.{os.getpid()}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def clean_leftovers(root: Path, current: int | None = None) -> list[Path]:
    """Remove what earlier runs left when cut short: staging folders, steps half deleted, temporary files of the
    marker, and incomplete global_step_N folders older than `current` (a step deleted by an older rlc, cut short)."""
    removed = []
    for p in _children(root):
        if p.name.startswith((".global_step_", _DELETING)):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name.startswith(f".{MARKER}."):
            p.unlink(missing_ok=True)
        elif current is not None and (m := _STEP_DIR.match(p.name)) and int(m.group(1)) < current:
            if not is_complete(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                continue
        else:
            continue
        removed.append(p)
    return removed


def prune(root: Path, keep: int, current: int | None = None) -> list[Path]:
    """Delete all but the newest `keep` complete steps (keep <= 0: keep everything) and what `clean_leftovers` removes.

    Steps above `current` were left by an older run (a fresh start with resume_mode none); they are not
    this run's to count or delete.
    """
    removed: list[Path] = []
    clean_leftovers(root, current)
    if keep <= 0:
        return removed
    steps = [(n, p) for n, p in _steps(root) if is_complete(p) and (current is None or n <= current)]
    for _, path in steps[:-keep]:
        _delete(path)
        removed.append(path)
    return removed


def save_failure(exc: BaseException, root: Path) -> str | None:
    """A failed save told in a line by the OS error under it (no space, no permission, a quota), with what to do; None
    when no OS error is under it."""
    cause = os_cause(exc)
    if cause is None:
        return None
    code = errno.errorcode.get(cause.errno or 0, "")
    where = f" ({cause.filename})" if cause.filename else ""
    told = f"{cause.strerror or cause}{f' [{code}]' if code else ''}{where}"
    if cause.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"{told}: free space under {root} (or a quota) or point trainer.ckpt_path elsewhere"
    if cause.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{told}: make {root} writable for this user or point trainer.ckpt_path elsewhere"
    return told


# -- the run's checkpoints and exports, written by the role workers ---------------------------------------------


class Checkpoints:
    """A run's checkpoints (every role but the ref, then the trainer state) and Hugging Face exports, which the role
    workers (Ray actors) write at the intervals `settings` gives; `workers` maps each role to its ranks."""

    def __init__(self, ray, workers: dict, settings: CheckpointSettings, content_hash: str, model: str):
        self.ray, self.workers, self.settings = ray, workers, settings
        self.root, self.export_root = expand(settings.ckpt_path), expand(settings.export_path)
        self.content_hash, self.model = content_hash, model
        self.last_saved = self.last_exported = 0

    def load(self, directory: Path, step: int) -> None:
        """Every trained role's state from step `step`'s checkpoint directory (the ref's never changes)."""
        for name, workers in self.workers.items():
            if name != "ref":
                self.ray.get([w.load_checkpoint.remote(str(directory / name)) for w in workers])
        self.last_saved = step

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

    def on_stop(self, step: int, epoch: int, kl_coef: float) -> Path | None:
        """A signal stops the run after step `step`: its checkpoint, unless it has one (or it is step 0, or the run
        keeps no checkpoints: trainer.ckpt_interval -1)."""
        if self.settings.ckpt_interval <= 0 or step == 0 or self.last_saved == step:
            return None
        return self.save(step, epoch, kl_coef)

    def save(self, step: int, epoch: int, kl_coef: float) -> Path:
        """Step `step`'s checkpoint, or a RunError naming the OS error a failed write comes down to; a failed save
        leaves no staging folder and the previous checkpoint as it was."""
        clean_leftovers(self.root, current=step)  # an earlier run's staging folders take the space this one needs
        try:
            staging = staging_dir(self.root, step)
        except OSError as exc:
            raise RunError(self._failed(step, exc)) from None
        try:
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
        except BaseException as exc:  # torch's CheckpointException is one, not an Exception
            shutil.rmtree(staging, ignore_errors=True)
            if save_failure(exc, self.root) is None:
                raise  # not the disk's doing (a rank died mid-save): the driver tells it
            raise RunError(self._failed(step, exc)) from None
        prune(self.root, self.settings.max_ckpts_to_keep, current=step)
        self.last_saved = step
        return final

    def _failed(self, step: int, exc: BaseException) -> str:
        return f"the checkpoint of step {step} could not be written: {save_failure(exc, self.root) or exc}; " + (
            resume_hint(self.settings)
        )

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
    """What a stopped run tells its user of where to continue from: the newest complete checkpoint (every file at the
    size its manifest gives; the bytes are checked when a run resumes) and the command that resumes."""
    last = latest(expand(settings.ckpt_path))
    where = f"the newest complete checkpoint is {last}" if last else "no checkpoint was written yet"
    how = (
        "run the same command again to resume from it"
        if settings.resume_mode == "latest"
        else "run the same command with trainer.resume_mode=latest to resume from it"
    )
    return f"{where}; {how}" if last else where


def resume_point(
    resume_mode: str | None, resume_path: Path | None, root: Path, content_hash: str
) -> tuple[int, dict, Path | None]:
    """Where a run starts: step 0, or the step (and trainer state and directory) of the checkpoint that
    `trainer.resume_mode` names (`from_path`: `resume_path`; `latest`: the newest intact one under `root`, every
    broken one newer than it named)."""
    if resume_mode in (None, "none"):
        return 0, {}, None
    if resume_mode == "from_path":
        assert resume_path is not None  # RLC-E306: the compiler refuses from_path without a resume_path
        try:
            state = read_state(resume_path)
        except CheckpointError as exc:
            raise RunError(str(exc)) from None
        return int(state["global_step"]), state, resume_path
    found, passed = newest_intact(root)
    for broken in passed:
        print(f"rlc: checkpoint {broken}: passed over", flush=True)
    if found is None:
        if passed:
            raise RunError(
                "no checkpoint under " + str(root) + " can be resumed from: " + "; ".join(passed) + "; "
                "delete them (or set trainer.resume_mode=none) to start over"
            )
        return 0, {}, None
    if passed:
        print(f"rlc: resuming from {found}, the newest intact checkpoint", flush=True)
    state = read_state(found)
    if state.get("content_hash") not in (None, content_hash):
        print(
            f"rlc: note: {found} was written by another compile of the job (its resolved config differs); "
            "resuming from it",
            flush=True,
        )
    return int(state["global_step"]), state, found
