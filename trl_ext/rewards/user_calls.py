"""Calling user-supplied code (a question parser, an accuracy function, a prompt builder) without letting one bad row
stop training or fail silently: the exception is caught, its first traceback logged once with the callable's role and
its own name, and every failure counted for a metric."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any


logger = logging.getLogger(__name__)


class UserCallGuard:
    """Calls one user callable; `(result, True)`, or `(None, False)` when it raised.

    Args:
        name: The callable's role, as users configure it (`"parse_question"`), used in the log and the metric.
        consequence: What happens to the row when it raises, for the log (`"the proposal counts as invalid"`).
        metric: The metric that counts failures (defaults to `errors/<name>`).
    """

    def __init__(self, name: str, consequence: str, metric: str | None = None):
        self.name = name
        self.consequence = consequence
        self.metric = metric or f"errors/{name}"
        self.failures = 0  # since the last `take()`
        self._logged = False

    def __call__(self, func: Callable, *args: Any) -> tuple[Any, bool]:
        try:
            return func(*args), True
        except Exception:
            self.failures += 1
            if not self._logged:
                self._logged = True
                # The role says where it is configured; the callable's own name finds the code among several.
                logger.exception(
                    "%s (%s) raised: %s; `%s` counts the failures. Only this first traceback is logged.",
                    self.name,
                    _callable_name(func),
                    self.consequence,
                    self.metric,
                )
            return None, False

    def take(self) -> int:
        """Failures since the last call, and reset the count."""
        failures, self.failures = self.failures, 0
        return failures


def _callable_name(func: Callable) -> str:
    """`module.qualname` of the code behind `func`: a function or method, what a `functools.wraps` wrapper or a
    `partial` wraps, the class of another callable object."""
    func = inspect.unwrap(func)
    while isinstance(func, functools.partial):
        func = inspect.unwrap(func.func)
    named = func if hasattr(func, "__qualname__") else type(func)
    return f"{getattr(named, '__module__', None) or '?'}.{named.__qualname__}"
