"""Tests of trl_ext.evaluation.calibration: bin convention, hand-computed metrics, report serialisation, plots, validation."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from trl_ext.evaluation.calibration import (
    NUM_BINS,
    CalibrationReport,
    auroc,
    bin_indices,
    bootstrap_intervals,
    brier_score,
    brier_skill,
    calibration_report,
    expected_calibration_error,
    grouped_auroc,
    grouped_brier_skill,
    num_bins,
    plot_reliability_diagrams,
    reliability_bins,
    reliability_diagram,
)


# The running example used by several tests.
CONF = [0.9, 0.9, 0.2, 0.3, 0.3]
CORRECT = [1, 0, 0, 1, 0]


# ---------------------------------------------------------------------------------------------------------------------
# Bin convention: bin k covers (k/n, (k+1)/n], 0.0 goes to bin 0
# ---------------------------------------------------------------------------------------------------------------------


def test_num_bins_default():
    assert NUM_BINS == 10


@pytest.mark.parametrize(
    "c, expected",
    [
        (0.0, 0),
        (1e-12, 0),
        (0.05, 0),
        (0.1, 0),  # upper edge of bin 0 is inclusive
        (0.10000001, 1),
        (0.2, 1),
        (0.3, 2),  # linspace would give the edge 0.30000000000000004 and put 0.3 in bin 3
        (0.30000001, 3),
        (0.5, 4),
        (0.7, 6),
        (0.9, 8),
        (0.95, 9),
        (1.0, 9),
    ],
)
def test_bin_indices_ten_bins(c, expected):
    assert bin_indices([c]).tolist() == [expected]
    assert bin_indices([c], n_bins=10).tolist() == [expected]


def test_bin_indices_every_edge_belongs_to_the_bin_below():
    for n in (1, 2, 3, 5, 7, 10, 15, 20):
        edges_as_literals = [k / n for k in range(1, n + 1)]
        assert bin_indices(edges_as_literals, n_bins=n).tolist() == list(range(n)), n
        assert bin_indices([0.0], n_bins=n).tolist() == [0]


def test_bin_indices_three_bins():
    assert bin_indices([0.0, 0.2, 1 / 3, 0.34, 0.5, 2 / 3, 0.67, 1.0], n_bins=3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2]


def test_bin_indices_one_bin_and_dtype():
    idx = bin_indices(np.array([0.0, 0.5, 1.0]), n_bins=1)
    assert idx.tolist() == [0, 0, 0]
    assert idx.dtype == np.int64


@pytest.mark.parametrize("n_bins", [0, -1, 2.5, True])
def test_bin_indices_rejects_bad_n_bins(n_bins):
    with pytest.raises(ValueError, match="n_bins"):
        bin_indices([0.5], n_bins=n_bins)


# ---------------------------------------------------------------------------------------------------------------------
# Reliability bins and ECE
# ---------------------------------------------------------------------------------------------------------------------


def test_reliability_bins_example():
    bins = reliability_bins(CONF, CORRECT)
    assert len(bins) == 10
    assert [b["count"] for b in bins] == [0, 1, 2, 0, 0, 0, 0, 0, 2, 0]
    assert bins[2]["lower"] == 0.2 and bins[2]["upper"] == 0.3
    assert bins[1]["mean_confidence"] == pytest.approx(0.2) and bins[1]["accuracy"] == 0.0
    assert bins[2]["mean_confidence"] == pytest.approx(0.3) and bins[2]["accuracy"] == 0.5
    assert bins[8]["mean_confidence"] == pytest.approx(0.9) and bins[8]["accuracy"] == 0.5
    assert math.isnan(bins[0]["mean_confidence"]) and math.isnan(bins[0]["accuracy"])
    assert set(bins[0]) == {"lower", "upper", "count", "mean_confidence", "accuracy"}


def test_ece_hand_computed():
    # Bins (k/10, (k+1)/10]:
    #   bin 1 (0.1, 0.2]: {0.2 -> 0}              n=1, conf 0.2, acc 0.0, gap 0.2
    #   bin 2 (0.2, 0.3]: {0.3 -> 1, 0.3 -> 0}    n=2, conf 0.3, acc 0.5, gap 0.2
    #   bin 8 (0.8, 0.9]: {0.9 -> 1, 0.9 -> 0}    n=2, conf 0.9, acc 0.5, gap 0.4
    # ECE = 1/5 * 0.2 + 2/5 * 0.2 + 2/5 * 0.4 = 0.04 + 0.08 + 0.16 = 0.28
    assert expected_calibration_error(CONF, CORRECT) == pytest.approx(0.28)


def test_ece_depends_on_binning():
    # One bin (0, 1]: conf = (0.9+0.9+0.2+0.3+0.3)/5 = 2.6/5 = 0.52, acc = 2/5 = 0.4, ECE = |0.4 - 0.52| = 0.12
    assert expected_calibration_error(CONF, CORRECT, n_bins=1) == pytest.approx(0.12)
    # Two bins: (0, 0.5] = {0.2, 0.3, 0.3}: conf 0.8/3, acc 1/3, gap 0.2/3; (0.5, 1] = {0.9, 0.9}: conf 0.9, acc 0.5,
    # gap 0.4. ECE = 3/5 * 0.2/3 + 2/5 * 0.4 = 0.04 + 0.16 = 0.2
    assert expected_calibration_error(CONF, CORRECT, n_bins=2) == pytest.approx(0.2)


def test_ece_perfect_calibration_is_zero():
    conf = [0.0] * 3 + [0.25] * 4 + [0.75] * 4 + [1.0] * 2
    correct = [0] * 3 + [1, 0, 0, 0] + [1, 1, 1, 0] + [1, 1]
    assert expected_calibration_error(conf, correct) == pytest.approx(0.0, abs=1e-12)


def test_ece_fully_wrong_and_confident_is_one():
    assert expected_calibration_error([1.0, 1.0], [0, 0]) == pytest.approx(1.0)
    assert expected_calibration_error([0.0, 0.0], [True, True]) == pytest.approx(1.0)


def test_ece_matches_naive_loop():
    rng = np.random.default_rng(0)
    conf = np.round(rng.random(400), 2)  # many values land exactly on bin edges
    correct = rng.random(400) < conf
    for n in (3, 10, 15):
        total = 0.0
        for k in range(n):
            lo, hi = k / n, (k + 1) / n
            in_bin = (conf > lo) & (conf <= hi) if k > 0 else (conf >= lo) & (conf <= hi)
            if in_bin.any():
                total += in_bin.sum() / len(conf) * abs(correct[in_bin].mean() - conf[in_bin].mean())
        assert expected_calibration_error(conf, correct, n_bins=n) == pytest.approx(total)


def test_bools_numpy_and_lists_agree():
    expected = expected_calibration_error(CONF, CORRECT)
    assert expected_calibration_error(np.array(CONF), np.array(CORRECT, dtype=bool)) == pytest.approx(expected)
    assert expected_calibration_error(tuple(CONF), [bool(x) for x in CORRECT]) == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------------------------------
# Brier and AUROC
# ---------------------------------------------------------------------------------------------------------------------


def test_brier_hand_computed():
    # (0.9-1)^2 + (0.9-0)^2 + (0.2-0)^2 + (0.3-1)^2 + (0.3-0)^2 = 0.01 + 0.81 + 0.04 + 0.49 + 0.09 = 1.44; / 5 = 0.288
    assert brier_score(CONF, CORRECT) == pytest.approx(0.288)
    assert brier_score([1.0, 0.0], [1, 0]) == 0.0
    assert brier_score([0.0, 1.0], [1, 0]) == 1.0
    assert brier_score([0.5] * 4, [1, 0, 1, 1]) == pytest.approx(0.25)


def test_auroc_hand_values():
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5  # all ties count one half
    # Positives {0.9, 0.3}, negatives {0.9, 0.2, 0.3}. Pairs (pos, neg) won: 0.9 beats 0.2 and 0.3, ties 0.9 -> 2.5;
    # 0.3 beats 0.2, ties 0.3, loses to 0.9 -> 1.5. AUROC = (2.5 + 1.5) / 6 = 2/3
    assert auroc(CONF, CORRECT) == pytest.approx(2 / 3)


def test_auroc_undefined():
    assert auroc([0.2, 0.9], [1, 1]) is None
    assert auroc([0.2, 0.9], [False, False]) is None
    assert auroc([], []) is None


def test_empty_input_gives_nan():
    assert math.isnan(expected_calibration_error([], []))
    assert math.isnan(brier_score([], []))
    assert bin_indices([]).tolist() == []


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------


def test_calibration_report_fields():
    r = calibration_report(CONF, CORRECT)
    assert isinstance(r, CalibrationReport)
    assert r.n == 5
    assert r.accuracy == pytest.approx(0.4)
    assert r.mean_confidence == pytest.approx(0.52)
    assert r.ece == pytest.approx(0.28)
    assert r.brier == pytest.approx(0.288)
    assert r.auroc == pytest.approx(2 / 3)
    assert len(r.bins) == 10 and r.n_bins == 10
    assert calibration_report(CONF, CORRECT, n_bins=4).n_bins == 4


def test_report_to_dict_is_json_serialisable():
    d = calibration_report(CONF, CORRECT).to_dict()
    back = json.loads(json.dumps(d, allow_nan=False))
    assert back["ece"] == pytest.approx(0.28)
    assert back["bins"][0] == {"lower": 0.0, "upper": 0.1, "count": 0, "mean_confidence": None, "accuracy": None}
    assert back["bins"][8]["count"] == 2


def test_report_to_dict_undefined_values():
    one_class = calibration_report([0.7, 0.9], [1, 1]).to_dict()
    assert one_class["auroc"] is None
    json.dumps(one_class, allow_nan=False)

    empty = calibration_report([], []).to_dict()
    assert empty["n"] == 0
    for key in ("accuracy", "ece", "brier", "auroc", "mean_confidence"):
        assert empty[key] is None, key
    assert all(b["count"] == 0 for b in empty["bins"])
    json.dumps(empty, allow_nan=False)


# ---------------------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------------------


def _is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_reliability_diagram_writes_png_without_touching_pyplot(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt

    backend = matplotlib.get_backend()
    fignums = plt.get_fignums()

    out = reliability_diagram(calibration_report(CONF, CORRECT), tmp_path / "one.png", title="example")
    assert out == str(tmp_path / "one.png")
    assert _is_png(out)

    out = reliability_diagram((CONF, CORRECT), str(tmp_path / "sub" / "pairs.png"))  # parent folder is created
    assert _is_png(out)

    assert matplotlib.get_backend() == backend
    assert plt.get_fignums() == fignums


def test_reliability_diagram_degenerate_inputs(tmp_path):
    assert _is_png(reliability_diagram(([0.8, 0.9], [1, 1]), tmp_path / "one_class.png"))
    assert _is_png(reliability_diagram(([], []), tmp_path / "empty.png"))


def test_plot_reliability_diagrams(tmp_path):
    import matplotlib.pyplot as plt

    fignums = plt.get_fignums()
    before = calibration_report([0.9, 0.9, 0.8, 0.95], [1, 0, 0, 0])
    after = ([0.3, 0.6, 0.7, 0.2], [0, 1, 1, 0])
    out = plot_reliability_diagrams({"before": before, "after": after}, tmp_path / "pair.png", title="RLCR")
    assert _is_png(out)
    assert plt.get_fignums() == fignums
    with pytest.raises(ValueError, match="at least one"):
        plot_reliability_diagrams({}, tmp_path / "none.png")


def test_plot_rejects_unknown_input(tmp_path):
    with pytest.raises(TypeError, match="CalibrationReport"):
        reliability_diagram({"conf": CONF}, tmp_path / "x.png")


def test_import_and_plot_do_not_load_pyplot(tmp_path):
    code = (
        "import sys\n"
        "from trl_ext.evaluation.calibration import reliability_diagram\n"
        "assert 'matplotlib' not in sys.modules\n"
        f"reliability_diagram(([0.2, 0.9], [0, 1]), {str(tmp_path / 'p.png')!r})\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert _is_png(tmp_path / "p.png")


# ---------------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------------


def test_length_mismatch_names_both_lengths():
    for fn in (expected_calibration_error, brier_score, auroc, calibration_report, reliability_bins):
        with pytest.raises(ValueError, match=r"5 confidences and 4 correct"):
            fn(CONF, CORRECT[:4])


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), float("inf")])
def test_out_of_range_or_nan_confidence(bad):
    conf = [0.5, bad, 0.2]
    for fn in (expected_calibration_error, brier_score, auroc, calibration_report):
        with pytest.raises(ValueError, match="[Ff]ilter out unparsable confidences first"):
            fn(conf, [1, 0, 1])
    with pytest.raises(ValueError, match="index 1"):
        bin_indices(conf)


def test_non_numeric_confidence():
    with pytest.raises(ValueError, match="unparsable"):
        brier_score([0.5, None], [1, 0])
    with pytest.raises(ValueError, match="unparsable"):
        brier_score([0.5, "high"], [1, 0])


@pytest.mark.parametrize("bad", [[1, 2], [0.5, 1], [1, float("nan")]])
def test_correct_must_be_binary(bad):
    with pytest.raises(ValueError, match="0/1"):
        brier_score([0.5, 0.5], bad)


def test_two_dimensional_input_rejected():
    with pytest.raises(ValueError, match="1-D"):
        brier_score([[0.5, 0.5]], [[1, 0]])


# ---------------------------------------------------------------------------------------------------------------------
# The RLCR paper's convention: edges to the upper bin, 1.0 alone, unparsable confidences scored as 0
# ---------------------------------------------------------------------------------------------------------------------


def test_paper_convention_bin_indices():
    c = [0.0, 0.1, 0.3, 0.29999999, 0.35, 0.99, 1.0, None, float("nan")]
    assert bin_indices(c, convention="rlcr_paper").tolist() == [0, 1, 3, 2, 3, 9, 10, 0, 0]
    assert num_bins(10, "rlcr_paper") == 11 and num_bins(10) == 10
    assert bin_indices([0.5, 1.0], n_bins=2, convention="rlcr_paper").tolist() == [1, 2]


def test_conventions_agree_when_no_confidence_sits_on_an_edge_that_regroups():
    # 0.9, 0.2, 0.3 move one bin up together with their siblings: the same groups, the same ECE (0.28)
    assert expected_calibration_error(CONF, CORRECT, convention="rlcr_paper") == pytest.approx(0.28)


@pytest.mark.parametrize(
    "c, y, standard, paper",
    [
        # 0.3 | 0.35 (standard: two bins) vs 0.3, 0.35 in [0.3, 0.4): |0.5 - 0.325|
        ([0.3, 0.35], [1, 0], 0.5 * 0.7 + 0.5 * 0.35, 0.175),
        # 0.1 joins 0.15 in [0.1, 0.2)
        ([0.1, 0.15], [1, 0], 0.5 * 0.9 + 0.5 * 0.15, 0.375),
        # 1.0 and 0.95 share (0.9, 1] in ours; 1.0 has a bin of its own in the paper's
        ([1.0, 0.95], [0, 1], 0.475, 0.5 * 1.0 + 0.5 * 0.05),
        # 0.0 is in bin 0 in both: |0.5 - 0.025|
        ([0.0, 0.05], [0, 1], 0.475, 0.475),
    ],
)
def test_paper_convention_ece_by_hand(c, y, standard, paper):
    assert expected_calibration_error(c, y) == pytest.approx(standard)
    assert expected_calibration_error(c, y, convention="rlcr_paper") == pytest.approx(paper)


def test_paper_convention_scores_unparsable_confidences_as_zero():
    c, y = [0.8, None, float("nan")], [1, 0, 1]
    with pytest.raises(ValueError, match="Filter out unparsable"):
        calibration_report(c, y)  # ours: drop them first
    ours = calibration_report([0.8], [1])
    assert (ours.n, ours.ece, ours.brier) == (1, pytest.approx(0.2), pytest.approx(0.04))

    paper = calibration_report(c, y, convention="rlcr_paper")
    assert paper.n == 3 and paper.convention == "rlcr_paper"
    assert paper.accuracy == pytest.approx(2 / 3)
    assert paper.mean_confidence == pytest.approx(0.8 / 3)
    # bin 0: {0, 0} accuracy 1/2 -> 0.5 * 2/3; bin 8: {0.8} accuracy 1 -> 0.2 * 1/3
    assert paper.ece == pytest.approx(0.5 * 2 / 3 + 0.2 / 3)
    assert paper.brier == pytest.approx((0.04 + 0 + 1) / 3)
    assert paper.auroc == pytest.approx(0.75)  # positives {0.8, 0} vs negative {0}: 1 + 1/2 over 2 pairs
    assert brier_score(c, y, convention="rlcr_paper") == pytest.approx(paper.brier)
    assert auroc(c, y, convention="rlcr_paper") == pytest.approx(0.75)


def test_paper_convention_report_bins():
    report = calibration_report([1.0, 0.3], [1, 0], convention="rlcr_paper")
    assert report.n_bins == 10 and len(report.bins) == 11
    assert report.bins[10] == {"lower": 1.0, "upper": 1.0, "count": 1, "mean_confidence": 1.0, "accuracy": 1.0}
    assert report.bins[3]["count"] == 1 and report.bins[3]["lower"] == 0.3
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert d["convention"] == "rlcr_paper" and d["ece"] == pytest.approx(0.15)
    assert calibration_report([0.3], [0]).to_dict()["convention"] == "standard"


def test_unknown_convention_is_named():
    with pytest.raises(ValueError, match=r"convention must be one of \('standard', 'rlcr_paper'\), got 'torch'"):
        expected_calibration_error([0.5], [1], convention="torch")


# ---------------------------------------------------------------------------------------------------------------------
# Metrics a degenerate calibrator cannot pass, and bootstrap intervals
# ---------------------------------------------------------------------------------------------------------------------

GROUPS = ["a", "a", "b", "b", "b"]


def test_brier_skill_hand_computed():
    # Brier 1.44 / 5 = 0.288; base rate 0.4, the best constant's Brier 0.4 * 0.6 = 0.24; skill 1 - 0.288 / 0.24
    assert brier_skill(CONF, CORRECT) == pytest.approx(-0.2)
    assert brier_skill([0.4] * 5, CORRECT) == pytest.approx(0.0)  # the constant ECE would call perfect
    assert brier_skill([1.0, 0.0, 0.0, 1.0, 0.0], CORRECT) == pytest.approx(1.0)
    assert math.isnan(brier_skill([0.5, 0.9], [1, 1])) and math.isnan(brier_skill([], []))


def test_auroc_within_groups_counts_only_pairs_of_the_same_group():
    # a: right 0.9 vs wrong 0.9, a tie (1/2 of 1 pair); b: right 0.3 vs wrong 0.2 (won) and 0.3 (tie): 1.5 of 2
    assert grouped_auroc(CONF, CORRECT, GROUPS) == pytest.approx(2.0 / 3.0)
    # a confidence that reads the group only: every within-group pair is a tie, though the pooled AUROC is 1
    confidences, correct, groups = [0.9, 0.9, 0.1, 0.1], [1, 0, 0, 0], [1, 1, 2, 2]
    assert auroc(confidences, correct) == pytest.approx(5 / 6) and grouped_auroc(confidences, correct, groups) == 0.5
    assert math.isnan(grouped_auroc([0.9, 0.1], [1, 0], ["a", "b"]))  # no right/wrong pair shares a group
    with pytest.raises(ValueError, match="one entry per answer"):
        grouped_auroc(CONF, CORRECT, ["a"])


def test_brier_skill_against_the_groups_base_rates():
    # base rates a 1/2, b 1/3: reference (0.25 + 0.25 + 1/9 + 4/9 + 1/9) / 5 = 7/30; skill 1 - 0.288 * 30 / 7
    assert grouped_brier_skill(CONF, CORRECT, GROUPS) == pytest.approx(1 - 0.288 * 30 / 7)
    rates = [0.5, 0.5, 1 / 3, 1 / 3, 1 / 3]  # stating each group's accuracy: skill 0 against the groups, > 0 overall
    assert grouped_brier_skill(rates, CORRECT, GROUPS) == pytest.approx(0.0, abs=1e-12)
    assert brier_skill(rates, CORRECT) > 0 and grouped_auroc(rates, CORRECT, GROUPS) == 0.5
    assert math.isnan(grouped_brier_skill([0.2, 0.8], [1, 0], ["a", "b"]))  # each group all right or all wrong


def test_report_carries_the_new_metrics_and_intervals():
    report = calibration_report(CONF, CORRECT, groups=GROUPS, intervals=True)
    assert report.brier_skill == pytest.approx(-0.2) and report.auroc_within_groups == pytest.approx(2 / 3)
    d = json.loads(json.dumps(report.to_dict()))
    assert d["brier_skill_groups"] == pytest.approx(1 - 0.288 * 30 / 7)
    assert set(d["intervals"]) == {
        "accuracy",
        "ece",
        "brier",
        "auroc",
        "brier_skill",
        "auroc_within_groups",
        "brier_skill_groups",
    }
    plain = calibration_report(CONF, CORRECT)
    assert plain.auroc_within_groups is None and plain.intervals == {} and plain.to_dict()["intervals"] == {}


def test_bootstrap_intervals_are_seeded_and_cover_the_estimate():
    rng = np.random.default_rng(0)
    correct = rng.integers(0, 2, 200)
    confidences = np.clip(0.5 + 0.3 * (correct - 0.5) + rng.normal(0, 0.2, 200), 0, 1)
    groups = rng.integers(0, 4, 200)
    first = bootstrap_intervals(confidences, correct, groups, n_resamples=300, seed=1)
    assert first == bootstrap_intervals(confidences, correct, groups, n_resamples=300, seed=1)
    assert first != bootstrap_intervals(confidences, correct, groups, n_resamples=300, seed=2)
    estimates = {
        "accuracy": float(np.mean(correct)),
        "brier": brier_score(confidences, correct),
        "auroc": auroc(confidences, correct),
        "auroc_within_groups": grouped_auroc(confidences, correct, groups),
        "brier_skill_groups": grouped_brier_skill(confidences, correct, groups),
    }
    for name, value in estimates.items():
        low, high = first[name]
        assert low < value < high, name
    # the accuracy interval of 200 answers: about +-1.96 * sqrt(p(1 - p) / n) = +-0.07
    assert 0.1 < first["accuracy"][1] - first["accuracy"][0] < 0.18


def test_bootstrap_intervals_undefined_metrics():
    intervals = bootstrap_intervals([0.9, 0.8, 0.7], [1, 1, 1], n_resamples=50)
    assert intervals["auroc"] is None and intervals["brier_skill"] is None and intervals["accuracy"] == [1.0, 1.0]
    assert "auroc_within_groups" not in intervals  # no groups given
    assert bootstrap_intervals([], [], groups=[], n_resamples=10)["auroc_within_groups"] is None
