"""What one sandboxed execution returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ExecutionResult:
    """The outcome of one snippet.

    Args:
        ok: The snippet ran to its end within the limits and, when a `result_var` was asked for, its value was read.
        stdout: What the snippet printed (stdout and stderr), capped, decoded as UTF-8 with replacement characters.
        error: `None` when `ok`; otherwise a short reason: `"timeout"`, `"memory"`, `"exception: ZeroDivisionError:
            division by zero"`, `"output too large ..."`, `"unreadable result: ..."`, `"killed by signal 11"`, ...
        value: `ast.literal_eval` of the `repr` of the requested variable, computed in the child (never unpickled);
            only set when `ok`, and then its own `repr` works (printing a result never raises).
        value_repr: That `repr` text: a `str` within `max_value_bytes` characters, or `None` (no value asked for,
            none sent, or one too long to read).
        duration_s: Wall-clock seconds of the execution, measured by the fork server (fork to exit).
    """

    ok: bool
    stdout: str
    error: str | None
    value: Any = None
    value_repr: str | None = None
    duration_s: float = 0.0
