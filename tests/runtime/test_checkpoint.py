"""What a run leaves on disk to resume from and to look at: checkpoints, metrics.jsonl, the curves PNG.

A crash can stop a run at any moment, so each test builds the directories a crash would leave
(by hand: no torch needed) and checks what resuming would pick.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_rlc
from rlc.core.job import CheckpointSettings
from rlc.runtime import checkpoint as ckpt
from rlc.runtime.tracking import Tracker, read_metrics


def make_step(root, step: int, *, state: str | None = "ok", metadata: bool = True):
    """A global_step_N directory; `state` "ok" writes a valid trainer_state.json, other text is written as is."""
    d = root / f"global_step_{step}"
    (d / "policy").mkdir(parents=True)
    if metadata:
        (d / "policy" / ".metadata").write_bytes(b"dcp")
    if state == "ok":
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    elif state is not None:
        (d / "trainer_state.json").write_text(state)
    return d


def mark(root, text) -> None:
    (root / ckpt.MARKER).write_text(f"{text}\n")


def staged(root, step: int):
    """A staging directory holding a finished policy, as the workers leave it before commit."""
    s = ckpt.staging_dir(root, step)
    (s / "policy").mkdir()
    (s / "policy" / ".metadata").write_bytes(b"dcp")
    return s


# -- commit and latest ---------------------------------------------------------------------------------


def test_commit_moves_the_step_into_place_and_marks_it(tmp_path):
    s = staged(tmp_path, 2)
    final = ckpt.commit(tmp_path, s, 2, {"global_step": 2, "epoch": 0, "kl_coef": 0.1})
    assert final == tmp_path / "global_step_2" and not s.exists()
    assert (tmp_path / ckpt.MARKER).read_text().strip() == "2"
    assert ckpt.latest(tmp_path) == final
    assert ckpt.read_state(final) == {"global_step": 2, "epoch": 0, "kl_coef": 0.1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", ckpt.MARKER]


def test_commit_replaces_a_step_an_older_run_saved(tmp_path):
    make_step(tmp_path, 3)
    (tmp_path / "global_step_3" / "policy" / "stale").write_text("old run")
    final = ckpt.commit(tmp_path, staged(tmp_path, 3), 3, {"global_step": 3, "epoch": 1})
    assert not (final / "policy" / "stale").exists()
    assert ckpt.read_state(final)["epoch"] == 1


def test_a_crash_before_the_rename_keeps_the_old_marker(tmp_path, monkeypatch):
    first = ckpt.commit(tmp_path, staged(tmp_path, 1), 1, {"global_step": 1})
    s = staged(tmp_path, 2)

    def crash(*args):
        raise OSError("killed")

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(OSError):
        ckpt.commit(tmp_path, s, 2, {"global_step": 2})
    monkeypatch.undo()
    assert (s / "trainer_state.json").exists()  # the staged step is complete but was never moved into place
    assert (tmp_path / ckpt.MARKER).read_text().strip() == "1"
    assert ckpt.latest(tmp_path) == first


def test_latest_is_the_marked_step_even_when_newer_ones_exist(tmp_path):
    for step in (1, 2, 3):
        make_step(tmp_path, step)
    mark(tmp_path, 2)
    assert ckpt.latest(tmp_path) == tmp_path / "global_step_2"


@pytest.mark.parametrize(
    "broken",
    [
        {"state": None},
        {"state": '{"global_step": 3, "epo'},
        {"state": ""},
        {"state": "[3]"},
        {"state": '{"epoch": 1}'},
        {"metadata": False},
    ],
    ids=["no-state", "truncated-state", "empty-state", "state-not-an-object", "state-without-step", "no-metadata"],
)
def test_a_half_written_step_is_never_latest(tmp_path, broken):
    make_step(tmp_path, 1)
    make_step(tmp_path, 2)
    make_step(tmp_path, 3, **broken)
    mark(tmp_path, 3)
    assert ckpt.latest(tmp_path) == tmp_path / "global_step_2"
    with pytest.raises(ckpt.CheckpointError, match="global_step_3"):
        ckpt.read_state(tmp_path / "global_step_3")


def test_no_complete_step_means_no_latest(tmp_path):
    assert ckpt.latest(tmp_path / "absent") is None
    assert ckpt.latest(tmp_path) is None
    make_step(tmp_path, 1, state=None)
    make_step(tmp_path, 2, metadata=False)
    mark(tmp_path, 2)
    assert ckpt.latest(tmp_path) is None


@pytest.mark.parametrize("marker", [None, "garbage", "7", ""])
def test_without_a_usable_marker_the_newest_complete_step_wins(tmp_path, marker):
    for step in (2, 9, 10):
        make_step(tmp_path, step)
    make_step(tmp_path, 11, state=None)
    if marker is not None:
        mark(tmp_path, marker)
    assert ckpt.latest(tmp_path) == tmp_path / "global_step_10"  # by number: 10 is newer than 9


def test_staging_directories_are_never_latest(tmp_path):
    make_step(tmp_path, 1)
    s = staged(tmp_path, 5)
    (s / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    mark(tmp_path, 5)
    assert ckpt.latest(tmp_path) == tmp_path / "global_step_1"
    (tmp_path / "global_step_1" / "trainer_state.json").unlink()
    assert ckpt.latest(tmp_path) is None


# -- prune -------------------------------------------------------------------------------------------


def test_prune_keeps_the_newest_steps_and_clears_staging(tmp_path):
    for step in (1, 2, 3, 10):
        make_step(tmp_path, step)
    leftover = staged(tmp_path, 11)
    mark(tmp_path, 10)
    removed = ckpt.prune(tmp_path, keep=2)
    assert sorted(removed) == sorted([tmp_path / "global_step_1", tmp_path / "global_step_2"])
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_10", "global_step_3", ckpt.MARKER]
    assert ckpt.latest(tmp_path) == tmp_path / "global_step_10"


def test_prune_with_keep_zero_keeps_every_step(tmp_path):
    for step in (1, 2, 3):
        make_step(tmp_path, step)
    leftover = staged(tmp_path, 4)
    assert ckpt.prune(tmp_path, keep=0) == []
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "global_step_2", "global_step_3"]


def test_prune_counts_only_complete_steps(tmp_path):
    """A broken newer step must not push the last usable checkpoint out."""
    for step in (1, 2, 3):
        make_step(tmp_path, step)
    make_step(tmp_path, 4, metadata=False)
    mark(tmp_path, 3)
    ckpt.prune(tmp_path, keep=2)
    assert ckpt.is_complete(tmp_path / "global_step_2") and ckpt.is_complete(tmp_path / "global_step_3")
    assert not (tmp_path / "global_step_1").exists()
    assert ckpt.latest(tmp_path) == tmp_path / "global_step_3"


def test_prune_of_a_missing_directory_is_a_no_op(tmp_path):
    assert ckpt.prune(tmp_path / "absent", keep=2) == []


# -- metrics.jsonl -------------------------------------------------------------------------------------


def tracker(run_dir, start_step: int) -> Tracker:
    return Tracker(
        run_dir,
        logger="console",
        project="p",
        run_name="r",
        config={},
        total_steps=10,
        start_step=start_step,
        progress=False,
    )


def test_tracker_writes_one_line_per_step(tmp_path):
    t = tracker(tmp_path, 0)
    t.log(1, {"reward": 0.25, "policy_loss": -0.1234567891, "note": "x"})
    t.log(2, {"reward": 0.5})
    t.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward"]) for r in lines] == [(1, 0.25), (2, 0.5)]
    assert lines[0]["policy_loss"] == pytest.approx(-0.1234567891, abs=1e-6) and lines[0]["note"] == "x"
    assert all(isinstance(r["time"], float) for r in lines)
    assert read_metrics(tmp_path) == lines


def test_a_fresh_run_moves_old_metrics_aside(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.9}\n')
    t = tracker(tmp_path, 0)
    t.log(1, {"reward": 0.1})
    t.close()
    assert [r["reward"] for r in read_metrics(tmp_path)] == [0.1]
    assert (tmp_path / "metrics.previous.jsonl").read_text() == '{"step": 1, "reward": 0.9}\n'


def test_a_resumed_run_drops_the_steps_after_its_checkpoint(tmp_path):
    lines = [json.dumps({"step": s, "reward": s / 10}) for s in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 5, "rew')  # killed mid-line
    t = tracker(tmp_path, 2)
    t.log(3, {"reward": 0.99})
    t.close()
    assert [(r["step"], r["reward"]) for r in read_metrics(tmp_path)] == [(1, 0.1), (2, 0.2), (3, 0.99)]
    assert not (tmp_path / "metrics.previous.jsonl").exists()


def test_read_metrics_skips_a_truncated_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "re')
    assert read_metrics(tmp_path) == [{"step": 1, "reward": 0.5}]


# -- curves ----------------------------------------------------------------------------------------


PNG = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir, steps: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [{"step": s, "reward": s / steps, "policy_loss": -s / 100, "kl": 0.01} for s in range(1, steps + 1)]
    records[4]["eval/reward"] = 0.5
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plot_run_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from rlc.runtime.plot import plot_run

    write_metrics(tmp_path / "run", 25)  # enough steps for the moving average
    assert plot_run(tmp_path / "run") == tmp_path / "run" / "curves.png"
    assert (tmp_path / "run" / "curves.png").read_bytes().startswith(PNG)
    assert plot_run(tmp_path / "run", tmp_path / "other.png").read_bytes().startswith(PNG)


def test_plot_run_without_training_steps_is_a_plot_error(tmp_path):
    pytest.importorskip("matplotlib")
    from rlc.runtime.plot import PlotError, plot_run

    with pytest.raises(PlotError, match="no metrics.jsonl"):
        plot_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/reward": 0.1}\n')
    with pytest.raises(PlotError, match="no training steps"):
        plot_run(tmp_path)


def test_plot_run_skips_values_that_are_not_numbers_and_torn_lines(tmp_path):
    pytest.importorskip("matplotlib")
    from rlc.runtime.plot import PlotError, plot_run

    write_metrics(tmp_path, 5)
    with (tmp_path / "metrics.jsonl").open("ab") as f:
        f.write(b'{"step": 4, "reward": [1, 2], "kl": "x"}\n["a"]\n{"reward": 1}\n{"step": 5, "rew\xff\n')
        f.write(b'{"step": 6, "reward": Infinity, "kl": -Infinity, "entropy": NaN}\n{"step": Infinity, "reward": 1}\n')
        f.write(b'{"step": 7, "reward": 1e308, "policy_loss": -1e300}\n')
    assert plot_run(tmp_path).read_bytes().startswith(PNG)
    with pytest.raises(PlotError, match="cannot write"):
        plot_run(tmp_path, tmp_path / "missing" / "curves.png")


def test_rlc_plot(tmp_path):
    pytest.importorskip("matplotlib")
    write_metrics(tmp_path / "run", 6)
    ok = run_rlc("plot", str(tmp_path / "run"))
    assert ok.returncode == 0, ok.stderr
    assert f"wrote {tmp_path / 'run' / 'curves.png'}" in ok.stdout
    assert (tmp_path / "run" / "curves.png").read_bytes().startswith(PNG)
    empty = run_rlc("plot", str(tmp_path / "empty"))
    assert empty.returncode == 1
    assert empty.stderr.startswith("rlc plot:") and "no metrics.jsonl" in empty.stderr
    assert "Traceback" not in empty.stderr


def _checkpoint_settings(root: Path, ckpt_interval: int) -> CheckpointSettings:
    return CheckpointSettings(
        ckpt_path=str(root / "ckpts"),
        export_path=str(root / "exports"),
        ckpt_interval=ckpt_interval,
        hf_save_interval=-1,
        max_ckpts_to_keep=-1,
        resume_mode=None,
        resume_path=None,
    )


@pytest.mark.parametrize(("interval", "saved"), [(2, [2, 4, 5]), (5, [5]), (-1, [])])
def test_a_run_checkpoints_every_interval_and_at_its_end(tmp_path, interval, saved):
    checkpoints = ckpt.Checkpoints(None, {}, _checkpoint_settings(tmp_path, interval), "hash", "model")
    written = [checkpoints.after_step(step, 0, 0.0) for step in range(1, 6)]
    written.append(checkpoints.at_end(5, 0, 0.0))
    assert [p.name for p in written if p is not None] == [f"global_step_{step}" for step in saved]
    assert sorted(int(p.name.split("_")[-1]) for p in (tmp_path / "ckpts").glob("global_step_*")) == saved
