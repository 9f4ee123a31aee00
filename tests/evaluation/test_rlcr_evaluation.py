"""The calibration evaluation: its report from per-sample rows (the trainers' held-out records or its own greedy
replies), and the greedy evaluation of a model outside a trainer reproduces its own numbers."""

import pytest
import torch

from trl_ext.data import graded_arithmetic
from trl_ext.evaluation.rlcr import calibration_evaluation, evaluate_calibration
from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig


def test_evaluation_reproduces_its_numbers(tmp_path):
    model, tokenizer = tiny_causal_lm(seed=3, initializer_range=0.5)  # context-dependent replies
    dataset = graded_arithmetic(12, seed=7)
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        num_generations_confidence=2,
        max_completion_length=6,
        max_confidence_length=4,
        lenient_parsing=True,
    )
    first = evaluate_calibration(model, tokenizer, dataset, args, batch_size=5, progress=False)
    torch.manual_seed(1234)  # another global RNG state (training samples between evaluations)
    torch.rand(100)
    second = evaluate_calibration(model, tokenizer, dataset, args, batch_size=5, progress=False)
    assert first.rows == second.rows and first.to_dict() == second.to_dict()
    assert len({row["answer"] for row in first.rows}) > 1  # the replies differ by question: not a constant model
    assert model.training  # left in the mode it was found in


def test_report_from_rows_counts_missing_gold_and_unparsable_confidences():
    rows = [
        {"correct": 1.0, "confidence": 0.9, "answer": "<answer>5</answer>"},
        {"correct": 0.0, "confidence": 0.2},
        {"correct": None, "confidence": 0.5},  # no gold: left out, counted
        {"correct": 0.0, "confidence": None},  # unparsable: judged, not calibrated
    ]
    result = calibration_evaluation(rows, rlcr_paper_convention=True)
    assert result.num_missing_gold == 1 and len(result.rows) == 3 and result.rows[0]["answer"] == "<answer>5</answer>"
    assert result.accuracy == pytest.approx(1 / 3)
    assert result.confidence_parse_fail_rate == pytest.approx(1 / 3)
    assert result.report.n == 2 and result.report.brier == pytest.approx((0.1**2 + 0.2**2) / 2)
    assert result.report.auroc == 1.0
    # the paper's convention scores the unparsable confidence as 0 (Brier 0 on a wrong answer)
    assert result.paper_report.n == 3 and result.paper_report.brier == pytest.approx((0.1**2 + 0.2**2) / 3)
