"""The tail of a completion after a closing tag, as a per-token mask: the part of a single-turn reply that follows the
answer (`<answer>7</answer><confidence>0.8</confidence>`: the confidence), for a loss term that should skip it."""

from __future__ import annotations

from collections.abc import Sequence

from .spans import token_char_spans


def tokens_after_tag(spans: Sequence[tuple[int, int]], text: str, tag: str) -> list[int]:
    """Per token (its `[start, end)` characters in `text`), 1 if it lies wholly after the end of the last `tag`, else 0.

    A token that straddles the tag's end holds some of the tag and stays out of the tail. Without `tag` (a format
    failure) nothing is the tail: the whole completion counts as the part before it.
    """
    at = text.rfind(tag)
    if at == -1:
        return [0] * len(spans)
    end = at + len(tag)
    return [int(start >= end) for start, _ in spans]


def tail_token_mask(tokenizer, ids: Sequence[int], tag: str) -> list[int]:
    """[`tokens_after_tag`] on completion token ids (special tokens decoded: a final end-of-sequence token is in the
    tail)."""
    text, spans = token_char_spans(tokenizer, ids)
    return tokens_after_tag(spans, text, tag)
