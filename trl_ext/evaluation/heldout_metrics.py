"""Per-question math of the held-out evaluation the trainers run during training (`trainer.evaluate()`).

Pure functions of per-sample outcomes, free of trainers and models, each returning a flat `{name: value}` dict that
the trainer logs under `eval_` (`eval/` in W&B and TensorBoard). An outcome of `None` is a sample that could not be
judged (its question has no gold answer, or the scorer returned `None`): it is counted (`num_unscored`) and left out
of the means, never scored as wrong and never dropped silently. A mean over nothing is NaN (undefined, not 0).

- `sample_accuracy`: accuracy over samples, mean@k (per question, then over questions) and pass@k;
- `calibration_metrics`: RLCR's accuracy, ECE, Brier, AUROC, mean confidence and unparsable-confidence rate;
- `accuracy_by_field`: the accuracy per value of question fields (Absolute Zero's task type and level).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .calibration import calibration_report


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def sample_accuracy(outcomes: Sequence[Sequence[float | None]]) -> dict[str, float]:
    """Accuracy metrics of `outcomes[q][i]`, the outcome (1 right, 0 wrong, a fraction for partial credit, `None`
    unscored) of sample `i` of question `q`.

    - `accuracy`: mean over every scored sample;
    - `mean@k`: mean over questions with a scored sample of their scored samples' mean (k = samples per question);
    - `pass@k`: share of those questions with at least one sample scoring 1;
    - `num_questions`, `num_samples`, `num_unscored` (samples) and `num_unscored_questions` (no sample scored).

    With one sample per question `accuracy`, `mean@1` and `pass@1` coincide (for 0/1 outcomes)."""
    scored = [[float(x) for x in question if x is not None] for question in outcomes]
    judged = [question for question in scored if question]
    k = max((len(question) for question in outcomes), default=0)
    return {
        "accuracy": _mean([x for question in scored for x in question]),
        f"mean@{k}": _mean([_mean(question) for question in judged]),
        f"pass@{k}": _mean([float(any(x >= 1.0 for x in question)) for question in judged]),
        "num_questions": float(len(outcomes)),
        "num_samples": float(sum(len(question) for question in outcomes)),
        "num_unscored": float(sum(len(question) for question in outcomes) - sum(len(q) for q in scored)),
        "num_unscored_questions": float(len(outcomes) - len(judged)),
    }


def calibration_metrics(
    correct: Sequence[float | None], confidence: Sequence[float | None], groups: Sequence[Any] | None = None
) -> dict[str, float]:
    """RLCR's held-out metrics over samples: `correct[i]` (0/1, `None` without gold) and the stated `confidence[i]`
    (in [0, 1], `None` when unparsable), and optionally each sample's group (e.g. its question's level; `None`
    everywhere: no groups).

    - `answer/accuracy`: over samples with gold;
    - `confidence/parse_fail_rate`: over every sample; `confidence/mean`: over parsable confidences;
    - `calibration/ece`, `calibration/brier`, `calibration/auroc`: `calibration_report` (the standard convention)
      over samples with both a gold answer and a parsable confidence; NaN without any (AUROC also when every such
      answer is right, or every one wrong);
    - `calibration/brier_skill`: 1 - Brier / the best constant's Brier; with groups, `calibration/auroc_within_groups`
      and `calibration/brier_skill_groups` (`trl_ext.evaluation.calibration`): what a confidence knows beyond the
      group;
    - `num_samples`, `num_missing_gold`, `num_calibrated` (the samples the calibration metrics cover)."""
    if len(correct) != len(confidence):
        raise ValueError(f"{len(correct)} outcomes for {len(confidence)} confidences.")
    if groups is not None and len(groups) != len(correct):
        raise ValueError(f"{len(groups)} groups for {len(correct)} outcomes.")
    grouped = groups is not None and any(g is not None for g in groups)
    groups = groups if grouped else [None] * len(correct)
    parsed = [c for c in confidence if c is not None]
    pairs = [(c, y, g) for c, y, g in zip(confidence, correct, groups) if c is not None and y is not None]
    metrics = {
        "answer/accuracy": _mean([float(y) for y in correct if y is not None]),
        "confidence/parse_fail_rate": 1.0 - len(parsed) / len(confidence) if confidence else math.nan,
        "confidence/mean": _mean(parsed),
        "calibration/ece": math.nan,
        "calibration/brier": math.nan,
        "calibration/auroc": math.nan,
        "calibration/brier_skill": math.nan,
        **(
            {"calibration/auroc_within_groups": math.nan, "calibration/brier_skill_groups": math.nan}
            if grouped
            else {}
        ),
        "num_samples": float(len(correct)),
        "num_missing_gold": float(sum(y is None for y in correct)),
        "num_calibrated": float(len(pairs)),
    }
    if pairs:
        report = calibration_report(
            [c for c, _, _ in pairs], [int(y) for _, y, _ in pairs], groups=[g for *_, g in pairs] if grouped else None
        )
        metrics["calibration/ece"] = report.ece
        metrics["calibration/brier"] = report.brier
        metrics["calibration/auroc"] = math.nan if report.auroc is None else report.auroc
        metrics["calibration/brier_skill"] = report.brier_skill
        if grouped:
            metrics["calibration/auroc_within_groups"] = report.auroc_within_groups
            metrics["calibration/brier_skill_groups"] = report.brier_skill_groups
    return metrics


def accuracy_by_field(
    scores: Sequence[float | None], questions: Sequence[Mapping[str, Any]], fields: Sequence[str]
) -> dict[str, float]:
    """Mean score per value of each of `fields` that the questions carry: `accuracy/<field>_<value>` (values in
    sorted order), and `num_samples/<field>_<value>`. `scores[i]` is a sample of `questions[i]` (repeat a question
    for each of its samples). Unscored (`None`) samples are left out of the means; a question without the field is
    not in its breakdown."""
    if len(scores) != len(questions):
        raise ValueError(f"{len(scores)} scores for {len(questions)} questions.")
    metrics: dict[str, float] = {}
    for name in fields:
        members: dict[Any, list[float | None]] = {}
        for score, question in zip(scores, questions):
            if question.get(name) is not None:
                members.setdefault(question[name], []).append(score)
        for value in sorted(members, key=lambda v: (type(v).__name__, v)):
            metrics[f"accuracy/{name}_{value}"] = _mean([float(s) for s in members[value] if s is not None])
            metrics[f"num_samples/{name}_{value}"] = float(len(members[value]))
    return metrics
