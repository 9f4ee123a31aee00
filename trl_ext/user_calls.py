"""Calling user-supplied code (a question parser, an accuracy function, a prompt builder) without letting one bad row
stop training or fail silently: the exception is caught, its first traceback logged once with the callable's name,
and every failure counted for a metric."""

from __future__ import annotations

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
                logger.exception("%s raised: %s; `%s` counts the failures. Only this first traceback is logged.",
                                 self.name, self.consequence, self.metric)
            return None, False

    def take(self) -> int:
        """Failures since the last call, and reset the count."""
        failures, self.failures = self.failures, 0
        return failures
