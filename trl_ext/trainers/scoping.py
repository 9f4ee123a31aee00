"""Scoped attribute swaps around one call of a `GRPOTrainer` method, shared by trainers that run TRL's batch code
for a second kind of row (RLCR's confidence turn, Absolute Zero's proposer and solver rounds)."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def scoped_call(trainer, mode: str | None = None, prefix: str | None = None, max_new_tokens: int | None = None,
                **attributes):
    """Set `attributes` on `trainer` (and, if given, every generation backend's maximum new tokens) for the duration
    of the block, then restore them. Metrics the block appends to `trainer._metrics[mode]` move under `prefix/`.

    An attribute the instance did not hold itself (a method, or one shadowed only for the block) is deleted again
    rather than set to the class's value, so a method stays a method and an outer shadow (a test harness) is kept.
    """
    own = {name: name in vars(trainer) for name in attributes}
    saved = {name: vars(trainer)[name] for name in attributes if own[name]}
    settings = [] if max_new_tokens is None else generation_length_settings(trainer)
    lengths = [(obj, key, _get(obj, key)) for obj, key in settings]
    before = {key: len(values) for key, values in trainer._metrics[mode].items()} if prefix is not None else {}
    for name, value in attributes.items():
        setattr(trainer, name, value)
    for obj, key, _ in lengths:
        _set(obj, key, max_new_tokens)
    try:
        yield
    finally:
        for obj, key, value in lengths:
            _set(obj, key, value)
        for name in attributes:
            if own[name]:
                setattr(trainer, name, saved[name])
            else:
                delattr(trainer, name)
        if prefix is not None:
            metrics = trainer._metrics[mode]
            for key in list(metrics):
                values, start = metrics[key], before.get(key, 0)
                if key == "num_tokens" or len(values) <= start:
                    continue
                metrics[f"{prefix}/{key}"].extend(values[start:])
                del values[start:]
                if not values:
                    del metrics[key]


def generation_length_settings(trainer) -> list[tuple[object, str]]:
    """Where each generation backend reads its maximum new tokens: `(container, key)` pairs."""
    settings = []
    if getattr(trainer, "generation_config", None) is not None:  # transformers generate / continuous batching
        settings.append((trainer.generation_config, "max_new_tokens"))
    kwargs = getattr(trainer, "generation_kwargs", None)
    if isinstance(kwargs, dict) and "max_new_tokens" in kwargs:
        settings.append((kwargs, "max_new_tokens"))
    if trainer.use_vllm:
        settings.append((trainer.vllm_generation, "max_completion_length"))
    return settings


def _get(obj, key):
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


def _set(obj, key, value):
    if isinstance(obj, dict):
        obj[key] = value
    else:
        setattr(obj, key, value)
