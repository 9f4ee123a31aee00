"""Locate tagged spans of a completion on its token ids, for any tokenizer.

Byte-level BPE merges tag characters with their neighbours (`">\\n"`, `"answer>"`), so a span cannot be found by
tokenising the tag. Instead the completion is decoded token by token into character offsets, the span is located in
the text, and every token whose characters overlap the span is inside it (a token that straddles a boundary is in).
"""

from __future__ import annotations

from collections.abc import Sequence


def token_char_spans(tokenizer, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decode `ids` (special tokens kept) and return the text and each token's `[start, end)` character span.

    Fast path: when decoding tokens one by one reproduces the full decode (ASCII text, byte-level BPE without split
    characters), spans are cumulative lengths. Otherwise the text is decoded as a stream, token by token, and tokens
    that complete a multi-byte character together share its span: with the `tokenizers` library's `DecodeStream`
    for a fast tokenizer, else with `_window_spans`, the same algorithm for tokenizers without a Rust backend.
    """
    ids = [int(t) for t in ids]
    if not ids:
        return "", []
    pieces = tokenizer.batch_decode([[t] for t in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    text = "".join(pieces)
    if text == tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        spans, pos = [], 0
        for piece in pieces:
            spans.append((pos, pos + len(piece)))
            pos += len(piece)
        return text, spans
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return _stream_spans(backend, ids) if backend is not None else _window_spans(tokenizer, ids)


def _stream_spans(backend, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """Spans from `tokenizers.decoders.DecodeStream`, which returns the text each token completes (or nothing)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=False)
    text, spans, waiting = "", [], 0
    for token in ids:
        chunk = stream.step(backend, token)
        waiting += 1
        if chunk is not None:
            start = len(text)
            text += chunk
            spans.extend([(start, len(text))] * waiting)
            waiting = 0
    spans.extend([(len(text), len(text))] * waiting)  # an incomplete character at the very end
    return text, spans


def _window_spans(tokenizer, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """Streaming decode for tokenizers without a `tokenizers` backend: each step decodes a small window ending at the
    new token and emits the text it adds once that text is complete (no trailing U+FFFD)."""

    def decode(window):
        return tokenizer.decode(window, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    text = ""
    spans: list[tuple[int, int]] = []
    prefix_offset = read_offset = 0  # decode from prefix_offset so leading-space rules see the previous token
    for i in range(len(ids)):
        prefix_text = decode(ids[prefix_offset:read_offset])
        new_text = decode(ids[prefix_offset : i + 1])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            start = len(text)
            text += new_text[len(prefix_text) :]
            spans.extend([(start, len(text))] * (i + 1 - read_offset))
            prefix_offset, read_offset = read_offset, i + 1
    spans.extend([(len(text), len(text))] * (len(ids) - len(spans)))  # an incomplete character at the very end
    return text, spans


def locate_span(text: str, start_tags: Sequence[str], end_tag: str) -> tuple[int, int, bool]:
    """Character range `[start, end)` to train on, and whether `end_tag` closed it.

    The span runs from the first occurrence of the first `start_tags` entry found before the last `end_tag` (the
    completion start if none) through the end of the last `end_tag`. Without `end_tag` (a format failure) the span
    is the whole completion, so the negative reward still reaches every token.
    """
    end_at = text.rfind(end_tag)
    if end_at == -1:
        return 0, len(text), False
    start = 0
    for tag in start_tags:
        found = text.find(tag)
        if found != -1 and found < end_at:
            start = found
            break
    return start, end_at + len(end_tag), True


def span_token_mask(
    tokenizer,
    ids: Sequence[int],
    start_tags: Sequence[str],
    end_tag: str,
    eos_token_ids: Sequence[int] = (),
    train_on_eos: bool = True,
) -> tuple[list[int], bool]:
    """Per-token 0/1 mask of the tagged span of a completion (see [`locate_span`]) and whether the span closed.

    With `train_on_eos`, a final end-of-sequence token is in the mask even when text between the span and it is not,
    so the model keeps learning to stop.
    """
    text, spans = token_char_spans(tokenizer, ids)
    start, end, closed = locate_span(text, start_tags, end_tag)
    mask = [int((a < end and b > start) or (a == b and start <= a < end)) for a, b in spans]
    if train_on_eos and ids and int(ids[-1]) in set(eos_token_ids):
        mask[-1] = 1
    return mask, closed
