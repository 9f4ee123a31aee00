"""The code family's held-out set: hand-written AZR-style programs (loops, strings, dicts, nested lists, tuples) with
one input each, posed as deduction (program + input -> output) and abduction (program + output -> an input) tasks.

Written here rather than drawn from the triplet buffer, which self-play fills and trains on. The gold outputs are not
written down: they come from running the programs in the sandbox through the family's own validation, as the gold
output of a proposal does. Induction is left out: its check needs a hint and held-out pairs per program, which a
model-free set of hand-written programs does not give for free.
"""

from __future__ import annotations

import random
from typing import Any


HELDOUT_PROGRAMS = [
    (
        "def f(numbers):\n    total = 0\n    for i, n in enumerate(numbers):\n        total += n * (i + 1)\n"
        "    return total",
        "[3, 1, 4, 1, 5]",
    ),
    ("def f(s):\n    return ''.join(c.upper() if i % 2 == 0 else c for i, c in enumerate(s))", "'python'"),
    (
        "def f(text):\n    counts = {}\n    for ch in text:\n        counts[ch] = counts.get(ch, 0) + 1\n"
        "    return max(sorted(counts), key=counts.get)",
        "'mississippi'",
    ),
    ("def f(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a", "10"),
    ("def f(matrix):\n    return [list(row) for row in zip(*matrix)]", "[[1, 2, 3], [4, 5, 6]]"),
    (
        "def f(nums, target):\n    seen = {}\n    for i, n in enumerate(nums):\n        if target - n in seen:\n"
        "            return (seen[target - n], i)\n        seen[n] = i\n    return None",
        "[2, 7, 11, 15], 18",
    ),
    (
        "def f(s):\n    depth = 0\n    for ch in s:\n        depth += 1 if ch == '(' else -1\n        if depth < 0:\n"
        "            return False\n    return depth == 0",
        "'(()())('",
    ),
    ("def f(xs):\n    return [x for x in xs if x % 3 == 0] + [x for x in xs if x % 3 != 0]", "[5, 9, 2, 6, 3]"),
    ("def f(word, shift):\n    return ''.join(chr((ord(c) - 97 + shift) % 26 + 97) for c in word)", "'xyz', 3"),
    ("def f(n):\n    return sum(int(d) ** 2 for d in str(n))", "1234"),
    (
        "def f(pairs):\n    groups = {}\n    for key, value in pairs:\n        groups.setdefault(key, []).append(value)\n"
        "    return groups",
        "[('a', 1), ('b', 2), ('a', 3)]",
    ),
    (
        "def f(xs):\n    best = current = xs[0]\n    for x in xs[1:]:\n        current = max(x, current + x)\n"
        "        best = max(best, current)\n    return best",
        "[-2, 1, -3, 4, -1, 2, 1, -5, 4]",
    ),
]
HELDOUT_TYPES = ("deduction", "abduction")


def make_heldout_questions(validate):
    """`heldout_questions(n, seed)` for the code family: `n` of the `len(HELDOUT_PROGRAMS) * 2` tasks (all by
    default), drawn in an order fixed by `seed`. `validate` is the family's `CodeTaskState.validate`: it runs each
    program on its input twice in the sandbox and gives the triplet with its gold output."""

    def heldout_questions(n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        size = len(HELDOUT_PROGRAMS) * len(HELDOUT_TYPES)
        n = size if n is None else n
        if not 0 <= n <= size:
            raise ValueError(f"the code family holds out 0 to {size} tasks (got {n}).")
        chosen = random.Random(f"code-heldout-{seed}").sample(
            [(p, t) for p in range(len(HELDOUT_PROGRAMS)) for t in HELDOUT_TYPES], n
        )
        programs = sorted({p for p, _ in chosen})
        triplets = validate(
            [
                {"task_type": "deduction", "program": HELDOUT_PROGRAMS[p][0], "inputs": [HELDOUT_PROGRAMS[p][1]]}
                for p in programs
            ]
        )
        for p, triplet in zip(programs, triplets, strict=True):
            if triplet is None:
                raise RuntimeError(
                    f"held-out program {p} gave no output in the sandbox (it runs everywhere else): check that "
                    "`trl_ext.sandbox.execute('result = 1', result_var='result')` works on this machine."
                )
        gold = dict(zip(programs, triplets, strict=True))
        return [{**gold[p], "task_type": task_type} for p, task_type in chosen]

    return heldout_questions
