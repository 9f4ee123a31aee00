"""The Absolute Zero recipe's held-out evaluation: the family's fixed solver questions, answered greedily."""

from __future__ import annotations

from pathlib import Path

from ..evaluation.solver import evaluate_solver
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


def evaluate_heldout(model, tokenizer, task, questions, training_args, name):
    """The solver's greedy held-out accuracy; every question, reply and score to `heldout_<name>.json`."""
    result = evaluate_solver(
        task,
        model,
        tokenizer,
        training_args.max_completion_length,
        questions,
        chat_template_kwargs=training_args.chat_template_kwargs,
        progress=not training_args.disable_tqdm,
    )
    write_json(Path(training_args.output_dir) / f"heldout_{name}.json", {**result.to_dict(), "rows": result.rows})
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
