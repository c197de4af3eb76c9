"""SIGTERM and SIGINT in the driver (docs/faults.md): where the run may stop at once, where it finishes the step first,
and what a second signal or a grace period run out does. End to end: tests/e2e/test_faults.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from rlc.runtime.stopping import Stopped, StopSignals


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_an_abandonable_span_at_once(signum, code):
    before = signal.getsignal(signum)
    with StopSignals(60, lambda: "nowhere") as stop:
        with pytest.raises(Stopped) as stopped, stop.abandonable():
            _signal_self(signum)
            raise AssertionError("the span went on after the signal")
        assert stopped.value.exit_code == code
    assert signal.getsignal(signum) is before  # the handlers are the caller's again


def test_an_error_the_interrupted_code_makes_of_the_stop_is_the_stop():
    """The signal's exception lands wherever the main thread is; code it interrupts may raise another on the way out
    (`Thread.start` cut short raised `KeyError: <Thread ...>` in CI): the span still ends as the stop."""
    with StopSignals(60, lambda: "nowhere") as stop:
        with pytest.raises(Stopped) as stopped, stop.abandonable():
            try:
                _signal_self(signal.SIGINT)
            except Stopped:
                raise KeyError("a library's state, half updated when the signal came") from None
        assert stopped.value.exit_code == 130
        assert isinstance(stopped.value.__cause__, KeyError)


def test_the_stop_passes_the_interrupted_codes_except_exception():
    """As KeyboardInterrupt does: `threading.Thread.start` undoes a thread it has just started on an Exception, and
    the thread then fails on the missing bookkeeping (CI printed its traceback)."""
    swallowed = []
    with StopSignals(60, lambda: "nowhere") as stop, pytest.raises(Stopped), stop.abandonable():
        try:
            _signal_self(signal.SIGINT)
        except Exception:
            swallowed.append(True)
    assert not swallowed


def test_an_error_in_an_abandonable_span_without_a_signal_is_that_error():
    with StopSignals(60, lambda: "nowhere") as stop, pytest.raises(KeyError), stop.abandonable():
        raise KeyError("a real failure")


def test_outside_an_abandonable_span_the_work_finishes_and_the_next_check_stops():
    with StopSignals(60, lambda: "nowhere") as stop:
        _signal_self(signal.SIGTERM)
        finished = True  # a step updating the weights is not cut short
        with pytest.raises(Stopped, match="SIGTERM"):
            stop.check()
        with pytest.raises(Stopped), stop.abandonable():  # nor does a new span start
            raise AssertionError("a span started after the signal")
    assert finished


def test_ray_init_handlers_give_way_and_a_signal_meanwhile_waits(capsys):
    with StopSignals(60, lambda: "nowhere") as stop:
        with stop.starting_ray():
            signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))  # what ray.init installs in the driver
            # blocked until the span ends, as in the processes Ray starts in it (they inherit this thread's mask);
            # sent to this thread, since a process-wide signal may go to another thread (pytest-xdist's) instead
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
            assert stop.requested is None
        assert stop.requested == signal.SIGTERM
    assert (
        "rlc: SIGTERM received: saving the last finished step within launch.grace_period_s=60s"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("how", ["second-signal", "grace-period"])
def test_a_second_signal_or_the_grace_period_ends_the_process_with_the_signals_code(how):
    """A save that does not end in time: the process ends anyway, saying where to resume from."""
    # a SIGTERM again changes nothing (schedulers send it more than one way); a SIGINT ends the save
    again = "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2); "
    second = again + ("os.kill(os.getpid(), signal.SIGINT)" if how == "second-signal" else "time.sleep(30)")
    code = textwrap.dedent(
        f"""
        import os, signal, time
        from rlc.runtime import stopping
        stopping.SHUTDOWN_MARGIN_S = 0
        with stopping.StopSignals(1, lambda: "the newest complete checkpoint is /c/global_step_2") as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            {second}
            time.sleep(30)
        """
    )
    ended = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ended.returncode == 143
    why = "a second SIGINT" if how == "second-signal" else "launch.grace_period_s=1s ran out"
    assert ended.stderr.splitlines()[-1] == (
        f"rlc.runtime: {why} before a checkpoint was saved; the newest complete checkpoint is /c/global_step_2"
    )


def test_hold_sigterm_runs_a_command_that_and_whose_children_outlive_a_sigterm():
    """`python -m rlc.runtime hold-sigterm ray start ...`: a job-wide SIGTERM leaves the node's Ray to the driver."""
    child = "import os, signal; os.kill(os.getpid(), signal.SIGTERM); print('child alive')"
    command = (
        "import os, signal, subprocess, sys; os.kill(os.getpid(), signal.SIGTERM); "
        f"subprocess.run([sys.executable, '-c', {child!r}], check=True); print('alive')"
    )
    held = subprocess.run(
        [sys.executable, "-m", "rlc.runtime", "hold-sigterm", sys.executable, "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (held.returncode, held.stdout) == (0, "child alive\nalive\n"), held.stderr
