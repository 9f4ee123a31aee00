"""Drawing a logged metric per training step, shared by the recipes' plots."""

from __future__ import annotations

import math


def plot_logged(ax, log_history: list[dict], key: str) -> None:
    """Plot `key` against the step from `trainer.state.log_history` on `ax` (non-finite values skipped), or say on
    the panel that it was not logged."""
    points = [(log["step"], log[key]) for log in log_history if isinstance(log.get(key), (int, float))]
    points = [(s, v) for s, v in points if math.isfinite(v)]
    if points:
        ax.plot(*zip(*points), marker="o", markersize=3)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
