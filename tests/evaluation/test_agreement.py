"""The sampling-agreement reference point: the share of sampled answers agreeing with the greedy one, by hand, and
through the greedy calibration evaluation on a tiny model (seeded, with its cost in generated tokens)."""

import torch

from trl_ext.data import graded_arithmetic
from trl_ext.evaluation.agreement import agreement_share, sampled_completions
from trl_ext.evaluation.rlcr import calibration_evaluation, evaluate_calibration
from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig


def test_agreement_share_by_hand():
    assert agreement_share("7", ["7", " 7", "8", None]) == 0.5  # normalised: " 7" is 7; None never agrees
    assert agreement_share(None, ["7", "7"]) == 0.0  # no greedy answer: nothing to agree with
    assert agreement_share("7", []) == 0.0


def test_agreement_report_from_rows():
    rows = [
        {"correct": 1, "confidence": 0.5, "agreement": 1.0, "group": 1},
        {"correct": 0, "confidence": 0.5, "agreement": 0.25, "group": 1},
        {"correct": 0, "confidence": None, "agreement": 0.5, "group": 2},  # unparsable stated confidence: still scored
    ]
    result = calibration_evaluation(rows, agreement_cost={"samples_per_question": 4, "generated_tokens": 40})
    assert result.report.auroc == 0.5 and result.agreement_report.auroc == 1.0
    assert result.agreement_report.n == 3 and result.agreement_report.auroc_within_groups == 1.0
    d = result.to_dict()["sampling_agreement"]
    assert d["generated_tokens"] == 40 and d["samples_per_question"] == 4 and "auroc" in d["intervals"]


def test_sampling_is_seeded_and_evaluation_reports_agreement(tmp_path):
    model, tokenizer = tiny_causal_lm(seed=3, initializer_range=0.5)
    prompts = [[1, 2, 3], [4, 5]]
    first = sampled_completions(model, tokenizer, prompts, k=3, max_new_tokens=4, seed=5)
    torch.manual_seed(99)
    assert first == sampled_completions(model, tokenizer, prompts, k=3, max_new_tokens=4, seed=5)
    assert len(first) == 2 and all(len(samples) == 3 for samples in first)
    assert len({tuple(c) for samples in first for c in samples}) > 1  # sampled, not greedy

    args = cpu_test_args(
        tmp_path, RLCRMultiTurnConfig, max_completion_length=5, max_confidence_length=3, lenient_parsing=True
    )
    dataset = graded_arithmetic(6, seed=1)
    result = evaluate_calibration(model, tokenizer, dataset, args, batch_size=4, progress=False, agreement_samples=4)
    assert all(r["agreement"] in (0.0, 0.25, 0.5, 0.75, 1.0) for r in result.rows)
    assert [r["group"] for r in result.rows] == dataset["level"]
    assert 0 < result.agreement_cost["generated_tokens"] <= 6 * 4 * 5 and result.agreement_report.n == 6
    again = evaluate_calibration(model, tokenizer, dataset, args, batch_size=4, progress=False, agreement_samples=4)
    assert [r["agreement"] for r in again.rows] == [r["agreement"] for r in result.rows]
