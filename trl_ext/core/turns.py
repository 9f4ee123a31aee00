"""Build a follow-up turn on token ids, so the training context is exactly the sampling context.

The turn-2 prompt of RLCR is `turn1_prompt_ids + answer_ids (+ end-of-turn if truncated) + suffix_ids`. Re-rendering
the conversation through the chat template would be wrong: templates that rewrite earlier assistant turns (e.g. strip
`<think>`) would make the context the model is trained on differ from the one it sampled in.

The suffix is read off the chat template, which must therefore render the first turns the same whatever follows
(prefix-preserving). Where a template is not (Qwen3 and its successors render the last assistant turn's `<think>`
block only while it is last), TRL ships a prefix-preserving training version of it for its tool turns
(`trl.chat_template_utils.get_training_chat_template`); the follow-up turn then uses that version, and every prompt
of the conversation must be rendered with it too ([`FollowUpTurn.chat_template`]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trl.chat_template_utils import get_training_chat_template


@dataclass(frozen=True)
class FollowUpTurn:
    """Token ids that close an assistant turn and open the next assistant turn after a user message."""

    end_of_turn_ids: list[int]
    """What the template puts right after assistant content (appended when an answer was truncated)."""
    suffix_ids: list[int]
    """What follows the end-of-turn token: template glue, the user message, and the generation prompt."""
    chat_template: str | None = None
    """The chat template the first turn's prompt must be rendered with (`None`: the one given to [`follow_up_turn`],
    else the tokenizer's own), so that the whole conversation follows one template."""

    def prompt_ids(
        self, prompt_ids: Sequence[int], answer_ids: Sequence[int], eos_token_ids: Sequence[int]
    ) -> list[int]:
        """`prompt_ids + answer_ids (+ end_of_turn_ids if the answer did not end with EOS) + suffix_ids`."""
        answer_ids = [int(t) for t in answer_ids]
        finished = bool(answer_ids) and answer_ids[-1] in set(eos_token_ids)
        closing = [] if finished else self.end_of_turn_ids
        return [int(t) for t in prompt_ids] + answer_ids + closing + self.suffix_ids

    def first_turn_ids(self, tokenizer, prompts: Sequence[list[dict]], **chat_template_kwargs) -> list[list[int]]:
        """The conversational `prompts` as first-turn prompt ids (with the generation prompt), rendered with
        [`chat_template`] so that the whole conversation follows one template, as in training."""
        return [
            [
                int(t)
                for t in tokenizer.apply_chat_template(
                    p,
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=False,
                    chat_template=self.chat_template,
                    **chat_template_kwargs,
                )
            ]
            for p in prompts
        ]


class NotPrefixPreservingError(ValueError):
    """The chat template renders the first turns differently once a user message follows."""


def follow_up_turn(
    tokenizer,
    user_message: str,
    eos_token_ids: Sequence[int],
    chat_template: str | None = None,
    **chat_template_kwargs,
) -> FollowUpTurn:
    """Derive the follow-up-turn tokens from the chat template by diffing a dummy conversation.

    The conversation `[user, assistant]` is rendered without, then with, the extra user message and a generation
    prompt. The assistant turn ends at the last end-of-sequence token of the first rendering, which must come after
    the first turn's generation prompt; what the second rendering adds after that token is `suffix_ids`.

    When the tokenizer's own template (`chat_template=None`) renders the first turns differently once a user message
    follows, TRL's prefix-preserving training version of it is used instead and returned as
    `FollowUpTurn.chat_template`, as `GRPOTrainer` does for its tool turns. Raises `ValueError` when TRL has none.
    """
    try:
        return _diff_turns(tokenizer, user_message, eos_token_ids, chat_template, chat_template_kwargs)
    except NotPrefixPreservingError as error:
        training_template = _training_chat_template(tokenizer) if chat_template is None else None
        if training_template is None:
            raise NotPrefixPreservingError(
                f"{error}, and TRL ships no prefix-preserving training version of it. {_FIX}"
            ) from None
    try:
        return _diff_turns(tokenizer, user_message, eos_token_ids, training_template, chat_template_kwargs)
    except NotPrefixPreservingError as error:
        raise NotPrefixPreservingError(f"{error}, nor does TRL's training version of it. {_FIX}") from None


_FIX = (
    "Set `tokenizer.chat_template` (before building the trainer) to a version that renders every assistant turn the "
    "same whether or not it is the last one, as the `*_training.jinja` templates in trl/chat_templates do "
    "(trl.chat_template_utils.get_training_chat_template)."
)


def _training_chat_template(tokenizer) -> str | None:
    """TRL's prefix-preserving training version of the tokenizer's template, or None if it has none."""
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:  # not a template TRL knows
        return None


def _diff_turns(tokenizer, user_message, eos_token_ids, chat_template, chat_template_kwargs) -> FollowUpTurn:
    def render(messages, add_generation_prompt):
        ids = tokenizer.apply_chat_template(
            messages,
            tokenize=True,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            return_dict=False,
            **chat_template_kwargs,
        )
        return [int(t) for t in ids]

    dummy = [{"role": "user", "content": "Question?"}, {"role": "assistant", "content": "Answer."}]
    opened = render(dummy[:1], add_generation_prompt=True)
    closed = render(dummy, add_generation_prompt=False)
    full = render(dummy + [{"role": "user", "content": user_message}], add_generation_prompt=True)
    eos = set(eos_token_ids)
    # Only an EOS after the generation prompt closes the assistant turn: where the next role tag is an EOS (GLM-4.5's
    # `<|user|>`), the one before the question would make a suffix that repeats the whole first turn.
    answer_start = next((i for i, (x, y) in enumerate(zip(opened, closed)) if x != y), min(len(opened), len(closed)))
    eos_positions = [i for i, t in enumerate(closed) if t in eos and i >= answer_start]
    if not eos_positions:
        raise ValueError(
            "The chat template closes an assistant turn without an end-of-sequence token "
            f"(eos ids {sorted(eos)}), so a follow-up turn cannot be built on token ids. Set the tokenizer's "
            "eos_token, or add the template's end-of-turn token to the model's `generation_config.eos_token_id` "
            "(GRPOTrainer takes its EOS ids from both; `GRPOConfig.generation_kwargs` does not set them); if the "
            "template writes none after an assistant message (GLM-4.5: the next role tag ends the turn), set "
            "`tokenizer.chat_template` to a version that does."
        )
    cut = eos_positions[-1] + 1
    if full[:cut] != closed[:cut]:
        raise NotPrefixPreservingError(
            "The chat template renders the first turns differently once a user message follows, so a follow-up "
            "turn cannot be built by token concatenation with it"
        )
    return FollowUpTurn(end_of_turn_ids=[closed[cut - 1]], suffix_ids=full[cut:], chat_template=chat_template)
