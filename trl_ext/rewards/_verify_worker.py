"""Verifier worker: runs math_verify on (gold, prediction) pairs for `verify.py`, in a process of its own.

Started by `verify.py` as `python _verify_worker.py MEMORY_BYTES` and run by path, so that it imports neither
`trl_ext` nor anything heavy. Protocol (one JSON document per line): it first writes `true` once math_verify is
imported (`false` if it cannot be); then, for each request `{"budget_s": seconds, "total_s": seconds, "pairs":
[[gold, prediction], ...]}`, it writes one `true`/`false` line per pair as soon as that pair is decided, so the parent
can time pairs one by one, or `"timeout"` for a pair that ran over `budget_s`. The request gets at most `total_s` in
all: a pair whose budget that cuts short and that runs over gets `null` (not verified), as do pairs reached after it
(at once), so a pair is only called slow after its whole budget.
"""

import json
import logging
import os
import signal
import sys
import time


# Run by path, Python put this package directory first on sys.path, where its modules could shadow top-level ones.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != _HERE]


class _BudgetExceeded(BaseException):
    """Raised by SIGALRM when a pair runs over its budget; a BaseException so math_verify's and sympy's
    `except Exception` handlers let it through."""


def _on_alarm(signum, frame):
    raise _BudgetExceeded


def _limit_memory(limit_bytes: int) -> None:
    # A blow-up (a huge integer, an expansion with millions of terms) then ends in MemoryError or a crash of this
    # process instead of swapping the machine. Best effort: RLIMIT_AS does not exist everywhere.
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    except (ImportError, ValueError, OSError):
        pass


def _parse(text, parse, sympy_types):
    r"""The sympy objects math_verify finds in `text`.

    A bare answer is wrapped in `$...$` so LaTeX extraction sees it as math ("\frac{1}{2}", "(1, 2)", "5\%");
    text that is already delimited, boxed, or written with Python's `**` is parsed as is. The other spelling is
    the fallback when the first yields no expression.
    """
    wrapped = f"${text}$"
    as_is_first = "**" in text or "$" in text or "\\boxed" in text or "\\[" in text or "\\(" in text
    for candidate in (text, wrapped) if as_is_first else (wrapped, text):
        # Timeouts off: math_verify's own SIGALRM would cancel the per-pair alarm set in `_equal`.
        expressions = [
            item
            for item in parse(candidate, parsing_timeout=None, raise_on_error=False)
            if isinstance(item, sympy_types)
        ]
        if expressions:
            return expressions
    return []


def _equal(gold, prediction, budget_s, parse, verify, sympy_types) -> bool:
    """math_verify's verdict; raises `_BudgetExceeded` after `budget_s` seconds."""
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        gold_parsed = _parse(gold, parse, sympy_types)
        prediction_parsed = _parse(prediction, parse, sympy_types) if gold_parsed else []
        return any(
            verify(gold_expr, prediction_expr, timeout_seconds=None, raise_on_error=False)
            for gold_expr in gold_parsed
            for prediction_expr in prediction_parsed
        )
    except Exception:  # MemoryError and RecursionError included: the worker lives on
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> None:
    memory_bytes = int(sys.argv[1])
    # Replies go to a private copy of stdout; anything a library prints goes to stderr instead of the protocol.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    _limit_memory(memory_bytes)
    try:
        from math_verify import parse, verify
        from sympy import Basic
        from sympy.matrices import MatrixBase
    except Exception:
        replies.write("false\n")
        replies.flush()
        return
    # Failed parses and comparisons are expected with model output; the warning about disabled timeouts too.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    signal.signal(signal.SIGALRM, _on_alarm)
    # One pair before reporting ready: the first one loads parsers and caches (tenths of a second), which would
    # otherwise come out of the budget of whichever pair a fresh worker gets first.
    _equal("\\frac{1}{2}", "0.5", 60.0, parse, verify, (Basic, MatrixBase))
    replies.write("true\n")
    replies.flush()
    for line in sys.stdin:  # ends when the parent closes the pipe or exits
        request = json.loads(line)
        end = time.monotonic() + request.get("total_s", float("inf"))
        for gold, prediction in request["pairs"]:
            budget = min(request["budget_s"], end - time.monotonic())
            if budget <= 0:
                replies.write("null\n")
                continue
            try:
                reply = "true" if _equal(gold, prediction, budget, parse, verify, (Basic, MatrixBase)) else "false"
            except _BudgetExceeded:  # also when the alarm fired in `_equal`'s `finally`, just before it was cancelled
                reply = '"timeout"' if budget == request["budget_s"] else "null"
            replies.write(reply + "\n")
            replies.flush()
        replies.flush()


if __name__ == "__main__":
    main()
