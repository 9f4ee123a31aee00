"""Greedy answer + confidence evaluation of an RLCR model: accuracy, ECE, Brier, AUROC, reliability diagram.

Metrics are ours (the standard bins, over the confidences that parse; the parse-failure rate apart) and, on request,
also in the RLCR paper's convention, to compare with its numbers ([`~trl_ext.evaluation.calibration`] explains both).

The confidence turn is built exactly as in training ([`~trl_ext.core.turns.FollowUpTurn`] on token ids), with the
same parsers, so evaluation measures the behaviour that training shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ..core.turns import follow_up_turn
from ..rewards import extract_answer, extract_confidence
from ..rewards.functions import is_missing
from ..rewards.verify import verify_answer
from .agreement import sampling_agreement
from .calibration import CalibrationReport, bootstrap_mean_interval, calibration_report
from .confidence_samples import mean_confidence, sampled_confidences
from .greedy import greedy_completions
from .records import DEFAULT_GROUP_COLUMN, prompt_text


# The report's key for the stated confidence's mean of k samples (`mean_report`), as the benchmarks read it.
MEAN_OF_K = "stated_confidence_mean_of_k"


@dataclass
class CalibrationEvaluation:
    """The report over answers with a parsable confidence, plus what happened on every row."""

    report: CalibrationReport
    accuracy: float
    """Accuracy over all rows (the report's accuracy only covers rows with a parsable confidence)."""
    confidence_parse_fail_rate: float
    rows: list[dict] = field(default_factory=list)
    num_missing_gold: int = 0
    """Rows left out because they have no gold answer to judge against (`None`, NaN, blank)."""
    paper_report: CalibrationReport | None = None
    """The same rows in the RLCR paper's convention (every row, unparsable confidences as 0; see
    [`~trl_ext.evaluation.calibration`]), when asked for."""
    accuracy_interval: list[float] | None = None
    """Bootstrap 95% interval of `accuracy` (every judged row); the report's `intervals` cover the parsed ones."""
    agreement_report: CalibrationReport | None = None
    """The untrained reference point: the same rows scored with the model's sampling agreement as the confidence
    (the share of answers sampled at temperature 1 that agree with the greedy one), when it was computed."""
    agreement_cost: dict | None = None
    """What the agreement cost: `samples_per_question` and `generated_tokens` (all samples)."""
    mean_report: CalibrationReport | None = None
    """A second confidence column, never the greedy one: the same rows scored with the mean of k stated confidences
    sampled at temperature 1 for the greedy answer (`confidence_mean`), when they were sampled. Rows where none of
    the k parsed are left out, as unparsable greedy confidences are, and counted in `mean_parse_fail_rate`."""
    mean_parse_fail_rate: float | None = None
    """The share of rows whose k sampled confidences all failed to parse."""
    mean_cost: dict | None = None
    """What the sampled confidences cost: `samples_per_question`, `generated_tokens` (all samples), and
    `sample_parse_fail_rate` (the share of single samples that did not parse)."""

    def to_dict(self) -> dict:
        return {
            **self.report.to_dict(),
            "accuracy_all": self.accuracy,
            "accuracy_all_interval": self.accuracy_interval,
            "confidence_parse_fail_rate": self.confidence_parse_fail_rate,
            "num_rows": len(self.rows),
            "num_missing_gold": self.num_missing_gold,
            **({"rlcr_paper": self.paper_report.to_dict()} if self.paper_report is not None else {}),
            **(
                {"sampling_agreement": {**self.agreement_report.to_dict(), **(self.agreement_cost or {})}}
                if self.agreement_report is not None
                else {}
            ),
            **(
                {
                    MEAN_OF_K: {
                        **self.mean_report.to_dict(),
                        "confidence_parse_fail_rate": self.mean_parse_fail_rate,
                        **(self.mean_cost or {}),
                    }
                }
                if self.mean_report is not None
                else {}
            ),
        }


def evaluate_calibration(
    model,
    tokenizer,
    dataset,
    args,
    batch_size: int = 16,
    accuracy_func: Callable[[str, str], bool] = verify_answer,
    progress: bool = True,
    rlcr_paper_convention: bool = False,
    group_column: str | None = DEFAULT_GROUP_COLUMN,
    agreement_samples: int = 0,
    confidence_samples: int = 0,
) -> CalibrationEvaluation:
    """Answer each prompt greedily, ask for a confidence in a second turn, and score calibration.

    Args:
        model, tokenizer: The model under evaluation and its tokenizer (with a chat template).
        dataset: Rows with a conversational `prompt` and the gold answer in `args.solution_column`.
        args: An [`RLCRMultiTurnConfig`] (tags, confidence prompt, generation lengths, chat template kwargs).
        batch_size: Prompts per generation batch; also about the rows per sampling call of `agreement_samples` and
            `confidence_samples` (`batch_size // k` prompts, `k` rows each).
        accuracy_func: `f(gold, prediction) -> bool`, as in training.
        rlcr_paper_convention: Also score the rows in the RLCR paper's convention (`paper_report`), to compare with
            its numbers.
        group_column: The dataset column whose value is each row's `group` (metrics within groups), if it has one.
        agreement_samples: With k > 0, also sample k answers per prompt at temperature 1 and score the share that
            agree with the greedy answer as a confidence (`agreement_report`, its cost in `agreement_cost`).
        confidence_samples: With k > 0, also sample k confidence-turn replies per greedy answer at temperature 1 (on
            the greedy confidence turn's prompt) and score the mean of their parsed confidences (`mean_report`, its
            cost in `mean_cost`; per row `sampled_confidences` and `confidence_mean`).

    Rows without a gold answer are not evaluated (they would count as wrong); `num_missing_gold` counts them.
    """
    judged = [i for i, gold in enumerate(dataset[args.solution_column]) if not is_missing(gold)]
    num_missing_gold = len(dataset) - len(judged)
    if num_missing_gold:
        dataset = dataset.select(judged)
    was_training = model.training
    model.eval()
    turn = follow_up_turn(
        tokenizer, args.confidence_prompt, [tokenizer.eos_token_id], **(args.chat_template_kwargs or {})
    )
    rows, sampled_tokens, confidence_tokens = [], 0, 0
    for start in tqdm(range(0, len(dataset), batch_size), desc="calibration eval", disable=not progress):
        batch = dataset[start : start + batch_size]
        prompts = turn.first_turn_ids(tokenizer, batch["prompt"], **(args.chat_template_kwargs or {}))
        answers = greedy_completions(model, tokenizer, prompts, args.max_completion_length)
        turn2 = [turn.prompt_ids(p, a, [tokenizer.eos_token_id]) for p, a in zip(prompts, answers)]
        confidences = greedy_completions(model, tokenizer, turn2, args.max_confidence_length)
        agreements = [None] * len(prompts)
        if agreement_samples:
            texts = [tokenizer.decode(a, skip_special_tokens=True) for a in answers]
            agreements, tokens = sampling_agreement(
                model,
                tokenizer,
                prompts,
                texts,
                agreement_samples,
                args.max_completion_length,
                args.answer_tag,
                args.lenient_parsing,
                rows_per_call=batch_size,
                seed=args.seed + start,
            )
            sampled_tokens += tokens
        samples = [None] * len(prompts)
        if confidence_samples:
            samples, tokens = sampled_confidences(
                model,
                tokenizer,
                turn2,
                confidence_samples,
                args.max_confidence_length,
                args.confidence_tag,
                args.lenient_parsing,
                rows_per_call=batch_size,
                seed=args.seed + start,
            )
            confidence_tokens += tokens
        groups = batch[group_column] if group_column in batch else [None] * len(prompts)
        for prompt, group, gold, answer_ids, confidence_ids, agreement, sampled in zip(
            batch["prompt"], groups, batch[args.solution_column], answers, confidences, agreements, samples
        ):
            answer_text = tokenizer.decode(answer_ids, skip_special_tokens=True)
            confidence_text = tokenizer.decode(confidence_ids, skip_special_tokens=True)
            prediction = extract_answer(answer_text, args.answer_tag, args.lenient_parsing)
            correct = bool(prediction) and accuracy_func(str(gold), prediction)
            rows.append(
                {
                    "prompt": prompt_text(prompt),
                    "group": group,
                    "gold": str(gold),
                    "answer": answer_text,
                    "confidence_text": confidence_text,
                    "confidence": extract_confidence(confidence_text, args.confidence_tag, args.lenient_parsing),
                    "correct": int(correct),
                    **({"agreement": agreement} if agreement_samples else {}),
                    **(
                        {"sampled_confidences": sampled, "confidence_mean": mean_confidence(sampled)}
                        if confidence_samples
                        else {}
                    ),
                }
            )
    model.train(was_training)
    cost = {"samples_per_question": agreement_samples, "generated_tokens": sampled_tokens}
    confidence_cost = {"samples_per_question": confidence_samples, "generated_tokens": confidence_tokens}
    result = calibration_evaluation(
        rows,
        rlcr_paper_convention,
        agreement_cost=cost if agreement_samples else None,
        confidence_samples_cost=confidence_cost if confidence_samples else None,
    )
    result.num_missing_gold += num_missing_gold
    return result


def calibration_evaluation(
    rows: list[dict],
    rlcr_paper_convention: bool = False,
    intervals: bool = True,
    seed: int = 0,
    agreement_cost: dict | None = None,
    confidence_samples_cost: dict | None = None,
) -> CalibrationEvaluation:
    """Score per-sample `rows`, each with `correct` (1 or 0; `None`: no gold answer, so left out and counted in
    `num_missing_gold`) and the stated `confidence` (`None`: unparsable), optionally its `group` (e.g. the level:
    the metrics within groups), plus whatever the caller keeps with them (texts). The trainers' held-out evaluation
    (`trainer.evaluate()`) gives such rows (`heldout_records`). With `intervals`, the report carries bootstrap 95%
    intervals (seeded by `seed`). Rows with an `agreement` (the sampling agreement, `sampling_agreement`) are also
    scored with it as the confidence (`agreement_report`; `agreement_cost`: what it cost). Rows with a
    `confidence_mean` (the mean of their `sampled_confidences`, `None`: none parsed; see
    [`~trl_ext.evaluation.confidence_samples`]) are also scored with it (`mean_report`; `confidence_samples_cost`:
    what the samples cost)."""
    judged = [r for r in rows if r["correct"] is not None]
    parsed = [r for r in judged if r["confidence"] is not None]
    report = _column_report(parsed, "confidence", intervals, seed)
    n = max(len(judged), 1)
    agreed = [r for r in judged if r.get("agreement") is not None]
    agreement_report = _column_report(agreed, "agreement", intervals, seed) if agreed else None
    mean_report = mean_parse_fail_rate = mean_cost = None
    sampled = [r for r in judged if "confidence_mean" in r]
    if sampled:
        scored = [r for r in sampled if r["confidence_mean"] is not None]
        mean_report = _column_report(scored, "confidence_mean", intervals, seed)
        mean_parse_fail_rate = 1 - len(scored) / len(sampled)
        values = [value for r in sampled for value in r.get("sampled_confidences") or []]
        mean_cost = {
            **(confidence_samples_cost or {}),
            "sample_parse_fail_rate": sum(value is None for value in values) / len(values) if values else None,
        }
    paper_report = None
    if rlcr_paper_convention:
        confidences, correct = [r["confidence"] for r in judged], [int(r["correct"]) for r in judged]
        paper_report = calibration_report(confidences, correct, convention="rlcr_paper")
    return CalibrationEvaluation(
        report=report,
        accuracy=sum(r["correct"] for r in judged) / n,
        confidence_parse_fail_rate=1 - len(parsed) / n,
        rows=judged,
        num_missing_gold=len(rows) - len(judged),
        paper_report=paper_report,
        accuracy_interval=bootstrap_mean_interval([r["correct"] for r in judged], seed=seed) if intervals else None,
        agreement_report=agreement_report,
        agreement_cost=agreement_cost if agreement_report is not None else None,
        mean_report=mean_report,
        mean_parse_fail_rate=mean_parse_fail_rate,
        mean_cost=mean_cost,
    )


def _column_report(rows: list[dict], key: str, intervals: bool, seed: int) -> CalibrationReport:
    """The report of `rows` with `row[key]` as the confidence (within groups when any row has one)."""
    grouped = any(r.get("group") is not None for r in rows)
    return calibration_report(
        [r[key] for r in rows],
        [int(r["correct"]) for r in rows],
        groups=[r.get("group") for r in rows] if grouped else None,
        intervals=intervals,
        seed=seed,
    )
