"""The held-out evaluation's per-sample math (`trl_ext.evaluation.heldout_metrics`), against hand-computed values."""

import math

import pytest

from trl_ext.evaluation.heldout_metrics import accuracy_by_field, calibration_metrics, sample_accuracy


def test_sample_accuracy_by_hand():
    # 3 questions x 2 samples; the last question has no gold (both samples unscored)
    metrics = sample_accuracy([[1.0, 0.0], [1.0, 1.0], [None, None]])
    assert metrics["accuracy"] == 0.75  # 3 of 4 scored samples
    assert metrics["mean@2"] == 0.75  # (0.5 + 1.0) / 2
    assert metrics["pass@2"] == 1.0
    assert metrics["num_questions"] == 3 and metrics["num_samples"] == 6
    assert metrics["num_unscored"] == 2 and metrics["num_unscored_questions"] == 1


def test_mean_at_k_weights_questions_not_samples():
    # one sample of the first question could not be scored: accuracy over samples differs from mean@k
    metrics = sample_accuracy([[1.0, None, None], [0.0, 0.0, 1.0]])
    assert metrics["accuracy"] == 0.5  # 2 of 4
    assert metrics["mean@3"] == pytest.approx((1.0 + 1 / 3) / 2)
    assert metrics["pass@3"] == 1.0 and metrics["num_unscored"] == 2
    assert sample_accuracy([[0.0], [0.5]])["pass@1"] == 0.0  # partial credit is not a pass


def test_sample_accuracy_of_nothing_scored_is_nan():
    metrics = sample_accuracy([[None]])
    assert math.isnan(metrics["accuracy"]) and math.isnan(metrics["mean@1"]) and math.isnan(metrics["pass@1"])


def test_calibration_metrics_by_hand():
    metrics = calibration_metrics([1, 0, None, 1], [0.9, 0.2, 0.5, None])
    assert metrics["answer/accuracy"] == pytest.approx(2 / 3)
    assert metrics["confidence/parse_fail_rate"] == 0.25
    assert metrics["confidence/mean"] == pytest.approx((0.9 + 0.2 + 0.5) / 3)
    # calibrated: (0.9, 1) and (0.2, 0) only (gold and a parsed confidence)
    assert metrics["calibration/ece"] == pytest.approx(0.15)
    assert metrics["calibration/brier"] == pytest.approx(0.025)
    assert metrics["calibration/auroc"] == 1.0
    assert metrics["num_missing_gold"] == 1 and metrics["num_calibrated"] == 2 and metrics["num_samples"] == 4


def test_calibration_auroc_undefined_with_one_class():
    metrics = calibration_metrics([1, 1], [0.5, 1.0])
    assert math.isnan(metrics["calibration/auroc"])
    assert metrics["calibration/brier"] == pytest.approx(0.125)  # (0.25 + 0) / 2
    with pytest.raises(ValueError, match="2 outcomes for 1 confidences"):
        calibration_metrics([1, 0], [0.5])


def test_accuracy_by_field_by_hand():
    questions = [
        {"level": 1, "task_type": "deduction"},
        {"level": 1, "task_type": "abduction"},
        {"level": 2, "task_type": "deduction"},
        {"level": 10},
    ]
    metrics = accuracy_by_field([1.0, 0.0, None, 1.0], questions, ["level", "task_type"])
    assert metrics == {
        "accuracy/level_1": 0.5,
        "num_samples/level_1": 2.0,
        "accuracy/level_2": pytest.approx(math.nan, nan_ok=True),  # its one sample is unscored
        "num_samples/level_2": 1.0,
        "accuracy/level_10": 1.0,
        "num_samples/level_10": 1.0,
        "accuracy/task_type_abduction": 0.0,
        "num_samples/task_type_abduction": 1.0,
        "accuracy/task_type_deduction": 1.0,
        "num_samples/task_type_deduction": 2.0,
    }
    assert list(metrics)[:6:2] == ["accuracy/level_1", "accuracy/level_2", "accuracy/level_10"]  # numeric order


def test_calibration_metrics_within_groups_by_hand():
    # calibrated: (0.9, 1, a), (0.9, 0, a), (0.2, 0, b), (0.3, 1, b); the unparsable sample is left out
    metrics = calibration_metrics([1, 0, 0, 1, 0], [0.9, 0.9, 0.2, 0.3, None], ["a", "a", "b", "b", "b"])
    # a: a tie (1/2); b: 0.3 right over 0.2 wrong (1): 1.5 of 2 pairs
    assert metrics["calibration/auroc_within_groups"] == pytest.approx(0.75)
    # Brier (0.01 + 0.81 + 0.04 + 0.49) / 4 = 0.3375; base rate 1/2 overall and in each group: reference 0.25
    assert metrics["calibration/brier_skill"] == pytest.approx(1 - 0.3375 / 0.25)
    assert metrics["calibration/brier_skill_groups"] == pytest.approx(1 - 0.3375 / 0.25)
    ungrouped = calibration_metrics([1, 0], [0.9, 0.2], [None, None])  # no group anywhere: no group metrics
    assert "calibration/auroc_within_groups" not in ungrouped and ungrouped["calibration/brier_skill"] == 0.9
    with pytest.raises(ValueError, match="1 groups for 2 outcomes"):
        calibration_metrics([1, 0], [0.5, 0.5], ["a"])
