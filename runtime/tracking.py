"""What a user sees of a run: a progress bar, `metrics.jsonl` in the run directory, a tracker, its CPU time.

wandb and tensorboard are imported only when `trainer.logger` names them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rlc.core.job import TrackingSettings


class TrackerError(Exception):
    """The configured tracker cannot start."""


SHOWN = (
    ("reward", "reward {:.3f}"),
    ("policy_loss", "loss {:+.4f}"),
    ("kl", "kl {:.4f}"),
    ("tokens_per_s", "{:.0f} tok/s"),
)


class RunCpu:
    """CPU seconds (user + system) the run's processes on this machine have used: the driver and what it started
    (a local Ray instance, its actors). Taken once per phase of a step as `timing/cpu/...`: unlike wall time, a busy
    machine does not inflate it. The processes are listed once, at the first step; without psutil (or with actors
    on another machine) it counts what it can see, the driver at least."""

    def __init__(self) -> None:
        self.procs: list | None = None
        self.gone: dict[int, float] = {}  # last reading of processes that have ended

    def __call__(self) -> float:
        if self.procs is None:
            try:
                import psutil  # deferred: psutil is optional; without it the driver counts its own CPU time

                me = psutil.Process()
                self.procs = [me, *me.children(recursive=True)]
            except ImportError:
                self.procs = []
        if not self.procs:
            return time.process_time()
        total = 0.0
        for p in self.procs:
            try:
                c = p.cpu_times()
                self.gone[p.pid] = c.user + c.system
            except Exception:  # ended since: its last reading stands
                pass
            total += self.gone.get(p.pid, 0.0)
        return total


def run_dir(settings: TrackingSettings) -> Path:
    """`{log_path}/{run_name}`, the run's directory (expanded on the node that runs the driver)."""
    return Path(os.path.expandvars(os.path.expanduser(settings.log_path))) / settings.run_name


class Tracker:
    @classmethod
    def of(cls, settings: TrackingSettings, *, config: dict, total_steps: int, start_step: int, progress: bool):
        """The tracker `settings` name, writing into the run's directory."""
        return cls(
            run_dir(settings),
            logger=settings.logger,
            project=settings.project_name,
            run_name=settings.run_name,
            config=config,
            total_steps=total_steps,
            start_step=start_step,
            progress=progress,
        )

    def __init__(
        self,
        run_dir: Path,
        *,
        logger: str,
        project: str,
        run_name: str,
        config: dict,
        total_steps: int,
        start_step: int,
        progress: bool = True,
    ):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._trim(start_step)
        self._file = self.path.open("a", encoding="utf-8")
        self.total, self.logger = total_steps, logger
        self._backend: Any = None  # a wandb run or a tensorboard SummaryWriter
        try:
            if logger == "wandb":
                import wandb  # deferred: wandb is optional, only for trainer.logger: wandb

                self._backend = wandb.init(project=project, name=run_name, config=config, resume="allow")
            elif logger == "tensorboard":
                # deferred: tensorboard is optional, only for trainer.logger: tensorboard
                from torch.utils.tensorboard import SummaryWriter

                self._backend = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        except ImportError as exc:
            self._file.close()
            raise TrackerError(
                f"trainer.logger is {logger}, which needs a package this environment lacks ({exc}); "
                f"pip install {'wandb' if logger == 'wandb' else 'tensorboard'}, or use logger: console"
            ) from None
        self._bar = None
        if progress and sys.stderr.isatty():
            # deferred: rich's progress bar, not needed to read metrics (`rlc plot` imports this module)
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[summary]}"),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("train", total=total_steps, completed=start_step, summary="")
        self._started = time.monotonic()

    def _trim(self, start_step: int) -> None:
        """Keep the lines of steps up to the resumed step; a fresh run moves an old file aside."""
        if not self.path.exists():
            return
        if start_step == 0:
            self.path.replace(self.path.with_name("metrics.previous.jsonl"))
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= start_step:
                    kept.append(line)
            except ValueError:
                continue  # a line cut short by a kill
        self.path.write_text("".join(k + "\n" for k in kept), encoding="utf-8")

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, "time": round(time.time(), 3), **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.logger == "wandb":
            self._backend.log(metrics, step=step)
        elif self.logger == "tensorboard":
            for k, v in metrics.items():
                if isinstance(v, (int, float)):
                    self._backend.add_scalar(k, v, step)
        summary = "  ".join(fmt.format(metrics[k]) for k, fmt in SHOWN if k in metrics)
        if self._bar is not None:
            self._bar.update(self._task, completed=step, summary=summary)
        elif "reward" in metrics:
            print(f"step {step}/{self.total}  {summary}", file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
        self._file.close()
        if self.logger == "wandb":
            self._backend.finish()
        elif self.logger == "tensorboard":
            self._backend.close()


def _plain(value):
    if isinstance(value, float):
        return round(value, 6)
    return value


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():  # a torn write skips its line
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
