"""The greedy calibration evaluation reproduces its own numbers: it is the before/after measurement of a run."""

import torch

from trl_ext.data import graded_arithmetic
from trl_ext.evaluation.rlcr import evaluate_calibration
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
