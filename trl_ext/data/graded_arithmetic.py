"""A built-in, deterministic arithmetic dataset of graded difficulty, in three disjoint splits.

Levels run from easy (a digit added to a number below 100) to hard (three-digit products minus a number), so a small
model is right on some questions and wrong on others, and a stated confidence has something to learn. Rows use TRL's
conventions: a conversational `prompt` and the gold answer in `solution`, plus `level` and `question`.

Every question belongs to exactly one split, `train`, `tune` or `report`, decided by a hash of its normalised text
(`normalise_question`: whitespace, case, and the operand order of `+` and `*`, so `3 + 4` and `4+3` are one question);
`graded_arithmetic(n, seed, split)` draws questions of that split only (rejection sampling). Sets drawn from different
splits are therefore disjoint whatever their seeds and sizes: training and warm-up rows come from `train`, choices of
defaults and ablations are looked at on `tune`, and published numbers on `report` (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import random
import re

from datasets import Dataset


LEVELS = 5
ANSWER_FORMAT = (
    "Answer the question. Think briefly inside <think></think>, then give only the final number inside "
    "<answer></answer>. Example: <think>3 plus 4 is 7.</think><answer>7</answer>"
)
SPLITS = ("train", "tune", "report")
# Share of the question space in each split, in hash buckets of 100: train 70, tune 15, report 15.
SPLIT_BUCKETS = {"train": range(0, 70), "tune": range(70, 85), "report": range(85, 100)}
# Draws per row before a split accepts a question it already holds (only when the level's share is nearly used up).
_DISTINCT_TRIES = 200

_NUMBER = r"\d+(?:\.\d+)?"
# A run of numbers joined by + - * and nothing that binds tighter next to it (/, ^, brackets, a sign, a letter).
_EXPRESSION = re.compile(rf"(?<![\w.^/()*+\-]){_NUMBER}(?:[+\-*]{_NUMBER})+(?![\w^/(*]|\.\d)")


def _canonical_expression(match: re.Match) -> str:
    """`b*a-c+d` -> `d+a*b-c`: factors of each product sorted, then the terms, each sign kept with its term."""
    terms = re.findall(rf"([+\-]?)({_NUMBER}(?:\*{_NUMBER})*)", match.group(0))
    canonical = []
    for sign, term in terms:
        factors = sorted(term.split("*"), key=lambda f: (float(f), f))
        canonical.append(("-" if sign == "-" else "+", "*".join(factors)))
    canonical.sort(key=lambda t: (t[0], t[1]))  # "+" sorts before "-": the first term is positive when one is
    text = "".join(sign + term for sign, term in canonical)
    return text[1:] if text.startswith("+") else text


def normalise_question(text: str) -> str:
    """The form two questions share when they ask the same thing: case folded, whitespace runs as one space and none
    around `+ - * / ^ ( ) =` or before `? ! . , ; :`, and in every expression of numbers joined by `+`, `-` and `*` (none of `/`, `^` or a
    bracket next to it) the factors of each product and the signed terms of each sum in a fixed order.

    `"What is 4 + 3?"`, `"what is 3+4?"` -> `"what is 3+4?"`; `"12 * 5 - 100"`, `"5*12 - 100"` -> `"5*12-100"`;
    `"6 / 3 + 1"` is left in its order (`/` binds to the 3)."""
    text = " ".join(text.casefold().split())
    text = re.sub(r"\s*([+\-*/^()=])\s*", r"\1", text)
    text = re.sub(r"\s+([?!.,;:])", r"\1", text)
    return _EXPRESSION.sub(_canonical_expression, text)


def question_split(question: str) -> str:
    """The split (`train`, `tune` or `report`) a question belongs to: a hash of its normalised text."""
    digest = hashlib.sha256(normalise_question(question).encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % 100
    return next(name for name, buckets in SPLIT_BUCKETS.items() if bucket in buckets)


def _question(level: int, rng: random.Random) -> tuple[str, int]:
    if level == 1:  # a digit added to a number below 100: 855 distinct questions
        a, b = rng.randint(1, 99), rng.randint(1, 9)
        return f"{a} + {b}", a + b
    if level == 2:  # two two-digit numbers: 4095
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"{a} + {b}", a + b
    if level == 3:  # a factor up to 12 times a number below 100: 1023
        a, b = rng.randint(2, 12), rng.randint(2, 99)
        return f"{a} * {b}", a * b
    if level == 4:  # two two-digit factors from 13: 3828
        a, b = rng.randint(13, 99), rng.randint(13, 99)
        return f"{a} * {b}", a * b
    a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(100, 999)
    return f"{a} * {b} - {c}", a * b - c


def graded_arithmetic(
    n: int,
    seed: int = 0,
    system_prompt: str | None = ANSWER_FORMAT,
    split: str = "train",
    levels: tuple[int, ...] | list[int] | None = None,
) -> Dataset:
    """`n` questions of `split` cycling through the difficulty `levels` (all of 1..5 by default; the same rows for the
    same `seed`). One level alone gives questions whose difficulty is not written on them: they share one form, and
    which of them a model gets wrong is its own business, not the question's.

    Questions are distinct (after `normalise_question`) while the level's share of the split has unused ones; past
    that a level repeats questions of the same split, never another split's."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
    levels = tuple(levels) if levels else tuple(range(1, LEVELS + 1))
    if any(level not in range(1, LEVELS + 1) for level in levels) or len(set(levels)) != len(levels):
        raise ValueError(f"levels must be distinct values in 1..{LEVELS}, got {list(levels)}.")
    rng = random.Random(seed)
    rows, seen = [], set()
    for i in range(n):
        level = levels[i % len(levels)]
        found = None
        for _ in range(_DISTINCT_TRIES):
            expression, value = _question(level, rng)
            question = f"What is {expression}?"
            if question_split(question) == split:
                found = question, value
                if normalise_question(question) not in seen:
                    break
        if found is None:  # every draw was another split's: not with the levels' spaces above, but never mix splits
            raise RuntimeError(f"no {split} question of level {level} in {_DISTINCT_TRIES} draws.")
        question, value = found
        seen.add(normalise_question(question))
        prompt = [{"role": "user", "content": question}]
        if system_prompt:
            prompt.insert(0, {"role": "system", "content": system_prompt})
        rows.append({"prompt": prompt, "solution": str(value), "level": level, "question": question})
    return Dataset.from_list(rows)
