"""Dataset checks the trainers share, run at init so that a bad dataset fails with its name and the fix."""

from __future__ import annotations


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
