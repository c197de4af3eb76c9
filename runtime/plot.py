"""`rlc plot RUN_DIR`: reward and loss curves of a run, from its metrics.jsonl, as a PNG."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from rlc.runtime.tracking import read_metrics


class PlotError(Exception):
    """Nothing to plot."""


def plot_run(run_dir: Path, output: Path | None = None) -> Path:
    try:
        # Training steps, and evaluations (the one before training is logged at step 0 without a reward).
        records = [_numbers(r) for r in read_metrics(run_dir) if isinstance(r, dict)]
    except OSError:
        raise PlotError(f"{run_dir} has no metrics.jsonl (is it a run directory?)") from None
    records = [r for r in records if "step" in r and ("reward" in r or any(k.startswith("eval/") for k in r))]
    if not any("reward" in r for r in records):
        raise PlotError(f"{run_dir}/metrics.jsonl has no training steps yet")
    steps = [r["step"] for r in records]
    panels = [("reward", "mean training reward")]
    panels += [
        (k, t)
        for k, t in (("eval/accuracy", "eval accuracy"), ("eval/reward", "eval reward"))
        if any(k in r for r in records)
    ]
    panels += [
        (k, k.replace("_", " "))
        for k in ("policy_loss", "kl", "entropy", "response_length")
        if any(k in r for r in records)
    ]
    # Multi-turn jobs: the turns per trajectory, and a tool environment's call success (the calculator's, say).
    if any(r.get("env/turns", 1) > 1 for r in records):
        panels.append(("env/turns", "turns per trajectory"))
    if any("environment/tool_call_success" in r for r in records):
        panels.append(("environment/tool_call_success", "tool-call success"))
    # A Figure of its own, not pyplot's: no backend to pick, no global figure to close (a .png renders with Agg).
    fig = Figure(figsize=(7, 2.2 * len(panels)))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
    for ax, (key, title) in zip(axes[:, 0], panels):
        xs = [s for s, r in zip(steps, records) if key in r]
        ys = [r[key] for r in records if key in r]
        ax.plot(xs, ys, lw=1, alpha=0.45 if len(ys) > 20 else 1.0, marker="o" if len(ys) <= 20 else None, ms=3)
        if len(ys) > 20:  # a moving average makes the trend readable through per-step noise
            w = max(5, len(ys) // 20)
            smooth = [sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]
            ax.plot(xs, smooth, lw=2)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    target = output or run_dir / "curves.png"
    try:
        fig.savefig(target, dpi=110)
    except OSError as exc:
        raise PlotError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Beyond this no metric is a measurement (and matplotlib cannot lay out ticks for a range near the float limit).
_PLOTTABLE = 1e100


def _numbers(record: dict) -> dict:
    """The record's plottable values: numbers within +-1e100 (NaN is a gap). A value of another type (a hand-edited
    or torn line), an infinity or an absurd magnitude is not plotted."""
    return {k: v for k, v in record.items() if _number(v) and (v != v or abs(v) <= _PLOTTABLE)}
