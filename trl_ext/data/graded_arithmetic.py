"""A built-in, deterministic arithmetic dataset of graded difficulty.

Levels run from trivial (one-digit sums) to hard (three-digit products and mixed expressions), so a small model is
right on some questions and wrong on others, and a stated confidence has something to learn. Rows use TRL's
conventions: a conversational `prompt` and the gold answer in `solution`, plus `level` and `question`.
"""

from __future__ import annotations

import random

from datasets import Dataset


LEVELS = 5
ANSWER_FORMAT = (
    "Answer the question. Think briefly inside <think></think>, then give only the final number inside "
    "<answer></answer>. Example: <think>3 plus 4 is 7.</think><answer>7</answer>"
)


def _question(level: int, rng: random.Random) -> tuple[str, int]:
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"{a} + {b}", a + b
    if level == 2:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"{a} + {b}", a + b
    if level == 3:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"{a} * {b}", a * b
    if level == 4:
        a, b = rng.randint(13, 99), rng.randint(3, 19)
        return f"{a} * {b}", a * b
    a, b, c = rng.randint(100, 999), rng.randint(11, 99), rng.randint(100, 999)
    return f"{a} * {b} - {c}", a * b - c


def graded_arithmetic(n: int, seed: int = 0, system_prompt: str | None = ANSWER_FORMAT) -> Dataset:
    """`n` questions cycling through the difficulty levels 1..5 (the same rows for the same `seed`)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        level = i % LEVELS + 1
        expression, value = _question(level, rng)
        question = f"What is {expression}?"
        prompt = [{"role": "user", "content": question}]
        if system_prompt:
            prompt.insert(0, {"role": "system", "content": system_prompt})
        rows.append({"prompt": prompt, "solution": str(value), "level": level, "question": question})
    return Dataset.from_list(rows)
