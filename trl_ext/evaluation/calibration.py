"""Calibration metrics for a model that states a confidence in [0, 1] that its answer is correct (RLCR).

RLCR (Damani et al., 2025) trains a model to end its answer with a confidence; these helpers measure how well that
stated confidence matches the empirical accuracy:

- `expected_calibration_error` (ECE): the count-weighted mean gap |accuracy - confidence| over equal-width bins;
- `brier_score`: mean squared error between the confidence and the 0/1 outcome;
- `auroc`: how well the confidence separates correct from incorrect answers (None when only one class occurs);
- `brier_skill`: 1 - Brier / the Brier of the best constant (the base rate): 0 for any constant, so a degenerate
  calibrator that ECE rates perfect scores nothing here;
- `grouped_auroc` and `grouped_brier_skill`: the same questions asked within groups (e.g. difficulty levels): AUROC over
  right/wrong pairs of the same group, skill against each group's base rate: a confidence that only reads the group
  (the difficulty written in the question) scores 0.5 and 0;
- `bootstrap_intervals`: percentile-bootstrap 95% intervals of these metrics;
- `calibration_report`: all of the above plus per-bin statistics, JSON-serialisable through `to_dict()`;
- `reliability_diagram` / `plot_reliability_diagrams`: PNG reliability diagrams, one panel or several side by side.

Two conventions, named by `convention=`:

- `"standard"` (the default, ours): binning follows the calibration literature (Guo et al., 2017): with n bins, bin
  k covers (k/n, (k+1)/n] and a confidence of exactly 0 falls in bin 0. Confidences must lie in [0, 1] and not be
  None or NaN: completions whose confidence could not be parsed are filtered out before calling (and counted
  apart, as a parse-failure rate), so the metrics describe the confidences the model did state.
- `"rlcr_paper"`: the convention of the RLCR paper's numbers (Damani et al., 2025), as torchmetrics'
  `binary_calibration_error` bins: bin k covers [k/n, (k+1)/n), so a confidence on an edge goes to the upper bin, and
  a confidence of exactly 1 gets a bin of its own (n + 1 bins). Unparsable confidences (None or NaN) are scored as
  confidence 0 instead of being dropped, in every metric. Use it to compare with the paper; the two differ whenever
  stated confidences sit on bin edges (round numbers such as 0.3 or 0.7, i.e. almost always with an LLM) or some
  fail to parse.

Edges are `np.arange(n + 1) / n` in both conventions, so an edge such as 0.3 is the same float as the literal 0.3.
This is why the paper convention is computed here rather than by torchmetrics: torchmetrics builds its edges with
`linspace` in the inputs' dtype, and in float64 the edge 0.3 is 0.30000000000000004, so a stated 0.3 lands in the bin
below (e.g. confidences [0.3, 0.35] with outcomes [1, 0]: ECE 0.525 in float64 instead of 0.175) - exactly on the
edge values where the conventions differ. Plotting uses matplotlib's object-oriented
`Figure` API with an Agg canvas: neither importing this module nor drawing touches pyplot or the global backend.
Matplotlib and scikit-learn are imported on first use.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


NUM_BINS = 10
CONVENTIONS = ("standard", "rlcr_paper")

_FILTER_HINT = (
    "Filter out unparsable confidences first (completions whose stated confidence is missing, not a number or outside "
    "[0, 1]) and compute calibration metrics on the rest."
)


# ---------------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------------


def _check_convention(convention: str) -> str:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}.")
    return convention


def _as_confidences(confidences: Any, convention: str = "standard") -> np.ndarray:
    """The confidences as a 1-D float64 array; ValueError if any is non-numeric, NaN or outside [0, 1].

    With `convention="rlcr_paper"`, None and NaN (unparsable confidences) become 0.
    """
    if _check_convention(convention) == "rlcr_paper":
        confidences = [0.0 if x is None else x for x in confidences]
    try:
        c = np.asarray(confidences, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"confidences must be numbers in [0, 1] ({exc}). {_FILTER_HINT}") from None
    if c.ndim != 1:
        raise ValueError(f"confidences must be a 1-D sequence, got an array of shape {c.shape}.")
    if convention == "rlcr_paper":
        c = np.where(np.isnan(c), 0.0, c)
    bad = np.flatnonzero(~((c >= 0.0) & (c <= 1.0)))  # NaN fails both comparisons
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"confidences must lie in [0, 1] and not be NaN; got {bad.size} invalid value(s), "
            f"e.g. {float(c[i])!r} at index {i}. {_FILTER_HINT}"
        )
    return c


def _as_correct(correct: Any) -> np.ndarray:
    """Return the outcomes as a 1-D float64 array of 0.0/1.0, or raise ValueError if any is not 0/1 or a bool."""
    try:
        y = np.asarray(correct, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"correct must hold 0/1 or booleans ({exc}).") from None
    if y.ndim != 1:
        raise ValueError(f"correct must be a 1-D sequence, got an array of shape {y.shape}.")
    bad = np.flatnonzero((y != 0.0) & (y != 1.0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"correct must hold 0/1 or booleans; got {float(y[i])!r} at index {i}.")
    return y


def _validate(confidences: Any, correct: Any, convention: str = "standard") -> tuple[np.ndarray, np.ndarray]:
    c = _as_confidences(confidences, convention)
    y = _as_correct(correct)
    if len(c) != len(y):
        raise ValueError(
            f"confidences and correct must have the same length, got {len(c)} confidences and {len(y)} correct labels."
        )
    return c, y


def _check_n_bins(n_bins: int) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}.")
    return int(n_bins)


# ---------------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------------


def bin_edges(n_bins: int = NUM_BINS) -> np.ndarray:
    """The n_bins + 1 equal-width edges `np.arange(n_bins + 1) / n_bins` (exact: edge k is the float k / n_bins)."""
    n_bins = _check_n_bins(n_bins)
    return np.arange(n_bins + 1) / n_bins


def num_bins(n_bins: int = NUM_BINS, convention: str = "standard") -> int:
    """How many bins a convention uses: `n_bins`, plus the bin of confidence 1 in the `"rlcr_paper"` convention."""
    return _check_n_bins(n_bins) + (_check_convention(convention) == "rlcr_paper")


def bin_indices(
    confidences: Sequence[float] | np.ndarray, n_bins: int = NUM_BINS, convention: str = "standard"
) -> np.ndarray:
    """Bin index of each confidence.

    `"standard"`: bin k (0 .. n_bins-1) covers (k/n, (k+1)/n], and 0.0 goes to bin 0. With 10 bins: 0.1 -> 0,
    0.3 -> 2, 0.30000001 -> 3, 1.0 -> 9, 0.0 -> 0.

    `"rlcr_paper"`: bin k covers [k/n, (k+1)/n), and 1.0 goes to bin n_bins of its own; unparsable (None, NaN) counts
    as 0. With 10 bins: 0.1 -> 1, 0.3 -> 3, 0.29999999 -> 2, 1.0 -> 10, 0.0 -> 0, None -> 0.
    """
    edges = bin_edges(n_bins)
    c = _as_confidences(confidences, convention)
    if convention == "rlcr_paper":
        return (np.searchsorted(edges, c, side="right") - 1).astype(np.int64)
    idx = np.searchsorted(edges, c, side="left") - 1
    return np.clip(idx, 0, len(edges) - 2).astype(np.int64)


def _bin_stats(
    c: np.ndarray, y: np.ndarray, n_bins: int, convention: str = "standard"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin count, mean confidence and accuracy (NaN for empty bins) for validated inputs."""
    idx = bin_indices(c, n_bins, convention)
    size = num_bins(n_bins, convention)
    counts = np.bincount(idx, minlength=size)
    sum_conf = np.bincount(idx, weights=c, minlength=size)
    sum_acc = np.bincount(idx, weights=y, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(counts > 0, sum_conf / counts, np.nan)
        acc = np.where(counts > 0, sum_acc / counts, np.nan)
    return counts, mean_conf, acc


def reliability_bins(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[Any] | np.ndarray,
    n_bins: int = NUM_BINS,
    convention: str = "standard",
) -> list[dict[str, float | int]]:
    """Per-bin statistics: `lower`, `upper`, `count`, `mean_confidence` and `accuracy` (the last two NaN if empty).

    In the `"rlcr_paper"` convention the last bin holds confidence 1 alone (`lower == upper == 1.0`).
    """
    n_bins = _check_n_bins(n_bins)
    c, y = _validate(confidences, correct, convention)
    edges = np.append(bin_edges(n_bins), 1.0) if convention == "rlcr_paper" else bin_edges(n_bins)
    counts, mean_conf, acc = _bin_stats(c, y, n_bins, convention)
    return [
        {
            "lower": float(edges[k]),
            "upper": float(edges[k + 1]),
            "count": int(counts[k]),
            "mean_confidence": float(mean_conf[k]),
            "accuracy": float(acc[k]),
        }
        for k in range(len(counts))
    ]


def expected_calibration_error(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[Any] | np.ndarray,
    n_bins: int = NUM_BINS,
    convention: str = "standard",
) -> float:
    """ECE = sum over bins of (n_b / N) * |accuracy_b - mean_confidence_b|; NaN for empty input."""
    n_bins = _check_n_bins(n_bins)
    c, y = _validate(confidences, correct, convention)
    if len(c) == 0:
        return float("nan")
    counts, mean_conf, acc = _bin_stats(c, y, n_bins, convention)
    nonempty = counts > 0
    return float(np.sum(counts[nonempty] / len(c) * np.abs(acc[nonempty] - mean_conf[nonempty])))


def brier_score(
    confidences: Sequence[float] | np.ndarray, correct: Sequence[Any] | np.ndarray, convention: str = "standard"
) -> float:
    """Mean of (confidence - correct)^2; NaN for empty input."""
    c, y = _validate(confidences, correct, convention)
    if len(c) == 0:
        return float("nan")
    return float(np.mean((c - y) ** 2))


def auroc(
    confidences: Sequence[float] | np.ndarray, correct: Sequence[Any] | np.ndarray, convention: str = "standard"
) -> float | None:
    """Area under the ROC curve of confidence as a predictor of correctness (ties count one half).

    None when it is undefined: empty input, or only correct (or only incorrect) answers.
    """
    c, y = _validate(confidences, correct, convention)
    if len(c) == 0 or np.unique(y).size < 2:
        return None
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y.astype(np.int64), c))


def brier_skill(confidences: Sequence[float] | np.ndarray, correct: Sequence[Any] | np.ndarray) -> float:
    """1 - Brier / Brier of the best constant confidence (the base rate p, whose Brier is p(1 - p)).

    0 for any constant at the base rate, negative for worse, 1 for a perfect 0/1 predictor. NaN when undefined:
    empty input, or every answer right (or every one wrong), where the constant is already perfect."""
    c, y = _validate(confidences, correct)
    if len(c) == 0:
        return float("nan")
    reference = float(np.mean(y) * (1 - np.mean(y)))
    return float("nan") if reference == 0 else 1.0 - float(np.mean((c - y) ** 2)) / reference


def _as_groups(groups: Sequence[Any], n: int) -> np.ndarray:
    if len(groups) != n:
        raise ValueError(f"groups must have one entry per answer, got {len(groups)} groups for {n} answers.")
    _, codes = np.unique(np.asarray([str(g) for g in groups]), return_inverse=True)
    return codes


def grouped_auroc(
    confidences: Sequence[float] | np.ndarray, correct: Sequence[Any] | np.ndarray, groups: Sequence[Any]
) -> float:
    """AUROC over the right/wrong pairs of answers in the same group (ties count one half), pooled over groups: the
    share of such pairs where the right answer has the higher confidence.

    A confidence that depends on the group alone (e.g. the difficulty level written in the question) scores 0.5. NaN
    when no group has both a right and a wrong answer."""
    c, y = _validate(confidences, correct)
    codes = _as_groups(groups, len(c))
    wins = pairs = 0.0
    for group in np.unique(codes):
        right, wrong = c[(codes == group) & (y == 1)], c[(codes == group) & (y == 0)]
        if right.size and wrong.size:
            diff = right[:, None] - wrong[None, :]
            wins += float(np.sum(diff > 0) + 0.5 * np.sum(diff == 0))
            pairs += right.size * wrong.size
    return wins / pairs if pairs else float("nan")


def grouped_brier_skill(
    confidences: Sequence[float] | np.ndarray, correct: Sequence[Any] | np.ndarray, groups: Sequence[Any]
) -> float:
    """1 - Brier / Brier of each group's base rate (stating, for every answer, its group's accuracy): 0 for a
    confidence that knows the groups' accuracies and nothing else. NaN when every group is all right or all wrong."""
    c, y = _validate(confidences, correct)
    codes = _as_groups(groups, len(c))
    if len(c) == 0:
        return float("nan")
    rates = np.bincount(codes, weights=y) / np.bincount(codes)
    reference = float(np.mean((rates[codes] - y) ** 2))
    return float("nan") if reference == 0 else 1.0 - float(np.mean((c - y) ** 2)) / reference


# The metrics `bootstrap_intervals` gives intervals for (the grouped ones only with groups).
INTERVAL_METRICS = ("accuracy", "ece", "brier", "auroc", "brier_skill", "auroc_within_groups", "brier_skill_groups")


def _metrics(c: np.ndarray, y: np.ndarray, codes: np.ndarray | None, n_bins: int) -> dict[str, float]:
    values = {
        "accuracy": float(np.mean(y)) if len(y) else float("nan"),
        "ece": expected_calibration_error(c, y, n_bins),
        "brier": brier_score(c, y),
        "auroc": _auroc_or_nan(c, y),
        "brier_skill": brier_skill(c, y),
    }
    if codes is not None:
        values["auroc_within_groups"] = grouped_auroc(c, y, codes)
        values["brier_skill_groups"] = grouped_brier_skill(c, y, codes)
    return values


def _auroc_or_nan(c: np.ndarray, y: np.ndarray) -> float:
    """AUROC by ranks (ties one half), as `auroc` but NaN when undefined; fast enough for bootstrap resamples."""
    positives, negatives = c[y == 1], c[y == 0]
    if not positives.size or not negatives.size:
        return float("nan")
    diff = positives[:, None] - negatives[None, :]
    return float((np.sum(diff > 0) + 0.5 * np.sum(diff == 0)) / diff.size)


def bootstrap_intervals(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[Any] | np.ndarray,
    groups: Sequence[Any] | None = None,
    n_resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    n_bins: int = NUM_BINS,
) -> dict[str, list[float] | None]:
    """Percentile-bootstrap intervals (`level`, default 95%) of accuracy, ECE, Brier, AUROC and Brier skill, and with
    `groups` of the AUROC within groups and the skill against the groups' base rates: answers resampled with
    replacement `n_resamples` times (a fixed `seed`: the same intervals for the same answers). A metric undefined in
    a resample (AUROC with one class) is left out of that metric's percentiles; `None` when undefined in over half of
    them (or on empty input)."""
    c, y = _validate(confidences, correct)
    codes = None if groups is None else _as_groups(groups, len(c))
    names = [name for name in INTERVAL_METRICS if codes is not None or "groups" not in name]
    if len(c) == 0:
        return {name: None for name in names}
    rng = np.random.default_rng(seed)
    samples = {name: [] for name in names}
    for _ in range(n_resamples):
        index = rng.integers(0, len(c), len(c))
        for name, value in _metrics(c[index], y[index], None if codes is None else codes[index], n_bins).items():
            samples[name].append(value)
    tail = (1 - level) / 2 * 100
    intervals = {}
    for name, values in samples.items():
        finite = np.asarray(values)[np.isfinite(values)]
        intervals[name] = (
            [float(np.percentile(finite, tail)), float(np.percentile(finite, 100 - tail))]
            if finite.size * 2 > n_resamples
            else None
        )
    return intervals


def bootstrap_mean_interval(
    values: Sequence[float], n_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> list[float] | None:
    """Percentile-bootstrap interval of the mean of `values` (e.g. the 0/1 outcomes of every answer, for accuracy
    over all of them); None on empty input."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return None
    means = x[np.random.default_rng(seed).integers(0, x.size, (n_resamples, x.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return [float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))]


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------


def _json_float(x: Any) -> Any:
    """Python float for numeric scalars, None for NaN/None; other values unchanged."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(x) else float(x)
    return x


@dataclass
class CalibrationReport:
    """Calibration summary of one set of (confidence, correct) pairs; NaN fields mean "undefined" (e.g. n == 0)."""

    n: int
    accuracy: float
    ece: float
    brier: float
    auroc: float | None
    mean_confidence: float
    bins: list[dict[str, float | int]] = field(default_factory=list)
    convention: str = "standard"
    """How bins and unparsable confidences were treated (see the module docstring)."""
    brier_skill: float = float("nan")
    """1 - Brier / the best constant's Brier (`brier_skill`)."""
    auroc_within_groups: float | None = None
    """AUROC over right/wrong pairs of the same group (`grouped_auroc`); None without groups, NaN without such pairs."""
    brier_skill_groups: float | None = None
    """Skill against the groups' base rates (`grouped_brier_skill`); None without groups."""
    intervals: dict[str, list[float] | None] = field(default_factory=dict)
    """Bootstrap 95% intervals of the metrics (`bootstrap_intervals`), when asked for."""

    @property
    def n_bins(self) -> int:
        """The `n_bins` the report was computed with (the `"rlcr_paper"` convention adds the bin of confidence 1)."""
        return len(self.bins) - (self.convention == "rlcr_paper")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict: NaN becomes None, numpy scalars become Python numbers."""
        d = asdict(self)
        out = {k: _json_float(v) for k, v in d.items() if k not in ("bins", "intervals")}
        out["bins"] = [{k: _json_float(v) for k, v in b.items()} for b in d["bins"]]
        out["intervals"] = {k: None if v is None else [_json_float(x) for x in v] for k, v in d["intervals"].items()}
        return out


def calibration_report(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[Any] | np.ndarray,
    n_bins: int = NUM_BINS,
    convention: str = "standard",
    groups: Sequence[Any] | None = None,
    intervals: bool = False,
    seed: int = 0,
) -> CalibrationReport:
    """Accuracy, ECE, Brier score, AUROC, Brier skill, mean confidence and per-bin statistics in one report; with
    `groups` (one per answer, e.g. its difficulty level) also the AUROC within groups and the skill against the
    groups' base rates; with `intervals`, their bootstrap 95% intervals (`bootstrap_intervals`, seeded by `seed`).

    With `convention="rlcr_paper"`, pass every row: unparsable confidences (None or NaN) are scored as 0.
    """
    n_bins = _check_n_bins(n_bins)
    c, y = _validate(confidences, correct, convention)
    n = len(c)
    return CalibrationReport(
        n=n,
        accuracy=float(np.mean(y)) if n else float("nan"),
        ece=expected_calibration_error(c, y, n_bins, convention),
        brier=brier_score(c, y),
        auroc=auroc(c, y),
        mean_confidence=float(np.mean(c)) if n else float("nan"),
        bins=reliability_bins(c, y, n_bins, convention),
        convention=convention,
        brier_skill=brier_skill(c, y),
        auroc_within_groups=None if groups is None else grouped_auroc(c, y, groups),
        brier_skill_groups=None if groups is None else grouped_brier_skill(c, y, groups),
        intervals=bootstrap_intervals(c, y, groups, seed=seed, n_bins=n_bins) if intervals else {},
    )


# ---------------------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------------------

ReportOrPairs = CalibrationReport | tuple[Sequence[float], Sequence[Any]]

_ACC_COLOR = "#1f77b4"
_GAP_COLOR = "#d62728"
_COUNT_COLOR = "#7f7f7f"


def _to_report(obj: Any) -> CalibrationReport:
    if isinstance(obj, CalibrationReport):
        return obj
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return calibration_report(obj[0], obj[1])
    raise TypeError(f"expected a CalibrationReport or a (confidences, correct) pair, got {type(obj).__name__}.")


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _summary_text(report: CalibrationReport) -> str:
    if report.auroc is not None:
        auroc_text = f"AUROC {report.auroc:.3f}"
    elif report.n == 0:
        auroc_text = "AUROC n/a (no data)"
    else:
        auroc_text = "AUROC n/a (one class)"
    lines = [f"ECE {_fmt(report.ece)}", f"Brier {_fmt(report.brier)}", f"Brier skill {_fmt(report.brier_skill)}"]
    lines.append(auroc_text)
    if report.auroc_within_groups is not None:
        lines.append(f"AUROC in groups {_fmt(report.auroc_within_groups)}")
        lines.append(f"skill vs groups {_fmt(report.brier_skill_groups)}")
    return "\n".join(
        [
            *lines,
            f"accuracy {_fmt(report.accuracy)}",
            f"mean conf. {_fmt(report.mean_confidence)}",
            f"n = {report.n}",
        ]
    )


def _draw_panel(fig: Any, spec: Any, report: CalibrationReport, panel_title: str | None, first: bool) -> None:
    """Reliability axis (accuracy bars, gap overlay, diagonal, summary) above a per-bin count histogram."""
    sub = spec.subgridspec(2, 1, height_ratios=[3, 1], hspace=0.08)
    ax = fig.add_subplot(sub[0])
    ax_n = fig.add_subplot(sub[1], sharex=ax)

    bins = report.bins
    lowers = np.array([b["lower"] for b in bins], dtype=float)
    uppers = np.array([b["upper"] for b in bins], dtype=float)
    centres = (lowers + uppers) / 2
    widths = uppers - lowers
    counts = np.array([b["count"] for b in bins], dtype=float)
    acc = np.array([b["accuracy"] for b in bins], dtype=float)
    conf = np.array([b["mean_confidence"] for b in bins], dtype=float)
    filled = counts > 0

    ax.plot([0, 1], [0, 1], linestyle="--", color="black", linewidth=1, label="perfect calibration", zorder=3)
    ax.bar(
        centres[filled],
        acc[filled],
        width=widths[filled],
        color=_ACC_COLOR,
        edgecolor="black",
        linewidth=0.6,
        alpha=0.85,
        label="accuracy",
        zorder=1,
    )
    gap_low = np.minimum(acc, conf)[filled]
    gap_height = np.abs(acc - conf)[filled]
    ax.bar(
        centres[filled],
        gap_height,
        bottom=gap_low,
        width=widths[filled],
        color=_GAP_COLOR,
        alpha=0.3,
        edgecolor=_GAP_COLOR,
        hatch="//",
        linewidth=0.6,
        label="gap |acc - conf|",
        zorder=2,
    )
    ax.scatter(
        centres[filled],
        conf[filled],
        marker="_",
        s=220,
        linewidths=2,
        color="black",
        label="mean confidence",
        zorder=4,
    )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("auto")
    ax.set_ylabel("accuracy" if first else "")
    ax.grid(True, alpha=0.3, zorder=0)
    ax.tick_params(labelbottom=False)
    if panel_title:
        ax.set_title(panel_title)
    ax.text(
        0.03,
        0.97,
        _summary_text(report),
        transform=ax.transAxes,
        va="top",
        ha="left",
        fontsize=9,
        family="monospace",
        bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"},
        zorder=5,
    )

    ax_n.bar(centres, counts, width=widths, color=_COUNT_COLOR, edgecolor="black", linewidth=0.6)
    top = counts.max() if counts.size and counts.max() > 0 else 1.0
    ax_n.set_ylim(0, top * 1.3)
    for x, k in zip(centres[filled], counts[filled]):
        ax_n.text(x, k + top * 0.03, f"{int(k)}", ha="center", va="bottom", fontsize=7)
    ax_n.set_xlim(0, 1)
    ax_n.set_xlabel("stated confidence")
    ax_n.set_ylabel("count" if first else "")
    ax_n.grid(True, axis="y", alpha=0.3)


def _figure_legend(fig: Any, n_panels: int) -> None:
    """One legend below all panels, so it never hides a bar."""
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2 if n_panels == 1 else 4, fontsize=9, frameon=False)


def _save(fig: Any, path: str | os.PathLike) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=120)
    return str(path)


def reliability_diagram(report_or_pairs: ReportOrPairs, path: str | os.PathLike, title: str | None = None) -> str:
    """Write a reliability diagram PNG for a CalibrationReport or a (confidences, correct) pair; return the path.

    Bars show per-bin accuracy, hatched red the gap to the bin's mean confidence (black ticks), the dashed diagonal
    perfect calibration; a lower panel shows how many answers fall in each bin, and a box gives ECE, Brier and AUROC.
    """
    from matplotlib.figure import Figure

    report = _to_report(report_or_pairs)
    fig = Figure(figsize=(5.5, 6.5), layout="constrained")
    spec = fig.add_gridspec(1, 1)[0]
    _draw_panel(fig, spec, report, None, first=True)
    fig.suptitle(title or "Reliability diagram")
    _figure_legend(fig, 1)
    return _save(fig, path)


def plot_reliability_diagrams(
    reports: Mapping[str, ReportOrPairs], path: str | os.PathLike, title: str | None = None
) -> str:
    """Write side-by-side reliability diagrams (e.g. {"before": r0, "after": r1}) into one PNG; return the path."""
    from matplotlib.figure import Figure

    if not reports:
        raise ValueError("plot_reliability_diagrams needs at least one report.")
    items = [(name, _to_report(r)) for name, r in reports.items()]
    fig = Figure(figsize=(5.0 * len(items), 6.5), layout="constrained")
    grid = fig.add_gridspec(1, len(items))
    for i, (name, report) in enumerate(items):
        _draw_panel(fig, grid[i], report, str(name), first=i == 0)
    if title:
        fig.suptitle(title)
    _figure_legend(fig, len(items))
    return _save(fig, path)


__all__ = [
    "CONVENTIONS",
    "INTERVAL_METRICS",
    "NUM_BINS",
    "CalibrationReport",
    "auroc",
    "bin_edges",
    "bin_indices",
    "bootstrap_intervals",
    "bootstrap_mean_interval",
    "brier_score",
    "brier_skill",
    "calibration_report",
    "expected_calibration_error",
    "grouped_auroc",
    "grouped_brier_skill",
    "num_bins",
    "plot_reliability_diagrams",
    "reliability_bins",
    "reliability_diagram",
]
