"""Build a follow-up turn on token ids, so the training context is exactly the sampling context.

The turn-2 prompt of RLCR is `turn1_prompt_ids + answer_ids (+ end-of-turn if truncated) + suffix_ids`. Re-rendering
the conversation through the chat template would be wrong: templates that rewrite earlier assistant turns (e.g. strip
`<think>`) would make the context the model is trained on differ from the one it sampled in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FollowUpTurn:
    """Token ids that close an assistant turn and open the next assistant turn after a user message."""

    end_of_turn_ids: list[int]
    """What the template puts right after assistant content (appended when an answer was truncated)."""
    suffix_ids: list[int]
    """What follows the end-of-turn token: template glue, the user message, and the generation prompt."""

    def prompt_ids(self, prompt_ids: Sequence[int], answer_ids: Sequence[int], eos_token_ids: Sequence[int]) -> list[int]:
        """`prompt_ids + answer_ids (+ end_of_turn_ids if the answer did not end with EOS) + suffix_ids`."""
        answer_ids = [int(t) for t in answer_ids]
        finished = bool(answer_ids) and answer_ids[-1] in set(eos_token_ids)
        closing = [] if finished else self.end_of_turn_ids
        return [int(t) for t in prompt_ids] + answer_ids + closing + self.suffix_ids


def follow_up_turn(
    tokenizer,
    user_message: str,
    eos_token_ids: Sequence[int],
    chat_template: str | None = None,
    **chat_template_kwargs,
) -> FollowUpTurn:
    """Derive the follow-up-turn tokens from the chat template by diffing a dummy conversation.

    The conversation `[user, assistant]` is rendered without, then with, the extra user message and a generation
    prompt. The assistant turn ends at the last end-of-sequence token of the first rendering; what the second
    rendering adds after that token is `suffix_ids`.
    """
    dummy = [{"role": "user", "content": "Question?"}, {"role": "assistant", "content": "Answer."}]

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

    closed = render(dummy, add_generation_prompt=False)
    full = render(dummy + [{"role": "user", "content": user_message}], add_generation_prompt=True)
    eos = set(eos_token_ids)
    eos_positions = [i for i, t in enumerate(closed) if t in eos]
    if not eos_positions:
        raise ValueError(
            "The chat template closes an assistant turn without an end-of-sequence token "
            f"(eos ids {sorted(eos)}), so a follow-up turn cannot be built on token ids. Set the tokenizer's "
            "eos_token (or GRPOConfig.generation_kwargs['eos_token_id']) to the template's end-of-turn token."
        )
    cut = eos_positions[-1] + 1
    if full[:cut] != closed[:cut]:
        raise ValueError(
            "The chat template renders the first turns differently once a user message follows, so a follow-up "
            "turn cannot be built by token concatenation with this template."
        )
    return FollowUpTurn(end_of_turn_ids=[closed[cut - 1]], suffix_ids=full[cut:])
