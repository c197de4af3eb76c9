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
from rlc.runtime.run_error import RunError, os_cause
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
    assert ckpt.read_state(final) == {"global_step": 2, "epoch": 0, "kl_coef": 0.1, "manifest": "manifest.json"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", ckpt.MARKER]
    assert sorted(p.name for p in final.iterdir()) == ["manifest.json", "policy", "trainer_state.json"]


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
    checkpoints = ckpt.Checkpoints(
        _Pool(None), {"policy": [_Rank()]}, _checkpoint_settings(tmp_path, interval), "h", "m"
    )
    written = [checkpoints.after_step(step, 0, 0.0) for step in range(1, 6)]
    written.append(checkpoints.at_end(5, 0, 0.0))
    assert [p.name for p in written if p is not None] == [f"global_step_{step}" for step in saved]
    assert sorted(int(p.name.split("_")[-1]) for p in (tmp_path / "ckpts").glob("global_step_*")) == saved


# -- faults: broken checkpoints, leftovers, failed saves (docs/faults.md) ------------------------------------------


def committed(root, step: int, shard: bytes = b"weights" * 100) -> Path:
    """A step as a run commits it: a shard and the policy's metadata, its manifest, the trainer state, the marker."""
    s = staged(root, step)
    (s / "policy" / "__0_0.distcp").write_bytes(shard)
    (s / "policy" / "extra_rank0.pt").write_bytes(b"rng")
    return ckpt.commit(root, s, step, {"global_step": step})


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_committed_step_lists_every_file_in_its_manifest(tmp_path):
    final = committed(tmp_path, 1)
    listed = json.loads((final / "manifest.json").read_text())["files"]
    assert sorted(listed) == ["policy/.metadata", "policy/__0_0.distcp", "policy/extra_rank0.pt"]
    assert listed["policy/__0_0.distcp"]["size"] == 700
    assert ckpt.problems(final) == []


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda d: flip_a_byte(d / "policy" / "__0_0.distcp"), "__0_0.distcp: its SHA-256 differs"),
        (lambda d: (d / "policy" / "__0_0.distcp").write_bytes(b"weights"), "__0_0.distcp has 7 bytes"),
        (lambda d: (d / "policy" / "extra_rank0.pt").unlink(), "extra_rank0.pt is missing"),
        (lambda d: (d / "manifest.json").unlink(), "manifest.json is missing"),
        (lambda d: (d / "trainer_state.json").unlink(), "no complete trainer_state.json"),
    ],
    ids=["random-bytes", "truncated-shard", "missing-extra", "missing-manifest", "missing-completion-marker"],
)
def test_a_resume_falls_back_past_a_broken_step_and_names_it(tmp_path, capsys, damage, said):
    committed(tmp_path, 2)
    newest = committed(tmp_path, 4)
    damage(newest)
    step, state, found = ckpt.resume_point("latest", None, tmp_path, "hash")
    assert (step, found) == (2, tmp_path / "global_step_2")
    out = capsys.readouterr().out
    assert f"checkpoint {newest}: " in out and said in out
    assert f"resuming from {tmp_path / 'global_step_2'}, the newest intact checkpoint" in out


def test_a_resume_with_every_step_broken_names_each_and_refuses(tmp_path):
    for step in (1, 2):
        flip_a_byte(committed(tmp_path, step) / "policy" / "__0_0.distcp")
    with pytest.raises(RunError) as refused:
        ckpt.resume_point("latest", None, tmp_path, "hash")
    message = str(refused.value)
    assert "global_step_1" in message and "global_step_2" in message and "SHA-256 differs" in message


def test_a_broken_resume_path_is_refused_with_what_is_wrong(tmp_path):
    d = committed(tmp_path, 3)
    (d / "policy" / "extra_rank0.pt").write_bytes(b"")
    with pytest.raises(RunError, match="extra_rank0.pt has 0 bytes"):
        ckpt.resume_point("from_path", d, tmp_path, "hash")


def test_a_step_whose_files_are_cut_short_is_not_the_newest_complete_one(tmp_path):
    """What a stopped run's message names: a step whose files are not all there at their sizes is never it."""
    committed(tmp_path, 1)
    (committed(tmp_path, 2) / "policy" / "__0_0.distcp").write_bytes(b"")
    settings = CheckpointSettings(str(tmp_path), str(tmp_path / "x"), 1, -1, 2, "latest", None)
    assert ckpt.resume_hint(settings) == (
        f"the newest complete checkpoint is {tmp_path / 'global_step_1'}; run the same command again to resume from it"
    )


def test_cleanup_removes_what_cut_short_runs_left(tmp_path):
    committed(tmp_path, 1)
    committed(tmp_path, 3)
    staged(tmp_path, 5)  # a save cut short
    (tmp_path / ".deleting.global_step_0.123" / "policy").mkdir(parents=True)  # a deletion cut short
    (tmp_path / f".{ckpt.MARKER}.x1y2").write_text("3")  # the marker's temporary file
    make_step(tmp_path, 2, state=None)  # deleted by an older rlc, cut short: no trainer state left
    make_step(tmp_path, 9, state=None)  # above this run's step: an older run's, not this one's to judge
    ckpt.prune(tmp_path, keep=2, current=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_1",
        "global_step_3",
        "global_step_9",
        ckpt.MARKER,
    ]


def test_a_deletion_cut_short_leaves_no_global_step_folder(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        committed(tmp_path, step)

    def killed(path, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.prune(tmp_path, keep=1, current=3)
    monkeypatch.undo()
    assert not (tmp_path / "global_step_1").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".deleting.")]
    ckpt.clean_leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_2", "global_step_3", ckpt.MARKER]


class _Pool:
    """Ray's `get` and a rank whose save fails as torch.distributed.checkpoint fails a save: every rank's error
    gathered into a CheckpointException."""

    def __init__(self, error: BaseException | None):
        self.error = error

    def get(self, refs):
        if self.error is not None:
            raise self.error
        return refs


class _Rank:
    """A rank's `save_checkpoint.remote`: its metadata and a shard (half of one, when the disk then fills up)."""

    def __init__(self):
        self.save_checkpoint = self

    def remote(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / ".metadata").write_bytes(b"dcp")
        (Path(directory) / "__0_0.distcp").write_bytes(b"half")


def _full_disk() -> BaseException:
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        raise OSError(28, "No space left on device", "/ckpts/.global_step_2.x/policy/__0_0.distcp")
    except OSError as exc:
        return CheckpointException("failed", {0: (exc, None)})


def test_a_full_disk_is_said_in_a_line_and_leaves_the_previous_checkpoint(tmp_path):
    pytest.importorskip("torch")
    settings = _checkpoint_settings(tmp_path, 1)
    first = committed(tmp_path / "ckpts", 1)
    checkpoints = ckpt.Checkpoints(_Pool(_full_disk()), {"policy": [_Rank()]}, settings, "hash", "model")
    with pytest.raises(RunError) as failed:
        checkpoints.save(2, 0, 0.0)
    message = str(failed.value)
    assert message.startswith("the checkpoint of step 2 could not be written: No space left on device [ENOSPC]")
    assert f"free space under {tmp_path / 'ckpts'}" in message
    assert f"the newest complete checkpoint is {first}" in message
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["global_step_1", ckpt.MARKER]
    assert ckpt.problems(first) == []


def test_os_cause_finds_the_errno_inside_a_ray_error_around_a_checkpoint_exception():
    pytest.importorskip("torch")
    wrapped = _full_disk()
    try:
        try:
            raise wrapped
        except BaseException as inner:
            raise RuntimeError("ray task failed") from inner
    except RuntimeError as outer:
        cause = os_cause(outer)
    assert cause is not None and cause.errno == 28
    assert os_cause(RuntimeError("no OS error here")) is None
