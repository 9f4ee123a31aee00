"""The Absolute Zero recipe's held-out evaluation: the family's fixed solver questions, answered by the trainer's
held-out evaluation (greedy unless `--eval_temperature`), before and after self-play."""

from __future__ import annotations

from pathlib import Path

from ..evaluation.records import write_jsonl
from ..evaluation.solver import require_scores, solver_evaluation
from .outputs import write_json


def heldout_set(task, script_args, seed):
    """The family's held-out solver questions (`--heldout_size` of them), or `None` when the run evaluates none."""
    if task.heldout_questions is None:
        if script_args.heldout_size:
            raise ValueError(
                f"--heldout_size: the {task.name} family has no held-out evaluation (its solver acts "
                "through TRL's tool loop, which a greedy evaluation does not run)."
            )
        return None
    if script_args.heldout_size == 0:
        return None
    return task.heldout_questions(script_args.heldout_size, seed)


def evaluate_heldout(trainer, task, questions, name, reuse_last=False, rows_file=None):
    """The solver's held-out accuracy through the trainer's held-out evaluation (`trainer.heldout_evaluate()`, a
    collective: every process calls it); the main process writes every question, reply and score to
    `heldout_<name>.json`. `reuse_last`: the model was evaluated last at this step (the final `--eval_steps`
    evaluation): its records are reported instead of generating them again. `rows_file`: another file name than
    `heldout_<name>.json` (`.jsonl`: the rows alone, one a line)."""
    if not reuse_last:
        trainer.heldout_evaluate([dict(question) for question in questions])
    k = trainer.args.eval_num_samples
    records = trainer.heldout_records
    samples = [question for question in questions for _ in range(k)]
    scores = [r["score"] for r in records]
    require_scores(task, samples, scores)
    result = solver_evaluation(task, samples, scores, [r["reply"] for r in records])
    if trainer.accelerator.is_main_process:
        path = Path(trainer.args.output_dir) / (rows_file or f"heldout_{name}.json")
        if path.suffix == ".jsonl":
            write_jsonl(path, result.rows)
        else:
            write_json(path, {**result.to_dict(), "rows": result.rows})
    return result


def heldout_lines(heldout):
    """The held-out accuracies before -> after, overall and per group, as printed at the end of a run."""
    before, after = heldout["before"], heldout["after"]
    lines = [
        f"held-out solver accuracy ({len(before.rows)} questions, greedy, {before.reward}): "
        f"before {before.accuracy:.3f} -> after {after.accuracy:.3f}"
    ]
    lines += [
        f"    {before.breakdown} {group} (n={before.counts[group]}): {before.by_group[group]:.3f} -> "
        f"{after.by_group[group]:.3f}"
        for group in before.by_group
    ]
    return lines
