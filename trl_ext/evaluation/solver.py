"""Held-out solver evaluation of a task family: solver accuracy on a fixed question set, before vs after self-play.

The questions come from the family (`TaskFamily.heldout_questions`), are rendered as [`AbsoluteZeroTrainer`] renders
solver prompts (the family's `solver_prompt_fn`, then the tokenizer's chat template with the generation prompt and
`chat_template_kwargs`), answered greedily, decoded as TRL decodes completions, and scored by the family's first
reward function, which the default learnability criterion reads: the evaluation measures what self-play rewards.
Families whose solver acts through tools (the workspace family) need TRL's tool loop and have no held-out set.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from ..self_play.base import Conversation, TaskFamily
from .curves import plot_logged
from .greedy import greedy_completions


@dataclass
class SolverEvaluation:
    """Held-out solver accuracy, overall and per value of the family's `heldout_breakdown` field."""

    accuracy: float
    by_group: dict[str, float]
    counts: dict[str, int]
    breakdown: str | None
    """The question field `by_group` is keyed by (`level`, `task_type`)."""
    reward: str
    """The reward function that scored the replies."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Per question: `question` (its fields), the solver's `reply` and its `score`."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "num_questions": len(self.rows),
            "reward": self.reward,
            "breakdown": self.breakdown,
            "by_group": self.by_group,
            "counts": self.counts,
        }


def accuracy_breakdown(
    scores: Sequence[float], groups: Sequence[Any]
) -> tuple[float, dict[str, float], dict[str, int]]:
    """Mean score overall and per group (keys as text, in sorted group order), and each group's size. No scores: NaN
    overall (an accuracy of nothing is undefined, not 0)."""
    if len(scores) != len(groups):
        raise ValueError(f"{len(scores)} scores for {len(groups)} groups.")
    members: dict[Any, list[float]] = {}
    for score, group in zip(scores, groups):
        members.setdefault(group, []).append(score)
    ordered = sorted(members, key=lambda g: (type(g).__name__, g))
    by_group = {str(g): sum(members[g]) / len(members[g]) for g in ordered}
    counts = {str(g): len(members[g]) for g in ordered}
    return (sum(scores) / len(scores) if scores else math.nan), by_group, counts


def solver_conversations(family: TaskFamily, questions: Sequence[dict[str, Any]]) -> list[Conversation]:
    """The family's solver prompt for each question. Held-out questions have no seed prompt: the seed row is empty."""
    return [family.solver_prompt_fn(dict(question), {}) for question in questions]


def score_replies(
    family: TaskFamily,
    questions: Sequence[dict[str, Any]],
    conversations: Sequence[Conversation],
    replies: Sequence[dict[str, Any]],
    completion_ids: Sequence[list[int]] | None = None,
) -> list[float]:
    """Score assistant messages (`{"role": "assistant", "content": ...}`) with the family's first reward function,
    called as TRL calls it: one column per question field (`None` where a question lacks it). A held-out question
    must be scorable: a `None` score (no gold answer) raises."""
    reward = family.reward_funcs[0]
    keys = sorted({key for question in questions for key in question})
    columns = {key: [question.get(key) for question in questions] for key in keys}
    scores = reward(
        prompts=list(conversations),
        completions=[[reply] for reply in replies],
        completion_ids=None if completion_ids is None else list(completion_ids),
        **columns,
    )
    require_scores(family, questions, scores)
    return [float(score) for score in scores]


def require_scores(family: TaskFamily, questions: Sequence[dict[str, Any]], scores: Sequence[float | None]) -> None:
    """A held-out question must be scorable: raise, naming it, where the family's first reward gave `None`."""
    for question, score in zip(questions, scores, strict=True):
        if score is None:
            raise ValueError(
                f"{family.reward_funcs[0].__name__} cannot score the held-out question {question} (no gold answer?)."
            )


def reply_message(tokenizer, completion_ids: list[int], prompt_ids: list[int]) -> dict[str, Any]:
    """The completion as TRL's `_generate` turns it into a message: parsed by the tokenizer's response parser when it
    has one, else decoded without special tokens."""
    if any(getattr(tokenizer, name, None) is not None for name in ("response_template", "response_schema")):
        from trl.chat_template_utils import parse_response

        return parse_response(tokenizer, completion_ids, prefix=prompt_ids)
    return {"role": "assistant", "content": tokenizer.decode(completion_ids, skip_special_tokens=True)}


def evaluate_solver(
    family: TaskFamily,
    model,
    tokenizer,
    max_new_tokens: int,
    questions: Sequence[dict[str, Any]],
    batch_size: int = 16,
    chat_template_kwargs: dict | None = None,
    progress: bool = True,
) -> SolverEvaluation:
    """Answer `questions` (from `family.heldout_questions(n, seed)`) greedily and score them.

    Public API for a model outside a trainer (docs/absolute_zero.md, "the held-out evaluation"): it answers as
    `AbsoluteZeroTrainer`'s held-out evaluation does, with `model.generate` instead of the trainer's generation path.
    The trainers and recipes do not call it.

    Args:
        family: The task family: solver prompts, the scoring reward, the breakdown field.
        model, tokenizer: The model under evaluation (a PEFT model too) and its tokenizer.
        max_new_tokens: Tokens per reply: the solver's `max_completion_length` in training.
        questions: The held-out questions.
        batch_size: Questions per `model.generate` call.
        chat_template_kwargs: As in the trainer's config (`chat_template_kwargs`).
    """
    if not questions:
        raise ValueError("no held-out questions to evaluate.")
    conversations = solver_conversations(family, questions)
    was_training = model.training
    model.eval()
    replies, completion_ids = [], []
    try:
        for start in tqdm(
            range(0, len(conversations), batch_size), desc=f"held-out {family.name} solver", disable=not progress
        ):
            batch = conversations[start : start + batch_size]
            prompt_ids = tokenizer.apply_chat_template(
                batch, add_generation_prompt=True, tokenize=True, return_dict=True, **(chat_template_kwargs or {})
            )["input_ids"]
            prompt_ids = [[int(t) for t in ids] for ids in prompt_ids]
            completions = greedy_completions(model, tokenizer, prompt_ids, max_new_tokens)
            replies += [reply_message(tokenizer, c, p) for c, p in zip(completions, prompt_ids, strict=True)]
            completion_ids += completions
    finally:
        model.train(was_training)
    scores = score_replies(family, questions, conversations, replies, completion_ids)
    return solver_evaluation(family, questions, scores, [reply.get("content") for reply in replies])


def solver_evaluation(
    family: TaskFamily, questions: Sequence[dict[str, Any]], scores: Sequence[float], replies: Sequence[str]
) -> SolverEvaluation:
    """The report of scored replies, `scores[i]` and `replies[i]` for `questions[i]` (a question repeated for each of
    its samples): `evaluate_solver`'s greedy replies, or the records of the trainer's held-out evaluation
    (`trainer.evaluate()`), each checked by its source (`score_replies`, `require_scores`)."""
    groups = [question.get(family.heldout_breakdown) if family.heldout_breakdown else None for question in questions]
    accuracy, by_group, counts = accuracy_breakdown(scores, groups)
    rows = [
        {"question": dict(question), "reply": reply, "score": score}
        for question, reply, score in zip(questions, replies, scores, strict=True)
    ]
    return SolverEvaluation(
        accuracy, by_group, counts, family.heldout_breakdown, family.reward_funcs[0].__name__, rows
    )


def plot_heldout_accuracy(
    evaluations: dict[str, SolverEvaluation],
    log_history: list[dict],
    path: str | os.PathLike,
    title: str,
    curve: str = "unified_filter/learnable_ratio",
) -> str:
    """Left: held-out accuracy per evaluation (e.g. before and after training) as bars, overall and per group.
    Right: `curve` per logged step (the learnable ratio of self-play)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    bars, line = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    first = next(iter(evaluations.values()))
    labels = ["all", *first.by_group]
    width = 0.8 / len(evaluations)
    for i, (name, evaluation) in enumerate(evaluations.items()):
        values = [evaluation.accuracy, *(evaluation.by_group.get(g, math.nan) for g in first.by_group)]
        xs = [x + (i - (len(evaluations) - 1) / 2) * width for x in range(len(labels))]
        drawn = bars.bar(xs, values, width, label=f"{name} ({evaluation.accuracy:.2f})")
        bars.bar_label(drawn, fmt="%.2f", fontsize=7)
    sizes = [str(len(first.rows)), *(str(first.counts[g]) for g in first.by_group)]
    bars.set_xticks(range(len(labels)), [f"{label}\n(n={n})" for label, n in zip(labels, sizes)])
    bars.set_xlabel(first.breakdown or "")
    bars.set_ylim(0, 1.05)
    bars.set_ylabel(f"held-out accuracy ({first.reward})")
    bars.legend(fontsize=8)
    bars.grid(axis="y", alpha=0.3)
    plot_logged(line, log_history, curve)
    line.set_ylim(-0.05, 1.05)
    line.set_title(curve, fontsize=9)
    line.set_xlabel("step")
    line.xaxis.set_major_locator(MaxNLocator(integer=True))
    line.grid(alpha=0.3)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return str(path)
