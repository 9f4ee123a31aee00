"""A second format warm-up stage that teaches the stated confidence the model's own probability of its answer.

The format warm-up ([`~trl_ext.models.warmup`]) teaches the confidence turn with confidences drawn at random, so the
warmed-up model states numbers that say nothing about its answer. Yet the probability the model gives its own greedy
answer separates its right answers from its wrong ones, within a difficulty level too (the embedded default's warm-up
model: AUROC 0.73 within levels on the report split, benchmarks/rlcr_probe.py), and it is a function of the context the
confidence turn sees, so the model can learn to state it. The agreement warm-up's shares
([`~trl_ext.models.agreement_warmup`]) carry the same kind of information but are noisy (eight samples, mostly all
different), and the model learned one value per level from them.

This stage answers each given row greedily with the first stage's checkpoint, takes the probability of the answer's
tokens (their geometric mean, [`~trl_ext.evaluation.greedy.completion_probabilities`]), maps it to a chance of being
right with a logistic fit of the rows' correctness on its log-odds (the rows' gold answers decide correctness), and
builds a confidence-turn example per row stating that chance rounded to a tenth. The checkpoint is then fine-tuned on
these examples (as many per stated value) plus the first stage's answer turns (gold, repeated to about as many), with
the same settings.

The examples are cached like the checkpoints ([`~trl_ext.models.cache.build_once`]): keyed by the first stage's
checkpoint, the rows and the parsing, computed once in a child process outside the job's distributed environment.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .agreement_warmup import share_distribution
from .warmup import cached_child_build, load_for_inference


# Bump when the answering, the calibration or the example builder changes, so cached examples are rebuilt.
_BUILD_FORMAT = 1
EXAMPLES_FILE = "examples.json"
ROWS_PER_CALL = 100
# The log-odds of a probability are taken with it clipped to [EPS, 1 - EPS] (an answer of probability 1.0 is finite).
EPS = 1e-4


def calibrated_tenths(probabilities: Sequence[float], correct: Sequence[int]) -> tuple[list[float], dict]:
    """Each probability mapped to a chance of being right and rounded to a tenth, with the map's description.

    The map is a logistic regression of `correct` on the probabilities' log-odds (monotone: it keeps their order, so
    what separates right from wrong answers is kept), fitted on the same rows. With only right or only wrong answers
    there is nothing to fit: every row states the rows' accuracy."""
    p = np.clip(np.asarray(probabilities, dtype=float), EPS, 1 - EPS)
    y = np.asarray(correct, dtype=int)
    if len(y) == 0:
        return [], {"fitted": False}
    if y.min() == y.max():
        return [round(float(y.mean()), 1)] * len(y), {"fitted": False, "accuracy": float(y.mean())}
    from sklearn.linear_model import LogisticRegression

    x = np.log(p / (1 - p))[:, None]
    fit = LogisticRegression().fit(x, y)
    chance = fit.predict_proba(x)[:, 1]
    info = {"fitted": True, "slope": float(fit.coef_[0, 0]), "intercept": float(fit.intercept_[0])}
    return [round(float(c), 1) for c in chance], info


def probability_confidence_examples(
    prompts: Sequence[list[dict]],
    answers: Sequence[str],
    stated: Sequence[float],
    confidence_prompt: str,
    confidence_tag: str = "confidence",
) -> list[dict]:
    """One confidence-turn SFT example per row: the conversational prompt, the model's own answer `answers[i]` (as it
    wrote it) as the assistant message, the user's `confidence_prompt`, completed by `<confidence>stated[i]</confidence>`."""
    if not len(prompts) == len(answers) == len(stated):
        raise ValueError(f"{len(prompts)} prompts, {len(answers)} answers and {len(stated)} stated confidences.")
    return [
        {
            "prompt": [
                *prompt,
                {"role": "assistant", "content": answer},
                {"role": "user", "content": confidence_prompt},
            ],
            "completion": [{"role": "assistant", "content": f"<{confidence_tag}>{value:g}</{confidence_tag}>"}],
        }
        for prompt, answer, value in zip(prompts, answers, stated)
    ]


def probability_examples(
    stage1: str,
    rows: Sequence[dict],
    confidence_prompt: str,
    *,
    solution_column: str = "solution",
    max_new_tokens: int = 16,
    answer_tag: str = "answer",
    confidence_tag: str = "confidence",
    lenient: bool = False,
    accuracy_func: str | None = None,
    chat_template_kwargs: dict | None = None,
    use_cpu: bool = False,
    cache_dir=None,
) -> dict:
    """The stage's examples from the `stage1` checkpoint, computed once and cached: `{"examples": [...], "stats":
    {rows, accuracy, auroc, calibration, shares, answering_seconds}}`.

    `rows` need a conversational `prompt` and their gold answer in `solution_column`; correctness is decided by
    `accuracy_func` (a dotted import path, as `--accuracy_func`; `None`: `verify_answer`). Called from every rank of a
    distributed job, one computes (in a child process, on CUDA unless `use_cpu`) while the others wait on the lock."""
    spec = {
        "stage1": str(stage1),
        "prompts": [list(row["prompt"]) for row in rows],
        "solutions": [str(row[solution_column]) for row in rows],
        "confidence_prompt": confidence_prompt,
        "max_new_tokens": int(max_new_tokens),
        "answer_tag": answer_tag,
        "confidence_tag": confidence_tag,
        "lenient": bool(lenient),
        "accuracy_func": accuracy_func,
        "chat_template_kwargs": chat_template_kwargs or {},
    }
    path = cached_child_build(
        "trl_ext.models.probability_warmup",
        stage1,
        spec,
        {"format": _BUILD_FORMAT},
        {"use_cpu": bool(use_cpu)},
        "warmup-probability",
        f"trl-ext: answering {len(rows)} rows with {stage1} for the answer-probability warm-up",
        cache_dir,
    )
    return json.loads((Path(path) / EXAMPLES_FILE).read_text())


def _build(spec: dict, out: Path) -> None:

    from ..core.turns import follow_up_turn
    from ..evaluation.calibration import auroc
    from ..evaluation.greedy import completion_probabilities, greedy_completions
    from ..recipe.cli import load_function
    from ..rewards import extract_answer
    from ..rewards.verify import verify_answer

    started = time.monotonic()
    accuracy = load_function(spec["accuracy_func"], "--accuracy_func") if spec["accuracy_func"] else verify_answer
    kwargs = spec["chat_template_kwargs"]
    model, tokenizer = load_for_inference(spec["stage1"], spec["use_cpu"])
    # The answer turn's prompt as the trainers and the evaluation render it (TRL's training template when needed).
    turn = follow_up_turn(tokenizer, spec["confidence_prompt"], [tokenizer.eos_token_id], **kwargs)
    texts, probabilities, correct = [], [], []
    for start in range(0, len(spec["prompts"]), ROWS_PER_CALL):
        ids = turn.first_turn_ids(tokenizer, spec["prompts"][start : start + ROWS_PER_CALL], **kwargs)
        answers = greedy_completions(model, tokenizer, ids, spec["max_new_tokens"])
        probabilities += completion_probabilities(model, tokenizer, ids, answers)
        for answer, gold in zip(answers, spec["solutions"][start : start + ROWS_PER_CALL]):
            text = tokenizer.decode(answer, skip_special_tokens=True).strip()
            prediction = extract_answer(text, spec["answer_tag"], spec["lenient"])
            texts.append(text)
            correct.append(int(bool(prediction) and bool(accuracy(gold, prediction))))
    stated, calibration = calibrated_tenths(probabilities, correct)
    examples = probability_confidence_examples(
        spec["prompts"], texts, stated, spec["confidence_prompt"], spec["confidence_tag"]
    )
    stats = {
        "rows": len(texts),
        "accuracy": float(np.mean(correct)) if correct else None,
        "auroc": auroc(probabilities, correct) if 0 < sum(correct) < len(correct) else None,
        "calibration": calibration,
        "shares": share_distribution(examples, spec["confidence_tag"]),
        "answering_seconds": round(time.monotonic() - started, 1),
    }
    (out / EXAMPLES_FILE).write_text(json.dumps({"examples": examples, "stats": stats}))


if __name__ == "__main__":  # the child process of `cached_child_build`
    import sys

    _build(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
