"""Text helpers for reward functions: completion text, tag extraction, confidence parsing, answer normalisation.

Everything here runs on raw model output, so every helper is total: it returns a value for any input (including
`None`, non-strings, empty strings and pathological text) and never raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any


__all__ = ["completion_text", "extract_tag", "normalize_answer", "parse_confidence"]

# Longest confidence field we try to parse; anything longer is not a number a model meant to write.
_MAX_CONFIDENCE_CHARS = 64
# Longest plain number `normalize_answer` canonicalises through `Decimal` (longer ones are only cleaned up).
_MAX_NUMBER_CHARS = 256

# A plain decimal number (no sign, no exponent), optionally followed by a percent sign. ASCII digits only:
# `float()` would accept other scripts' digits, which no confidence field should contain.
_CONFIDENCE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%?)\s*")
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
# Digit groups separated by commas in threes, e.g. "1,000" or "12,345,678.5" (not "1,2" or "1,0000").
_THOUSANDS_RE = re.compile(r"(?<![0-9,])[0-9]{1,3}(?:,[0-9]{3})+(?![0-9]|,[0-9])")
_WHITESPACE_RE = re.compile(r"\s+")


def _message_text(message: Any) -> str:
    """Text of one chat message: its `content`, which may be a string or a list of typed parts."""
    content = message.get("content") if isinstance(message, Mapping) else message
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return ""


def completion_text(completion: Any) -> str:
    """Return the text of a completion: a plain string, or the last message of a conversational completion.

    Conversational completions are lists of `{"role": ..., "content": ...}` messages; content given as a list of
    parts (`[{"type": "text", "text": ...}]`) is joined. Anything unusable (`None`, a message without content,
    another type) gives `""`.
    """
    try:
        if isinstance(completion, str):
            return completion
        if isinstance(completion, (bytes, bytearray)):
            return bytes(completion).decode("utf-8", errors="replace")
        if isinstance(completion, Mapping):
            return _message_text(completion)
        if isinstance(completion, Sequence) and len(completion) > 0:
            return _message_text(completion[-1])
    except Exception:
        pass
    return ""


@lru_cache(maxsize=64)
def _tag_pattern(tag: str) -> re.Pattern[str]:
    open_tag, close_tag = re.escape(f"<{tag}>"), re.escape(f"</{tag}>")
    # Content may not contain another opening tag, so a pair is the innermost one and each scan stops at the next
    # opening tag (linear time even on text with thousands of unclosed tags).
    return re.compile(rf"{open_tag}((?:(?!{open_tag}).)*?){close_tag}", re.DOTALL)


def extract_tag(text: Any, tag: str) -> str | None:
    """Return the stripped content of the last complete `<tag>...</tag>` pair in `text`, or `None` if there is none.

    Pairs are matched non-greedily and across lines. An opening tag that is followed by another opening tag before
    a closing one is not a pair of its own, so with nesting (`<a>x<a>5</a></a>`) or a stray unclosed tag
    (`<a>x <a>5</a>`) the innermost pair (`5`) is the one returned.
    """
    if not isinstance(text, str) or not text:
        return None
    try:
        last = None
        for match in _tag_pattern(tag).finditer(text):  # keeps one match: model output can hold millions
            last = match
        return None if last is None else last.group(1).strip()
    except Exception:
        return None


def parse_confidence(text: Any) -> float | None:
    """Parse a confidence value such as `0.85`, `.85`, `1`, `85%` or `85.5 %` into a float in [0, 1].

    Percentages are divided by 100. Returns `None` for anything else: empty or overlong text, signs, exponents,
    nan/inf, words, several numbers, or a value outside [0, 1].
    """
    if not isinstance(text, str) or len(text) > _MAX_CONFIDENCE_CHARS:
        return None
    match = _CONFIDENCE_RE.fullmatch(text)
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except (ValueError, OverflowError):
        return None
    if match.group(2):
        value /= 100.0
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return None
    return value


# A number not glued to letters or other digits, with its sign and an optional percent sign (lenient extraction
# only). A minus after a letter or digit ("x-1", "60-70%") is a hyphen, not a sign.
_LOOSE_NUMBER_RE = re.compile(r"(?<![\w.])([+-]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+))(\s*%)?(?![\w])")
_MAX_LENIENT_CHARS = 20_000


def extract_answer(text: Any, tag: str, lenient: bool = False) -> str | None:
    """The content of the last `<tag>…</tag>`; with `lenient`, else the last number in the text, with its sign.

    Lenient extraction is for models too small to follow a tag format (the embedded 135M default): "The answer is
    7." yields "7", "It is -7" yields "-7". Strict extraction is the RLCR format contract.
    """
    answer = extract_tag(text, tag)
    if answer or not lenient or not isinstance(text, str) or len(text) > _MAX_LENIENT_CHARS:
        return answer
    numbers = _LOOSE_NUMBER_RE.findall(text)
    return numbers[-1][0] if numbers else None


def extract_confidence(text: Any, tag: str, lenient: bool = False) -> float | None:
    """The confidence in the last `<tag>…</tag>` (see `parse_confidence`); with `lenient`, else the first number
    or percentage in the text that is a valid confidence ("I am 70% sure" -> 0.7). A signed number is none
    ("confidence: -0.5" is not read as 0.5)."""
    confidence = parse_confidence(extract_tag(text, tag))
    if confidence is not None or not lenient or not isinstance(text, str) or len(text) > _MAX_LENIENT_CHARS:
        return confidence
    for number, percent in _LOOSE_NUMBER_RE.findall(text):
        confidence = parse_confidence(number + percent.strip())
        if confidence is not None:
            return confidence
    return None


def _canonical_number(text: str) -> str:
    """Canonical spelling of a plain decimal number ("3.0" -> "3", "0.50" -> "0.5", "-0" -> "0"), else `text`."""
    if len(text) > _MAX_NUMBER_CHARS or _NUMBER_RE.fullmatch(text) is None:
        return text
    try:
        value = Decimal(text)
        if value.is_zero():
            return "0"
        # Fixed-point formatting never uses an exponent, and for a plain number it is never longer than the input.
        result = format(value, "f")
    except (InvalidOperation, ValueError, OverflowError):
        return text
    if "." in result:
        result = result.rstrip("0").rstrip(".")
    return result


_BOXED = "\\boxed{"


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each `{` -> index of the `}` that closes it (unclosed ones are absent), in one pass."""
    closing, stack = {}, []
    for index, char in enumerate(text):
        if char == "{":
            stack.append(index)
        elif char == "}" and stack:
            closing[stack.pop()] = index
    return closing


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _strip_wrappers(text: str) -> str:
    r"""`text` without surrounding whitespace, `$`/`$$`, `\boxed{...}` (only when one balanced box is the whole
    string, not e.g. `\boxed{1}+\boxed{2}`) and trailing periods, peeled in any order and nesting.

    Works on indices into the original string with the braces matched once up front, so deep nesting stays linear
    (slicing and rescanning per layer is quadratic in the depth).
    """
    closing = _closing_braces(text)
    start, end = _trimmed(text, 0, len(text))
    while True:
        before = (start, end)
        for delimiter in ("$$", "$"):
            size = len(delimiter)
            if end - start >= 2 * size and text.startswith(delimiter, start) and text.endswith(delimiter, start, end):
                start, end = _trimmed(text, start + size, end - size)
                break
        if text.startswith(_BOXED, start, end) and closing.get(start + len(_BOXED) - 1) == end - 1:
            start, end = _trimmed(text, start + len(_BOXED), end - 1)
        if end > start and text[end - 1] == ".":
            end = _trimmed(text, start, end - 1)[1]
        if (start, end) == before:
            return text[start:end]


def normalize_answer(text: Any) -> str:
    r"""Normalise an answer for exact-match comparison.

    Strips whitespace, surrounding `$`/`$$` and a `\boxed{...}` wrapper, lowercases, drops a trailing period,
    removes thousands separators ("1,000" -> "1000"), collapses whitespace, and canonicalises a string that is a
    single plain number ("3.0" -> "3", "0.50" -> "0.5"). Returns `""` for non-strings.
    """
    if not isinstance(text, str):
        return ""
    try:
        result = _WHITESPACE_RE.sub(" ", _strip_wrappers(text).lower())
        result = _THOUSANDS_RE.sub(lambda match: match.group(0).replace(",", ""), result)
        return _canonical_number(result)
    except Exception:
        return ""
