"""Arithmetic self-play (the CPU demo family): the proposer writes an expression in `<question>` tags, a safe AST
evaluator computes the gold answer, the solver answers in `<answer>` tags, and the reward is an exact numeric match.

The evaluator never calls `eval`: it parses with `ast.parse(mode="eval")` and walks only numeric literals,
`+ - * /`, unary `+ -` and parentheses, with bounds on text length, node count, depth and the size of every
intermediate value, so model output cannot make it raise, hang or allocate without bound. Arithmetic is exact
(`Fraction`); a question whose answer is not a terminating decimal with at most `MAX_DECIMALS` places is invalid.
Hand-written on purpose: general expression evaluators (e.g. simpleeval) compute in floats, accept names and calls,
and bound neither intermediate magnitudes nor work, while a gold answer needs exact values and hard limits.
"""

from __future__ import annotations

import ast
import random
import re
from fractions import Fraction
from typing import Any

from datasets import Dataset

from ..rewards.parsing import completion_text, extract_answer, extract_tag
from .base import TaskFamily


MAX_EXPRESSION_CHARS = 120
MAX_NODES = 64
MAX_DEPTH = 24
MAX_MAGNITUDE = 10**12  # any literal or intermediate value
MAX_DENOMINATOR = 10**6
MAX_DECIMALS = 4
MAX_ANSWER_CHARS = 64

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}
_UNARY = {ast.UAdd: lambda a: a, ast.USub: lambda a: -a}
_SYMBOLS = str.maketrans({"×": "*", "÷": "/", "−": "-", "–": "-"})
_EXPRESSION_CHARS = re.compile(r"[0-9+\-*/(). ]+")
_PREFIX = re.compile(r"^(?:what\s+is|what's|compute|calculate|evaluate|solve|find)\s*:?\s*", re.IGNORECASE)
# Lenient extraction: an expression of at least two numbers joined by operators, brackets allowed. No two adjacent
# quantified parts match the same character (no ambiguous backtracking), and the text searched is bounded.
_LOOSE_EXPRESSION = re.compile(r"\(*-?\d+(?:\.\d+)?\)*(?:\s*[-+*/×÷][\s(]*-?\d+(?:\.\d+)?\)*)+")
MAX_LENIENT_CHARS = 1_000  # lenient extraction reads this much of an untagged proposal
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


class _Invalid(Exception):
    pass


def _check_shape(tree: ast.AST) -> None:
    """Reject large or deep trees iteratively, before the recursive evaluation."""
    stack, nodes = [(tree, 0)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES or depth > MAX_DEPTH:
            raise _Invalid
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _bounded(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE or value.denominator > MAX_DENOMINATOR:
        raise _Invalid
    return value


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Invalid
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_evaluate(node.operand)))
    raise _Invalid  # names, calls, attributes, powers, comparisons, anything else


def safe_evaluate(expression: Any) -> Fraction | None:
    """The exact value of an arithmetic expression with at least one binary operation, or `None` if it is not one
    within the bounds. Never raises."""
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        return None
    text = expression.translate(_SYMBOLS).strip()
    if not text or not _EXPRESSION_CHARS.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval")
        _check_shape(tree)
        if not any(isinstance(node, ast.BinOp) for node in ast.walk(tree)):
            return None  # a bare number is not a question
        return _evaluate(tree)
    except (
        _Invalid,
        SyntaxError,
        ValueError,
        TypeError,
        ZeroDivisionError,
        RecursionError,
        MemoryError,
        OverflowError,
    ):
        return None


def format_number(value: Fraction) -> str | None:
    """`value` as a plain decimal string (`"12"`, `"-3.25"`), or `None` if it needs more than `MAX_DECIMALS`."""
    scaled = value * 10**MAX_DECIMALS
    if scaled.denominator != 1:
        return None
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled.numerator), 10**MAX_DECIMALS)
    frac_text = str(frac).rjust(MAX_DECIMALS, "0").rstrip("0")
    return f"{sign}{whole}" + (f".{frac_text}" if frac_text else "")


def parse_number(text: Any) -> Fraction | None:
    """A number written by the solver (`"12"`, `"-3.50"`, `"1,000"`), exactly, or `None`. Never raises."""
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    cleaned = text.strip().replace(",", "").replace(" ", "").translate(_SYMBOLS).rstrip(".")
    if not _NUMBER.fullmatch(cleaned):
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _expression_of(text: str) -> str:
    """Strip a question's wording around the expression: "What is 3 + 4?" -> "3 + 4"."""
    text = _PREFIX.sub("", text.strip())
    return text.rstrip(" ?=.").strip()


def make_question_parser(tag: str = "question", lenient: bool = False):
    """`parse_question` for arithmetic: `{"question": "What is <expr>?", "expression": expr, "solution": gold}` or
    `None` for a missing tag, a non-arithmetic text, an out-of-bounds expression, division by zero, or an answer
    that is not a short decimal. With `lenient`, an untagged proposal's first arithmetic expression is used (for
    models too small to follow the tag format)."""

    def parse_question(text: str) -> dict[str, Any] | None:
        if not isinstance(text, str):
            return None
        content = extract_tag(text, tag)
        if content is None and lenient:
            match = _LOOSE_EXPRESSION.search(text[:MAX_LENIENT_CHARS])
            content = match.group(0) if match else None
        if not content:
            return None
        expression = _expression_of(content)
        value = safe_evaluate(expression)
        gold = None if value is None else format_number(value)
        if gold is None:
            return None
        expression = " ".join(expression.translate(_SYMBOLS).split())
        return {"question": f"What is {expression}?", "expression": expression, "solution": gold}

    parse_question.question_fields = frozenset({"question", "expression", "solution"})
    return parse_question


def make_numeric_match_reward(answer_tag: str = "answer", solution_column: str = "solution", lenient: bool = False):
    """`numeric_match`: 1.0 when the solver's `<answer>` equals the gold `solution` exactly as numbers, else 0.0.
    `None` for rows without a gold answer (not applicable), counted in `numeric_match/missing_gold_rate`."""

    def numeric_match(prompts, completions, completion_ids=None, log_metric=None, **kwargs) -> list[float | None]:
        golds = kwargs.get(solution_column) or [None] * len(completions)
        rewards = []
        for completion, gold in zip(completions, golds, strict=True):
            gold_value = parse_number(gold) if isinstance(gold, str) else None
            if gold_value is None:
                rewards.append(None)
                continue
            answer = parse_number(extract_answer(completion_text(completion), answer_tag, lenient))
            rewards.append(1.0 if answer is not None and answer == gold_value else 0.0)
        if log_metric is not None and completions:
            log_metric("numeric_match/missing_gold_rate", rewards.count(None) / len(completions))
        return rewards

    return numeric_match


def make_answer_format_reward(answer_tag: str = "answer"):
    """`answer_format`: 1.0 when the response has exactly one `<answer>…</answer>` pair holding a number, else 0.0."""
    open_tag, close_tag = f"<{answer_tag}>", f"</{answer_tag}>"

    def answer_format(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        rewards = []
        for completion in completions:
            text = completion_text(completion)
            ok = text.count(open_tag) == 1 and text.count(close_tag) == 1
            rewards.append(1.0 if ok and parse_number(extract_tag(text, answer_tag)) is not None else 0.0)
        return rewards

    return answer_format


PROPOSER_PROMPT = (
    "Write one new arithmetic question {hint}. Use only numbers, + - * / and parentheses. Put the expression "
    "inside <question></question>, for example <question>12 * 3 - 5</question>."
)
HINTS = [
    "adding two numbers below 20",
    "subtracting two two-digit numbers",
    "multiplying two one-digit numbers",
    "multiplying a two-digit number by a one-digit number",
    "with three numbers and two different operations",
    "with parentheses",
    "dividing a number evenly",
    "mixing addition and multiplication",
]
SOLVER_SYSTEM_PROMPT = (
    "Answer the question. Give only the final number inside <answer></answer>. Example: <answer>7</answer>"
)


def seed_prompts(n: int, seed: int = 0) -> Dataset:
    """`n` proposer prompts (conversational `prompt` column), each asking for a question of a drawn kind."""
    rng = random.Random(seed)
    rows = [
        {"prompt": [{"role": "user", "content": PROPOSER_PROMPT.format(hint=rng.choice(HINTS))}]} for _ in range(n)
    ]
    return Dataset.from_list(rows)


def solver_prompt(question: dict[str, Any], row: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "system", "content": SOLVER_SYSTEM_PROMPT}, {"role": "user", "content": question["question"]}]


def _quotient(rng: random.Random) -> str:
    divisor = rng.randint(2, 9)
    return f"{divisor * rng.randint(2, 19)} / {divisor}"


# The held-out set's difficulty levels, each a mix of the kinds of question the proposer prompts ask for (HINTS).
HELDOUT_LEVELS = {
    1: [
        lambda rng: f"{rng.randint(1, 19)} + {rng.randint(1, 19)}",
        lambda rng: f"{rng.randint(2, 9)} * {rng.randint(2, 9)}",
    ],
    2: [
        lambda rng: f"{rng.randint(10, 99)} - {rng.randint(10, 99)}",
        lambda rng: f"{rng.randint(11, 99)} * {rng.randint(2, 9)}",
        _quotient,
    ],
    3: [
        lambda rng: f"{rng.randint(2, 30)} + {rng.randint(2, 9)} * {rng.randint(2, 9)}",
        lambda rng: f"{rng.randint(2, 12)} * {rng.randint(2, 12)} - {rng.randint(1, 30)}",
        lambda rng: f"({rng.randint(1, 20)} + {rng.randint(1, 20)}) * {rng.randint(2, 9)}",
    ],
}
HELDOUT_SIZE = 50
MAX_HELDOUT = 600  # level 1 has 425 distinct questions: drawing more than 200 of them would slow to a crawl
PROMPT_EXAMPLE = "12 * 3 - 5"  # in every proposer prompt, so a proposal may copy it: never held out


def heldout_questions(n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """`n` distinct questions (default `HELDOUT_SIZE`), levels 1, 2, 3 in turn, as the family's parser reads a
    proposal (`question`, `expression`, gold `solution` from the safe evaluator) plus their `level`. The same for the
    same `seed`; drawn from a generator of their own, so they share nothing with the seed prompts."""
    n = HELDOUT_SIZE if n is None else n
    if not 0 <= n <= MAX_HELDOUT:
        raise ValueError(f"the arithmetic family holds out 0 to {MAX_HELDOUT} questions (got {n}).")
    rng, parse, seen, questions = random.Random(f"arithmetic-heldout-{seed}"), make_question_parser(), set(), []
    while len(questions) < n:
        level = len(questions) % len(HELDOUT_LEVELS) + 1
        expression = rng.choice(HELDOUT_LEVELS[level])(rng)
        if expression in seen or expression == PROMPT_EXAMPLE:
            continue
        seen.add(expression)
        questions.append({**parse(f"<question>{expression}</question>"), "level": level})
    return questions


def arithmetic_task(lenient: bool = False) -> TaskFamily:
    """The arithmetic family. Learnability by default: the numeric match is right on some but not all responses."""
    return TaskFamily(
        name="arithmetic",
        parse_question=make_question_parser(lenient=lenient),
        solver_prompt_fn=solver_prompt,
        reward_funcs=[make_numeric_match_reward(lenient=lenient), make_answer_format_reward()],
        seed_prompts=seed_prompts,
        reward_weights=[1.0, 0.5],
        heldout_questions=heldout_questions,
        heldout_breakdown="level",
        learning_curves=(
            "unified_filter/learnable_ratio",
            "repropose/total_attempts",
            "proposer/reward_mean",
            "solver/numeric_match_mean",
        ),
        card_metrics={"solver accuracy": "solver/numeric_match_mean"},
    )
