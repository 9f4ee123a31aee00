"""A stand-in for `trl_ext.sandbox.execute_many` that runs nothing: it recognises the code family's snippets
(a program, then `f` called on literal arguments) and answers from a table mapping each program's text to a Python
function written in the test. Task logic can then be tested exactly, without processes; the real sandbox is tested
on its own and with the family in integration tests.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from ..sandbox.result import ExecutionResult
from ..self_play.code_reasoning.programs import RESULT_VAR


class FakeExecutor:
    """`execute_many(snippets, result_var=..., ...)` answered from `programs`: program text -> function.

    An unknown program, or a function that raises, gives a failed result; a returned value is exchanged as its repr,
    read back with `ast.literal_eval` (a non-literal value fails with "unreadable result", as in the sandbox).
    `calls` records the size of each batch.
    """

    def __init__(self, programs: dict[str, Callable]):
        self.programs = {text.strip(): fn for text, fn in programs.items()}
        self.calls: list[int] = []

    def __call__(
        self, snippets, *, result_var=None, timeout_s=5.0, memory_mb=512, max_workers=None, max_value_bytes=1 << 16
    ):
        assert result_var == RESULT_VAR
        self.calls.append(len(snippets))
        return [self.run(snippet) for snippet in snippets]

    def run(self, snippet: str) -> ExecutionResult:
        if snippet.startswith(f"{RESULT_VAR}_code, "):  # calls_snippet: its first line holds the program and inputs
            compiled, inputs = ast.parse(snippet.split("\n", 1)[0]).body[0].value.elts  # compile(program, ...), inputs
            program, inputs = ast.literal_eval(compiled.args[0]), ast.literal_eval(inputs)
            call = lambda fn: [fn(*args) for args in inputs]  # noqa: E731
        else:  # call_snippet: the program, then `f(*args)`
            program, _, call_text = snippet.rpartition(f"\n\n{RESULT_VAR} = ")
            call = lambda fn: fn(*ast.literal_eval(call_text[3:].strip()[:-1]))  # noqa: E731
        fn = self.programs.get(program.strip())
        if fn is None:
            return ExecutionResult(False, "", "exception: NameError: unknown program")
        try:
            value = call(fn)
        except Exception as error:  # a program's exception is a failed execution
            return ExecutionResult(False, "", f"exception: {type(error).__name__}: {error}")
        text = repr(value)
        try:
            return ExecutionResult(True, "", None, ast.literal_eval(text), text)
        except (ValueError, SyntaxError):
            return ExecutionResult(False, "", "unreadable result: not a Python literal", None, text)
