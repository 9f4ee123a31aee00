"""Program triplets as text: fenced blocks read from model output, checks that need no execution, and the snippets
sent to the sandbox.

A triplet is a program defining `f`, an input (the arguments of one call, written as Python literals: `[3, 1], 'a'`)
and an output (the `repr` of the returned value). Everything here is pure and never raises on model output; values
are only ever read with `ast.literal_eval`, model-written code only ever runs in the sandbox.
"""

from __future__ import annotations

import ast
import re
from typing import Any


ENTRY = "f"
RESULT_VAR = "_triplet_result"
MAX_TEXT_CHARS = 16_000  # of a completion searched for blocks
MAX_PROGRAM_CHARS = 4_000
MAX_INPUT_CHARS = 1_000
MAX_OUTPUT_CHARS = 1_000  # of an output repr: gold outputs are shown to the solver
MAX_MESSAGE_CHARS = 1_000

# A fenced block: ``` + label + newline ... ```. Non-greedy with a bounded text, so no runaway backtracking.
_BLOCK = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\r?\n(.*?)```", re.DOTALL)
_LITERAL_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, OverflowError)


def fenced_blocks(text: Any) -> list[tuple[str, str]]:
    """`(label, content)` of every fenced block in `text`, in order; labels lower-cased (`""` when unlabeled)."""
    if not isinstance(text, str):
        return []
    return [(label.lower(), content) for label, content in _BLOCK.findall(text[:MAX_TEXT_CHARS])]


def blocks_labeled(text: Any, *labels: str) -> list[str]:
    """Contents of the blocks whose label is one of `labels`, in order."""
    return [content for label, content in fenced_blocks(text) if label in labels]


def last_block(text: Any, *labels: str) -> str | None:
    found = blocks_labeled(text, *labels)
    return found[-1] if found else None


def check_program(source: Any) -> str | None:
    """`source` stripped, if it parses and defines a top-level function `f` within `MAX_PROGRAM_CHARS`, else `None`.

    Nothing else is filtered: what the program does when it runs is the sandbox's business, not a text check's.
    """
    if not isinstance(source, str):
        return None
    source = source.strip()
    if not source or len(source) > MAX_PROGRAM_CHARS:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    defines = any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == ENTRY for node in tree.body
    )
    return source if defines else None


def parse_input(text: Any) -> tuple | None:
    """The arguments of one call, `"[3, 1], 'a'"` -> `([3, 1], 'a')`, or `None` unless they are at least one Python
    literal that survives a `repr` round trip (not `1e999`) within `MAX_INPUT_CHARS`.

    The text is read as the argument list of a call, `f(<text>)`, as AZR writes its inputs into the call it runs: a
    trailing comma (`'Python',`) is valid, keyword and starred arguments are not literals and are refused, and text
    that closes the call early (`1)(2`) does not parse as a single call of `f`.
    """
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not text or len(text) > MAX_INPUT_CHARS:
        return None
    try:
        call = ast.parse(f"{ENTRY}({text}\n)", mode="eval").body  # the newline ends a trailing comment
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == ENTRY
            and call.args
            and not call.keywords
        ):
            return None
        args = tuple(ast.literal_eval(arg) for arg in call.args)  # a starred argument is not a literal
        if ast.literal_eval(repr(args)) != args:
            return None
    except _LITERAL_ERRORS:
        return None
    return args


def _varied(value: Any, grow: bool) -> Any:
    """`value` changed a little, keeping its type: grown (`n + 1`, `s + 'x'`, `xs + xs[:1]`) or else changed the other
    way (`n - 1`, reversed or shortened sequences, empty containers); unchanged when there is no such change."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float, complex)):
        return value + 1 if grow else value - 1
    if isinstance(value, (str, bytes)):
        if grow:
            return value + (b"x" if isinstance(value, bytes) else "x")
        return value[::-1] if value[::-1] != value else value[:-1]
    if isinstance(value, (list, tuple)):
        if grow:
            return value + (value[:1] or type(value)([0]))
        return value[::-1] if value[::-1] != value else value[:-1]
    if isinstance(value, (dict, set, frozenset)):
        return type(value)() if not grow else value  # a key or element of a new value's type is anyone's guess
    return value


def derived_inputs(args: tuple) -> list[tuple]:
    """Up to two inputs near `args` (each argument grown, then each changed the other way) that differ from it and
    are valid inputs (`parse_input` reads their `format_input` back): a proposal is also run on them, so a program
    that is deterministic on its own input only is caught before its task is posed."""
    derived = []
    for grow in (True, False):
        try:
            candidate = tuple(_varied(value, grow) for value in args)
            if candidate != args and candidate not in derived and parse_input(format_input(candidate)) == candidate:
                derived.append(candidate)
        except (RecursionError, MemoryError, OverflowError, TypeError):
            continue
    return derived


def format_input(args: tuple) -> str:
    """Arguments as the solver and proposer write them: `([3, 1], 'a')` -> `"[3, 1], 'a'"`."""
    return ", ".join(repr(arg) for arg in args)


def parse_value(text: Any) -> tuple[bool, Any]:
    """`(True, value)` for a Python literal within `MAX_OUTPUT_CHARS`, else `(False, None)`."""
    if not isinstance(text, str):
        return False, None
    text = text.strip()
    if not text or len(text) > MAX_OUTPUT_CHARS:
        return False, None
    try:
        return True, ast.literal_eval(text)
    except _LITERAL_ERRORS:
        return False, None


def values_equal(a: Any, b: Any) -> bool:
    """Value equality of two literal values (`==`; literals cannot override it)."""
    try:
        return bool(a == b)
    except (RecursionError, MemoryError):
        return False


def same_outcome(first, second) -> bool:
    """Whether two executions of one snippet came out the same: both failed, or both returned equal values."""
    if getattr(first, "ok", False) != getattr(second, "ok", False):
        return False
    return not getattr(first, "ok", False) or values_equal(first.value, second.value)


def call_snippet(program: str, args: tuple) -> str:
    """The program, then one call of `f` whose value the sandbox reads back from `RESULT_VAR`."""
    return f"{program}\n\n{RESULT_VAR} = {ENTRY}(*{args!r})\n"


def calls_snippet(program: str, inputs: list[tuple]) -> str:
    """`f` called on each input in turn, each call in a fresh namespace; the list of values is read back.

    Gold outputs are made one call per process (`call_snippet`), so each call here starts as a fresh process would:
    the program runs anew in fresh globals, giving a new `f` with new default values, and a program that keeps state
    between calls (a global counter, a mutable default) answers each pair as it did when the pair was made. State
    outside the program's namespace (an imported module, `builtins`) is shared by the calls of one execution.
    """
    code, scope, args = f"{RESULT_VAR}_code", f"{RESULT_VAR}_scope", f"{RESULT_VAR}_args"
    return (
        f"{code}, {RESULT_VAR}_inputs = compile({program!r}, '<snippet>', 'exec'), {inputs!r}\n"
        f"{RESULT_VAR} = []\n"
        f"for {args} in {RESULT_VAR}_inputs:\n"
        f"    {scope} = {{'__name__': '__main__', '__builtins__': __builtins__}}\n"
        f"    exec({code}, {scope})\n"
        f"    {RESULT_VAR}.append({scope}[{ENTRY!r}](*{args}))\n"
    )


def output_repr(result) -> str | None:
    """The canonical repr of a successful execution's value, or `None` (failed, unreadable, or too long)."""
    if not getattr(result, "ok", False):
        return None
    text = getattr(result, "value_repr", None)
    if text is not None and len(text) > MAX_OUTPUT_CHARS:
        return None
    try:
        text = repr(result.value)  # the value came back literal-evaluated: its repr is canonical and safe
    except (RecursionError, MemoryError):
        return None
    return text if len(text) <= MAX_OUTPUT_CHARS and parse_value(text)[0] else None
