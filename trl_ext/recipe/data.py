"""Loading a recipe's data: a Hub dataset or a local file (JSON, JSONL, Parquet, CSV), columns mapped to TRL's
conversational `prompt` and `solution`, split into training and held-out rows."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from datasets import Dataset, load_dataset

from ..data import graded_arithmetic
from ..data.graded_arithmetic import ANSWER_FORMAT, SPLITS, normalise_question
from ..rewards.functions import is_missing
from .cli import RecipeScriptArguments


logger = logging.getLogger(__name__)


LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def load_recipe_dataset(
    script_args: RecipeScriptArguments, system_prompt: str | None, require_answer: bool = True
) -> tuple[Dataset, Dataset | None]:
    """Load `--dataset_name` (Hub) or `--dataset_path` (local file) as `(train, eval)` with `prompt` and `solution`.

    With `require_answer=False` (seed prompts without gold answers, e.g. Absolute Zero), `solution` is filled only
    when the answer column exists.

    The eval split is `--dataset_test_split` when the dataset has it, else the last `num_eval_samples` training rows
    are held out, after repeated questions are dropped and with no held-out question among the training rows
    (`deduplicated_heldout_split`). Returns `(None, None)` if neither source is given (the recipe then uses its built-in data).

    Rows without a question are left out (and counted in a warning); rows without a gold answer keep `solution=None`
    (counted in a warning). An empty training set, a malformed data file (named, with its line where known) and
    `--num_train_samples` below 1 raise `ValueError`.
    """
    if script_args.dataset_name and script_args.dataset_path:
        raise ValueError("Give either --dataset_name (Hub) or --dataset_path (local file), not both.")
    if script_args.num_train_samples is not None and script_args.num_train_samples < 1:
        raise ValueError(
            f"--num_train_samples must be at least 1 (got {script_args.num_train_samples}); leave it unset to use "
            "every row."
        )
    if script_args.dataset_path:
        suffix = Path(script_args.dataset_path).suffix.lower()
        if suffix not in LOCAL_FORMATS:
            raise ValueError(
                f"--dataset_path {script_args.dataset_path!r}: unsupported extension {suffix!r}; use one of "
                f"{sorted(LOCAL_FORMATS)}."
            )
        splits = {"train": _load_local(script_args.dataset_path, suffix)}
    elif script_args.dataset_name:
        splits = load_dataset(script_args.dataset_name, script_args.dataset_config)
    else:
        return None, None

    train = splits[script_args.dataset_train_split]
    test_split = script_args.dataset_test_split
    test = splits[test_split] if test_split in splits and test_split != script_args.dataset_train_split else None
    train, evaluation = deduplicated_heldout_split(train, test, script_args)
    if script_args.num_train_samples is not None:
        train = train.select(range(min(script_args.num_train_samples, len(train))))
    prepare = _column_mapper(script_args, system_prompt, train.column_names, require_answer)
    train = _prepared(train, prepare, script_args, "training")
    evaluation = _prepared(evaluation, prepare, script_args, "evaluation") if evaluation is not None else None
    if evaluation is not None and len(evaluation) == 0:
        evaluation = None
    if len(train) == 0:
        source = script_args.dataset_path or script_args.dataset_name
        raise ValueError(
            f"The dataset {source!r} has no training rows (split {script_args.dataset_train_split!r}, after holding "
            "out evaluation rows and dropping rows without a question); check the file, the split and "
            "--question_column."
        )
    return train, evaluation


def prompt_key(value) -> str:
    """A row's question (text, or a conversation's messages) as `normalise_question` writes it: two rows asking the
    same thing (whitespace, case, operand order of `+` and `*` apart) share it."""
    if isinstance(value, list):
        value = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in value if isinstance(m, dict))
    return normalise_question(str(value))


def deduplicated_heldout_split(
    train: Dataset, test: Dataset | None, script_args: RecipeScriptArguments
) -> tuple[Dataset, Dataset | None]:
    """`(train, held-out)` with no question in both, and each question once in each: rows are deduplicated by
    `prompt_key` (the first of equal questions kept), the held-out rows are the first `num_eval_samples` of `test`
    when given, else the last `num_eval_samples` of `train` (at most a fifth; none when that is 0), and training rows
    asking a held-out question are dropped. What was done is logged (rows dropped, rows held out, from where)."""
    column = "prompt" if "prompt" in train.column_names else script_args.question_column
    if column not in train.column_names:  # the column mapping names the missing column
        return train, test

    def unique(dataset: Dataset, excluded: set[str] = frozenset()) -> tuple[Dataset, int]:
        """The dataset without repeated questions and questions in `excluded`, and how many rows that drops."""
        keys, keep = set(), []
        for i, value in enumerate(dataset[column]):
            key = None if is_missing(value) else prompt_key(value)  # rows without a question: counted later
            if key is None or (key not in keys and key not in excluded):
                keys.add(key)
                keep.append(i)
        return (dataset if len(keep) == len(dataset) else dataset.select(keep)), len(dataset) - len(keep)

    train, repeated = unique(train)
    if test is not None and column in test.column_names:
        test, _ = unique(test)
        evaluation = test.select(range(min(script_args.num_eval_samples, len(test))))
        where = f"the first {len(evaluation)} distinct rows of split {script_args.dataset_test_split!r}"
    else:
        held_out = min(script_args.num_eval_samples, len(train) // 5)
        evaluation = train.select(range(len(train) - held_out, len(train))) if held_out else None
        announce_held_out(script_args, held_out, len(train))
        train = train.select(range(len(train) - held_out))
        where = f"the last {held_out} distinct rows of split {script_args.dataset_train_split!r}"
    held = set() if evaluation is None else {prompt_key(v) for v in evaluation[column] if not is_missing(v)}
    train, asked = unique(train, held)
    logger.info(
        "Held-out rows: %s (no shuffling, no seed). Training rows dropped: %d repeating an earlier training question "
        "and %d asking a held-out one (same text after normalising whitespace, case and the order of + and * "
        "operands); %d training rows left.",
        where,
        repeated,
        asked,
        len(train),
    )
    return train, evaluation


def announce_held_out(script_args: RecipeScriptArguments, held_out: int, total: int) -> None:
    """Say which of the user's rows the evaluation takes from their training data, and how to choose otherwise."""
    if not script_args.num_eval_samples:
        return
    source = script_args.dataset_path or f"{script_args.dataset_name} (split {script_args.dataset_train_split!r})"
    capped = ", capped at a fifth of the rows" if held_out < script_args.num_eval_samples else ""
    if getattr(script_args, "eval_only", False):
        logger.warning(
            "Evaluating the last %d of the %d rows of %s (the rows a training run with --num_eval_samples %d%s held "
            "out; file order, no shuffle).",
            held_out,
            total,
            source,
            script_args.num_eval_samples,
            capped,
        )
        return
    logger.warning(
        "Held out the last %d of the %d rows of %s for evaluation (file order, no shuffle, the same in every run; "
        "--num_eval_samples %d%s): they are not trained on. Evaluate on a split of your own with "
        "--dataset_test_split, or train on every row with --num_eval_samples 0.",
        held_out,
        total,
        source,
        script_args.num_eval_samples,
        capped,
    )


def _load_local(path: str, suffix: str) -> Dataset:
    """`load_dataset` on a local file; a file it cannot read fails with a `ValueError` naming the file and the line
    where the parser knows it (a malformed JSON line is located here, as pyarrow counts rows within a block)."""
    from datasets.exceptions import DatasetGenerationError

    kind = LOCAL_FORMATS[suffix]
    try:
        return load_dataset(kind, data_files=path, split="train")
    except Exception as error:
        if not Path(path).is_file():
            raise  # datasets' FileNotFoundError names the path
        if not Path(path).read_bytes().strip():
            located = "the file is empty"
        else:
            located = _json_error(path) if kind == "json" else None
        if located is None:
            # The parser's own error, which datasets wraps: pandas names the CSV line, pyarrow the JSON column whose
            # type changes from one line to another (datasets without the `Json` feature refuse mixed types).
            cause = error.__cause__ if isinstance(error, DatasetGenerationError) and error.__cause__ else error
            located = f"cannot be read as {kind.upper()} ({type(cause).__name__}: {str(cause).strip()})"
        raise ValueError(f"--dataset_path {path}: {located}") from error


def _json_error(path: str) -> str | None:
    """Where a JSON file (one document, or one object per line) is malformed: "line N: reason", else `None`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        return f"not UTF-8 text ({error})"
    if text.lstrip().startswith("["):  # one document: its parser knows the line
        try:
            json.loads(text)
        except json.JSONDecodeError as error:
            return f"line {error.lineno}: not valid JSON ({error.msg})"
        return None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            return f"line {number}: not valid JSON ({error.msg}, column {error.colno}); one JSON object per line"
        if not isinstance(row, dict):
            return f"line {number}: expected a JSON object per line, got {type(row).__name__}"
    return None


def _prepared(dataset: Dataset, prepare, script_args: RecipeScriptArguments, name: str) -> Dataset:
    """`dataset` mapped to `prompt`/`solution`, rows without a question left out; both counts are reported."""
    question = None if "prompt" in dataset.column_names else script_args.question_column
    prompts = dataset["prompt"] if question is None else dataset[question]
    keep = [i for i, value in enumerate(prompts) if not is_missing(value)]
    if len(keep) < len(dataset):
        logger.warning(
            "%d of %d %s rows have no question (%r) and are left out.",
            len(dataset) - len(keep),
            len(dataset),
            name,
            question or "prompt",
        )
        dataset = dataset.select(keep)
    dataset = dataset.map(prepare)
    if "solution" in dataset.column_names:
        missing = sum(is_missing(value) for value in dataset["solution"])
        if missing:
            logger.warning(
                "%d of %d %s rows have no gold answer: they are not scored (reward None, never 0).",
                missing,
                len(dataset),
                name,
            )
    return dataset


def _column_mapper(
    script_args: RecipeScriptArguments, system_prompt: str | None, columns: list[str], require_answer: bool = True
):
    has_prompt = "prompt" in columns
    has_solution = "solution" in columns or (not require_answer and script_args.answer_column not in columns)
    if not has_prompt and script_args.question_column not in columns:
        raise ValueError(
            f"The dataset has neither a 'prompt' column nor the question column {script_args.question_column!r} "
            f"(columns: {columns}); set --question_column."
        )
    if not has_solution and script_args.answer_column not in columns:
        raise ValueError(
            f"The dataset has neither a 'solution' column nor the answer column {script_args.answer_column!r} "
            f"(columns: {columns}); set --answer_column."
        )

    def prepare(row):
        out = {}
        if not has_prompt:
            prompt = [{"role": "user", "content": str(row[script_args.question_column])}]
            if system_prompt:
                prompt.insert(0, {"role": "system", "content": system_prompt})
            out["prompt"] = prompt
        elif isinstance(row["prompt"], str):
            prompt = [{"role": "user", "content": row["prompt"]}]
            if system_prompt:
                prompt.insert(0, {"role": "system", "content": system_prompt})
            out["prompt"] = prompt
        if not has_solution:
            answer = row[script_args.answer_column]
            if is_missing(answer):
                answer = None  # never the text "None" or "nan", which a model could match
            else:
                answer = str(answer)
                if script_args.answer_delimiter and script_args.answer_delimiter in answer:
                    answer = answer.rsplit(script_args.answer_delimiter, 1)[1].strip() or None
            out["solution"] = answer
        return out

    return prepare


def heldout_split(evaluation, training_args):
    """The trainer's `eval_dataset`: the held-out split when `--eval_strategy` asks for evaluations during training."""
    strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)
    if strategy == "no":
        return None
    if evaluation is None:
        raise ValueError(
            f"--eval_strategy {strategy} needs held-out rows: give --num_eval_samples (and a "
            "dataset of at least 5 rows per held-out row, or a --dataset_test_split), or --eval_strategy no."
        )
    return evaluation


def datasets_for(script_args, training_args):
    """`(train, evaluation)`: the given dataset (`--dataset_name`/`--dataset_path`), else the built-in graded
    arithmetic: training (and warm-up) rows from its `train` split, held-out questions from `--eval_split` (`report`
    or `tune`), disjoint by construction; none with `--num_eval_samples 0`."""
    system_prompt = script_args.system_prompt or ANSWER_FORMAT
    train, evaluation = load_recipe_dataset(script_args, system_prompt)
    levels = getattr(script_args, "train_levels", None)
    if train is not None and levels:
        raise ValueError(
            f"--train_levels {' '.join(map(str, levels))} selects levels of the built-in data; with a dataset, filter "
            "its rows yourself (or drop --train_levels)."
        )
    if train is None:
        split = getattr(script_args, "eval_split", "report")
        if split not in SPLITS[1:]:
            raise ValueError(f"--eval_split must be 'report' or 'tune' (got {split!r}); training uses 'train'.")
        train = graded_arithmetic(
            script_args.num_train_samples or 500,
            seed=training_args.seed,
            system_prompt=system_prompt,
            split="train",
            levels=levels,
        )
        evaluation = None  # --num_eval_samples 0: no held-out evaluation
        if script_args.num_eval_samples:
            evaluation = graded_arithmetic(
                script_args.num_eval_samples, seed=training_args.seed + 1, system_prompt=system_prompt, split=split
            )
    return train, evaluation
