"""Scoped attribute swaps around one call of a `GRPOTrainer` method, shared by trainers that run TRL's batch code
for a second kind of row (RLCR's confidence turn, Absolute Zero's proposer and solver rounds), and the per-turn
generation settings those calls swap in (docs/design.md#per-turn-generation-settings)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

from transformers import GenerationConfig


@dataclass(frozen=True)
class TurnGeneration:
    """What one turn's generation reads besides its length: `generation_kwargs` and the structured-outputs regex
    (vLLM), or the `GenerationConfig` and generate kwargs built from TRL's defaults and that turn's kwargs."""

    kwargs: dict
    regex: str | None = None
    config: GenerationConfig | None = None
    config_kwargs: dict | None = None
    temperature: float | None = None
    """vLLM's sampling temperature for this turn (`None`: the trainer's `temperature`); transformers reads it from
    `config`."""


def turn_generations(
    trainer, turns: dict[str, tuple[dict | None, str | None]], temperatures: dict[str, float] | None = None
) -> dict[str, TurnGeneration]:
    """Each turn's settings, from `{turn: (generation_kwargs, regex)}` and the sampling temperature of the turns that
    have their own (`temperatures`; the others: the trainer's `temperature`).

    `GRPOTrainer.__init__` must have run with `args.generation_kwargs` scoped to None (it would bake them into every
    turn): the transformers generate kwargs it keeps are then TRL's defaults alone, onto which each turn's own kwargs
    go.
    """
    settings = {}
    for name, (kwargs, regex) in turns.items():
        kwargs = dict(kwargs or {})
        temperature = (temperatures or {}).get(name)
        if trainer.use_vllm:
            settings[name] = TurnGeneration(kwargs, regex, temperature=temperature)
        else:
            merged = {**trainer.generation_kwargs, **kwargs}
            if temperature is not None:
                merged["temperature"] = float(temperature)
            settings[name] = TurnGeneration(kwargs, regex, GenerationConfig(**merged, disable_compile=True), merged)
    return settings


def standing_generation(trainer) -> TurnGeneration:
    """The settings the trainer generates with now (its main turn's), as a `TurnGeneration`."""
    if trainer.use_vllm:
        vllm = trainer.vllm_generation
        return TurnGeneration(dict(vllm.generation_kwargs or {}), vllm.structured_outputs_regex)
    return TurnGeneration({}, None, trainer.generation_config, dict(trainer.generation_kwargs))


def evaluation_generation(trainer, turn: TurnGeneration, temperature: float, seed: int) -> TurnGeneration:
    """`turn`'s settings for a held-out evaluation: greedy when `temperature` is 0, else sampled at `temperature`.

    The turn's other settings (stop strings, penalties, its regex) are kept. With vLLM in server mode a sampled
    evaluation sends `seed` with each request (its samples of a question are one request, `n` of them); in colocate
    mode each sample is a request of its own, so a seed would make them identical and none is sent. Transformers
    generation is seeded by the caller (`torch` RNG)."""
    if trainer.use_vllm:
        kwargs = dict(turn.kwargs)
        if temperature > 0 and trainer.vllm_mode == "server":
            kwargs["seed"] = seed
        return replace(turn, kwargs=kwargs, temperature=float(temperature))
    if temperature > 0:
        sampling = {"do_sample": True, "temperature": float(temperature)}
    else:
        sampling = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None, "min_p": None}
    merged = {**(turn.config_kwargs or {}), **sampling}
    return TurnGeneration(turn.kwargs, turn.regex, GenerationConfig(**merged, disable_compile=True), merged)


def _generation_attributes(trainer, turn: TurnGeneration) -> list[tuple[object, str, object]]:
    """`(container, key, value)` triples that make the generation backend use `turn`'s settings."""
    if trainer.use_vllm:
        vllm = trainer.vllm_generation
        swaps = [(vllm, "generation_kwargs", turn.kwargs), (vllm, "structured_outputs_regex", turn.regex)]
        if turn.temperature is not None:
            swaps.append((vllm, "temperature", turn.temperature))
        return swaps
    return [(trainer, "generation_config", turn.config), (trainer, "generation_kwargs", turn.config_kwargs)]


def use_turn_generation(trainer, turn: TurnGeneration) -> None:
    """Make `turn` the trainer's standing settings (the turn TRL's own calls generate)."""
    for obj, key, value in _generation_attributes(trainer, turn):
        _set(obj, key, value)


@contextmanager
def scoped_call(
    trainer,
    *,
    mode: str | None = None,
    prefix: str | None = None,
    max_new_tokens: int | None = None,
    generation: TurnGeneration | None = None,
    **attributes,
):
    """Set `attributes` on `trainer` (and, if given, the turn's generation settings and every generation backend's
    maximum new tokens) for the duration of the block, then restore them. Metrics the block appends to
    `trainer._metrics[mode]` move under `prefix/`. Every setting is a keyword, so that a call site names what it
    scopes; an attribute cannot be called `mode`, `prefix`, `max_new_tokens` or `generation`.

    An attribute the instance did not hold itself (a method, or one shadowed only for the block) is deleted again
    rather than set to the class's value, so a method stays a method and an outer shadow (a test harness) is kept.
    """
    own = {name: name in vars(trainer) for name in attributes}
    saved = {name: vars(trainer)[name] for name in attributes if own[name]}
    swaps = [] if generation is None else _generation_attributes(trainer, generation)
    swapped = [(obj, key, _get(obj, key)) for obj, key, _ in swaps]
    for obj, key, value in swaps:  # before the lengths, which are then set on this turn's settings
        _set(obj, key, value)
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
        for obj, key, value in swapped:
            _set(obj, key, value)
        for name in attributes:
            if own[name]:
                setattr(trainer, name, saved[name])
            else:
                delattr(trainer, name)
        if prefix is not None:
            _move_new_metrics(trainer._metrics[mode], before, prefix)


def _move_new_metrics(metrics: dict, before: dict[str, int], prefix: str) -> None:
    """Move the values appended to `metrics` since `before` (each key's length then) under `prefix/`.

    Every move is decided before any is made: with `logging_steps > 1` the metrics hold earlier steps' `prefix/` keys
    until the next log, and a value moved into one of them must not count as appended to it (and move again)."""
    taken = {}
    for key in list(metrics):
        values, start = metrics[key], before.get(key, 0)
        if key == "num_tokens" or len(values) <= start:
            continue
        taken[key] = values[start:]
        del values[start:]
        if not values:
            del metrics[key]
    for key, values in taken.items():
        metrics[f"{prefix}/{key}"].extend(values)


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
