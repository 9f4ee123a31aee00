"""Checks the trainers run at init, so that a wrong argument or a bad dataset fails with its name and the fix rather
than at the first batch."""

from __future__ import annotations

from trl.data_utils import is_conversational


def checked_args(args, config_class: type, output_dir: str):
    """`args`, or `config_class`'s defaults writing to `output_dir`; another config class is refused (its fields, which
    the trainer reads, would be missing)."""
    if args is None:
        return config_class(output_dir)
    if not isinstance(args, config_class):
        raise TypeError(f"args must be an instance of {config_class.__name__}, got {type(args).__name__}.")
    return args


def refuse_rollout_func(trainer_kwargs: dict, trainer_name: str, why: str) -> None:
    """Refuse a `rollout_func`: each trainer builds its batch from TRL's own generation, which one would replace."""
    if trainer_kwargs.get("rollout_func") is not None:
        raise ValueError(f"{trainer_name} does not support `rollout_func`: {why}")


def user_message_prompts(dataset):
    """`dataset` with plain-text prompts (TRL's standard format) turned into conversations of one user message, for
    trainers whose turns go through the chat template; a dataset of conversations (or without a text `prompt`) is
    returned as is. Takes a `Dataset`, an `IterableDataset`, a list of rows, or a dict of them (`DatasetDict`)."""
    if dataset is None:
        return None
    if isinstance(dataset, dict):
        return type(dataset)({name: user_message_prompts(split) for name, split in dataset.items()})
    first = next(iter(dataset), None)
    if not isinstance(first, dict) or not isinstance(first.get("prompt"), str):
        return dataset
    if isinstance(dataset, list):
        return [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} for row in dataset]
    return dataset.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})


def check_datasets(trainer_kwargs: dict, check) -> None:
    """Run `check(dataset, split)` on the train and eval datasets passed to the trainer."""
    for split in ("train_dataset", "eval_dataset"):
        check(trainer_kwargs.get(split), split)


def check_not_empty(dataset, split: str) -> None:
    """Raise `ValueError` if `dataset` (or any split of a dict of datasets) has no rows. Streaming datasets, which
    have no length, are not checked."""
    if dataset is None:
        return
    for name, ds in dataset.items() if isinstance(dataset, dict) else [(None, dataset)]:
        try:
            size = len(ds)
        except TypeError:  # an IterableDataset
            continue
        if size == 0:
            where = split if name is None else f"{split}[{name!r}]"
            raise ValueError(
                f"{where} is empty: there is nothing to train or evaluate on. Check the dataset's path, split and "
                "filters (and a row cap such as --num_train_samples)."
            )


def check_conversational_prompts(dataset, split: str, why: str, required: dict[str, str] | None = None) -> None:
    """Refuse an empty dataset, one without a `prompt` column or a `required` column (`{column: what to do}`), and
    prompts that are not conversations (`why` says what needs the conversation). Datasets without column names
    (streaming) are checked for emptiness only."""
    if dataset is None:
        return
    check_not_empty(dataset, split)
    for ds in dataset.values() if isinstance(dataset, dict) else [dataset]:
        columns = getattr(ds, "column_names", None)
        if columns is None:
            continue
        for column, fix in {"prompt": "it must hold the prompts", **(required or {})}.items():
            if column not in columns:
                raise ValueError(f"{split} has no {column!r} column (columns: {columns}); {fix}.")
        if not is_conversational(next(iter(ds))):
            raise ValueError(f"{split} prompts must be conversational (a list of messages): {why}.")
