"""The task-family interface of [`AbsoluteZeroTrainer`]: what the proposer is asked, how its proposal is parsed into a
question, how the solver is prompted, and how the solver's responses are scored.

A family is data, not a subclass: another family (code reasoning with a sandboxed executor, or workspace tasks judged
for safety and completion) plugs in by building a `TaskFamily` with its own parser, solver prompt and rewards. A family
whose proposer is conditioned on what it proposed before (Absolute Zero's buffer of past programs) adds a `TaskState`:
the trainer builds proposer prompts from it, validates proposals through it in batches, updates it with each step's
valid proposals and saves it in checkpoints.
"""

from __future__ import annotations

import functools
import json
import random
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset

from ..core.model_text import neutralize_prompt, neutralize_special_tokens
from ..rewards.parsing import extract_tag


Conversation = list[dict[str, Any]]
ParseQuestion = Callable[[str], "dict[str, Any] | None"]
SolverPromptFn = Callable[[dict[str, Any], dict[str, Any]], Conversation]


@dataclass
class TaskFamily:
    """Everything task-specific about a self-play run.

    Attributes:
        name: Short name (logs, model card).
        parse_question: `f(proposal_text) -> dict | None`. `None` marks an invalid proposal (no solver work is spent on
            it); a dict's fields reach the reward functions as columns (e.g. `question` and the gold `solution`).
            Called on raw model output: it must never raise. A parser whose questions always have the same fields
            may list them in a `question_fields` attribute, so that a `solver_prompt_template` naming another field
            fails at init.
        solver_prompt_fn: `f(question_fields, seed_row) -> conversation` the solver answers. The fields are the
            proposer's text: the trainer neutralises the special-token strings of the whole conversation it returns
            (see `plain_text_prompts`), so the function need not.
        reward_funcs: Solver reward functions in TRL's signature; their `__name__`s are the names that
            `learnability_criteria` refer to.
        seed_prompts: `f(n, seed) -> Dataset` with a conversational `prompt` column: the proposer prompts.
        learnability_criteria: The family's default criteria (see `AbsoluteZeroConfig.learnability_criteria`).
        reward_weights: Default weights of `reward_funcs`.
        environment_factory: The solver's environment (TRL's `environment_factory`: its public methods are the
            solver's tools), or `None` for single-turn solving.
        state: Trainer state the proposer is conditioned on (see `TaskState`), or `None` for a stateless family whose
            seed prompts are the proposer prompts. Pass it to the trainer as `task_state`.
        heldout_questions: `f(n, seed) -> questions`: `n` solver questions (`None`: the family's default number) for
            the held-out evaluation (`trl_ext.self_play.evaluate_solver`), the same for the same seed, each with the
            fields a validated proposal has (gold included) plus `heldout_breakdown`. `None`: the family has no
            held-out evaluation (the workspace family, whose solver needs TRL's tool loop).
        heldout_breakdown: The question field the held-out accuracy is broken down by (`level`, `task_type`).
        learning_curves: Logged metrics a run plots per step (the recipe's `learning_curves.png`), the family's
            solver rewards among them (`solver/<reward>_mean`).
        card_metrics: The model card's headline numbers of the family: `{label: logged metric}`, each reported as its
            mean over the run (next to the learnable ratio and invalid rate every family logs).
        format_warmup_examples: `f(tokenizer, n, seed) -> examples` for a supervised format warm-up before self-play
            (`n` generated tasks; see [`~trl_ext.models.warmup.format_warmup`]), or `None`: the family has none.
    """

    name: str
    parse_question: ParseQuestion
    solver_prompt_fn: SolverPromptFn
    reward_funcs: list[Callable]
    seed_prompts: Callable[[int, int], Dataset]
    learnability_criteria: list[dict] | None = None
    reward_weights: Sequence[float] | None = field(default=None)
    environment_factory: Callable[[], Any] | None = None
    state: TaskState | None = None
    heldout_questions: Callable[[int | None, int], list[dict[str, Any]]] | None = None
    heldout_breakdown: str | None = None
    learning_curves: Sequence[str] = ("unified_filter/learnable_ratio", "proposer/reward_mean")
    card_metrics: Mapping[str, str] = field(default_factory=dict)
    format_warmup_examples: Callable[[Any, int, int], list[dict]] | None = None


class TaskState:
    """State of a self-play task family that [`AbsoluteZeroTrainer`] keeps identical on every process.

    The trainer calls, in this order, each generation batch:

    1. `proposer_prompt(seed_row, rng)` for each seed prompt of a proposer round, on every process with the same
       seeded `rng` (so every process builds the same prompts). It returns the conversation the proposer continues
       and a context dict that is merged over the parsed proposal's fields (the model cannot overwrite it); a
       context `task_type` breaks the self-play metrics down per task type.
    2. `validate(questions)` on this process's share of the round's parsed proposals (execute them in one batch, not
       one by one); returns each question completed with its gold fields, or `None` when invalid. The trainer
       gathers the verdicts, so every process decides on the same data.
    3. `update(questions)` once per training batch with the batch's valid questions, in the same order on every
       process.

    `state_dict()` must be JSON-serialisable: the trainer saves it in each checkpoint and restores it on resume with
    `load_state_dict` (plain JSON, nothing executed). `metrics()` are logged under `task/`.
    """

    def proposer_prompt(self, seed_row: dict[str, Any], rng: random.Random) -> tuple[Conversation, dict[str, Any]]:
        raise NotImplementedError

    def validate(self, questions: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        return list(questions)

    def update(self, questions: list[dict[str, Any]]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


def tagged_question_parser(tag: str = "question") -> ParseQuestion:
    """Default parser: the content of the last `<tag>…</tag>` as `{"question": text}`, or `None` without one.

    JSON is allowed: a tag content (or a whole reply) that is a JSON object with a non-empty string `question` gives
    that object's fields, so a proposal can carry metadata for the reward functions (e.g. a reference answer).
    """

    def parse_question(text: str) -> dict[str, Any] | None:
        if not isinstance(text, str):
            return None
        content = extract_tag(text, tag)
        fields = _json_fields(content if content is not None else text)
        if fields is not None:
            return fields
        return {"question": content} if content else None

    return parse_question


class _EmptyIfMissing(dict):
    def __missing__(self, key):
        return ""


_MAX_JSON_CHARS = 20_000


def _json_fields(text: str | None) -> dict[str, Any] | None:
    if not text or len(text) > _MAX_JSON_CHARS or not text.lstrip().startswith("{"):
        return None
    try:
        fields = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(fields, dict) and isinstance(fields.get("question"), str) and fields["question"].strip():
        return fields
    return None


def template_fields(template: str) -> frozenset[str]:
    """The question fields a `str.format` template names (`"{question} ({hint.text})"` -> `{"question", "hint"}`);
    `ValueError` naming `solver_prompt_template` for a malformed template or a positional field."""
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as error:
        raise ValueError(f"solver_prompt_template {template!r} is not a valid format string: {error}.") from None
    roots = {re.split(r"[.\[]", name, maxsplit=1)[0] for name in names}
    if any(not root or root.isdigit() for root in roots):
        raise ValueError(
            f"solver_prompt_template {template!r} has a positional field ('{{}}' or '{{0}}'); name the question "
            "field, such as '{question}'."
        )
    return frozenset(roots)


def plain_text_prompts(prompt_fn: SolverPromptFn, extra: Sequence[str] = ()) -> SolverPromptFn:
    """`prompt_fn` whose returned prompt has every special-token string made plain text (`neutralize_prompt`, with
    a tokenizer's own special tokens as `extra`): how [`AbsoluteZeroTrainer`] calls any `solver_prompt_fn`, a
    user's own included, since the question fields it is given are model-written. What it returns is neutralised,
    not what it is given, so this holds whatever the function does with the fields (joins two of them into one
    token, strips zero-width characters, decodes them); its own text is neutralised too, where special-token
    strings have no place either (the chat template writes the real ones)."""

    @functools.wraps(prompt_fn)
    def plain_text_prompt(question: dict[str, Any], row: dict[str, Any]) -> Conversation:
        return neutralize_prompt(prompt_fn(question, row), extra)

    return plain_text_prompt


def template_solver_prompt(template: str = "{question}", system_prompt: str | None = None) -> SolverPromptFn:
    """Default solver prompt: one user message, `template` formatted with the question's fields (a field the
    proposal lacks renders empty), with its special-token strings made plain text: proposals are model output, and
    neutralising the formatted message, not each field, also breaks a token split over two fields."""

    def solver_prompt(question: dict[str, Any], row: dict[str, Any]) -> Conversation:
        fields = {k: "" if v is None else v for k, v in question.items()}
        content = neutralize_special_tokens(template.format_map(_EmptyIfMissing(fields)))
        conversation = [{"role": "user", "content": content}]
        if system_prompt:
            conversation.insert(0, {"role": "system", "content": system_prompt})
        return conversation

    return solver_prompt
