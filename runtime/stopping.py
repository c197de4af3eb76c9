"""Stopping on a signal: SIGTERM (scancel, a spot instance's notice, a cancel, Kubernetes deleting the pod) and SIGINT
(Ctrl-C) end a run with a checkpoint of its last finished step, saved within `launch.grace_period_s`.

The driver's main thread takes both signals. The first asks the run to stop: at once while the current step has not
changed any trained weights yet (generation, scoring: that step is dropped and run again on resume), else once the
step is finished. A SIGINT after it, or the grace period running out, ends the process at once with the same exit code
(a SIGTERM again is the same request, which schedulers send more than one way);
the message then names the newest complete checkpoint. Exit codes are the shell's for a death by that signal (143 for
SIGTERM, 130 for SIGINT) whether or not a checkpoint was saved: schedulers read them as "stopped", not "failed", and
the message says which checkpoint a restart resumes from.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130}
SHUTDOWN_MARGIN_S = 5.0  # of the grace period, kept for stopping Ray's processes after the save


class Stopped(BaseException):
    """A signal asked the run to stop; raised in the driver's main thread where the run can stop.

    A BaseException, as KeyboardInterrupt is: it is raised wherever the main thread is when the signal comes, and an
    `except Exception` of the code it interrupts must not take it for that code's own failure (`threading.Thread.start`
    would undo the bookkeeping of a thread it had just started, and the thread fail on it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.step: int | None = None  # the last finished step, once the loop has started
        self.saved: Path | None = None  # the checkpoint saved on the way out, if one was

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[signal.Signals(self.signum)]


class StopSignals:
    """SIGTERM and SIGINT handled for the span of a run (a `with` block in the main thread); `late_message` says
    what a process ended by the watchdog or a second signal tells (where to resume from)."""

    def __init__(self, grace_period_s: float, late_message: Callable[[], str]):
        self.grace_period_s = grace_period_s
        self.late_message = late_message
        self.requested: int | None = None
        self._abandonable = False
        self._old: dict[int, object] = {}
        # The grace period's watchdog: a thread started here, never in the handler (which may run while the main
        # thread holds threading's own locks); the handler only sets `_asked`.
        self._asked, self._done = threading.Event(), threading.Event()
        self._watchdog: threading.Thread | None = None

    def __enter__(self) -> StopSignals:
        self._watchdog = threading.Thread(target=self._watch, daemon=True, name="rlc-grace-period")
        self._watchdog.start()
        self._install()
        return self

    def _watch(self) -> None:
        self._asked.wait()
        if not self._done.wait(max(1.0, self.grace_period_s - SHUTDOWN_MARGIN_S)):
            self._end_now(f"launch.grace_period_s={self.grace_period_s:g}s ran out")

    def _install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in EXIT_CODES:
                old = signal.signal(signum, self._handle)
                self._old.setdefault(signum, old)

    @contextlib.contextmanager
    def starting_ray(self) -> Iterator[None]:
        """Around `ray.init`: the processes a local Ray instance starts inherit SIGTERM blocked (as Ray starts them
        with SIGINT blocked), so a SIGTERM to the process group or to every process leaves them running for the
        driver's save; and `ray.init`'s own SIGTERM handler (stop Ray, exit 1) gives way to this run's again. A
        SIGTERM that comes meanwhile waits, then reaches this run's handler."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            yield
        finally:
            self._install()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def __exit__(self, *exc) -> None:
        for signum, old in self._old.items():
            signal.signal(signum, old)  # type: ignore[arg-type]
        self._done.set()
        self._asked.set()  # a watchdog still waiting for a signal ends too

    @contextlib.contextmanager
    def abandonable(self) -> Iterator[None]:
        """A span a signal may cut short at once (nothing in it changes the state a checkpoint holds).

        `Stopped` is raised wherever the main thread is when the signal comes, and code that was interrupted may turn
        it into an error of its own on the way out (`threading.Thread.start` cut short between starting the thread
        and recording it raises a KeyError): once a stop was asked for, whatever leaves the span is that stop, the
        error it became chained to it for RLC_DEBUG."""
        self.check()
        self._abandonable = True
        try:
            yield
        except Stopped:
            raise
        except BaseException as exc:
            if self.requested is None:
                raise
            raise Stopped(self.requested) from exc
        finally:
            self._abandonable = False

    def check(self) -> None:
        """Raise `Stopped` if a signal asked the run to stop."""
        if self.requested is not None:
            raise Stopped(self.requested)

    def _handle(self, signum: int, frame) -> None:
        if self.requested is not None:
            # A SIGTERM again is the same request: schedulers send it more than one way (Slurm to every process of
            # the job and the batch shell passing it on, a pod's preStop and its kill); the grace period bounds the
            # save. A SIGINT (Ctrl-C again) is a person who will not wait.
            if signum == signal.SIGINT:
                self._end_now(f"a second {signal.Signals(signum).name}")
            return
        self.requested = signum
        name = signal.Signals(signum).name
        print(
            f"rlc: {name} received: saving the last finished step within launch.grace_period_s="
            f"{self.grace_period_s:g}s (SIGINT, Ctrl-C, stops at once)",
            file=sys.stderr,
            flush=True,
        )
        self._asked.set()
        if self._abandonable:
            raise Stopped(signum)

    def _end_now(self, why: str) -> None:
        assert self.requested is not None
        code = EXIT_CODES[signal.Signals(self.requested)]
        try:
            told = self.late_message()
        except Exception as exc:  # the message must not keep the process from ending
            told = f"(where to resume from is unknown: {exc})"
        print(f"rlc.runtime: {why} before a checkpoint was saved; {told}", file=sys.stderr, flush=True)
        _kill_descendants()  # the local Ray instance and all it started: nothing of the run outlives it
        os._exit(code)


def _kill_descendants() -> None:
    try:
        import psutil  # deferred: psutil is optional in the runtime (Ray's own extras bring it)
    except ImportError:
        return
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def leave_sigterm_to_the_driver() -> None:
    """In a Ray worker (a training rank, an engine): SIGTERM sent to a process group or to every process of a job
    (scancel, `kill -TERM -- -PGID`) reaches this process as well as the driver. Ray's handler would end it, and with
    it the checkpoint the driver is about to ask for, so it is ignored here: the driver stops every worker when it
    stops Ray, and a worker whose driver is gone is ended by Ray."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def exec_holding_sigterm(argv: list[str]) -> None:
    """Become `argv` with SIGTERM blocked, which it and every process it starts inherit: how a launch script starts
    `ray start` on a node, so that a SIGTERM to every process of the job (scancel, a machine shutting down) leaves the
    raylet and GCS running while the driver saves. They are ended with SIGKILL (`ray stop --force`), or go with the
    job."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    os.execvp(argv[0], argv)
