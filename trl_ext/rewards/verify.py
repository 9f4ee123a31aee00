"""Answer checking: math_verify in an isolated worker process, falling back to normalised exact match.

sympy can hang, or exhaust memory, on adversarial model output ("9**9**9**9", "(10^{10})!"), and math_verify's own
timeouts rely on SIGALRM, which only works on the main thread and cannot interrupt one long big-integer operation.
So math_verify runs in a persistent worker process (`_verify_worker.py`) with a memory limit; the parent waits for
each pair with a hard wall-clock timeout and kills the worker when it runs over (or crashes). The pair then counts as
not verified, and a fresh worker starts on the next call. A whole batch also has a deadline, so that hostile answers
cannot queue timeout after timeout: pairs math_verify has no time left for keep their exact-match verdict.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from .parsing import normalize_answer


__all__ = ["verify_answer", "verify_answers", "verify_answers_counted"]

logger = logging.getLogger(__name__)

# Hard wall-clock limit (seconds) for math_verify on one pair, after which the worker is killed.
VERIFY_TIMEOUT_S = float(os.environ.get("TRL_EXT_VERIFY_TIMEOUT_S", "5"))
# Wall-clock limit (seconds) for math_verify on a whole batch; pairs left when it runs out are not verified.
VERIFY_BATCH_TIMEOUT_S = float(os.environ.get("TRL_EXT_VERIFY_BATCH_TIMEOUT_S", "10"))
# Address-space limit of the worker (Linux; best effort elsewhere).
VERIFY_MEMORY_BYTES = int(os.environ.get("TRL_EXT_VERIFY_MEMORY_BYTES", str(2 * 1024**3)))
# How long a fresh worker may take to import math_verify and sympy (slow on a loaded machine).
_STARTUP_TIMEOUT_S = 60.0
# Texts longer than this skip math_verify and are only compared by exact match: no answer needs more, and
# latex2sympy's parser is superlinear in some inputs, so long texts would only waste worker time.
MAX_VERIFY_CHARS = 500

_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_verify_worker.py")


class _WorkerFailed(Exception):
    """The worker ran over its timeout, crashed or could not start; it has been killed."""


class _Worker:
    """One worker process and the parent's end of its pipes. Not thread-safe: used under `_lock`."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, _WORKER_SCRIPT, str(VERIFY_MEMORY_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,  # nothing buffered in this process: a forked child closing its copy cannot flush stale data
            start_new_session=True,  # its own process group, killed as a whole; no SIGINT from the terminal
        )
        self.owner_pid = os.getpid()
        self._buffer = b""
        # poll rather than select, which fails on descriptors above 1023 (common in a trainer with many files open)
        self._poller = select.poll()
        self._poller.register(self.process.stdout.fileno(), select.POLLIN)
        try:
            self.available = self.read_result(_STARTUP_TIMEOUT_S)
        except Exception:
            self.kill()  # no orphan, whatever went wrong
            raise

    def read_result(self, timeout_s: float) -> bool | None:
        """The next `true`/`false`/`null` line; raises `_WorkerFailed` (after killing the worker) if none comes in time."""
        deadline = time.monotonic() + timeout_s
        stdout = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poller.poll(remaining * 1000):
                self.kill()
                raise _WorkerFailed("timed out")
            chunk = os.read(stdout, 65536)
            if not chunk:  # the worker died (crash, memory limit)
                self.kill()
                raise _WorkerFailed(f"exited with code {self.process.poll()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def send(self, request: Any) -> None:
        data = memoryview(json.dumps(request).encode() + b"\n")
        try:
            while data:  # an unbuffered write may be partial
                data = data[self.process.stdin.write(data) :]
        except OSError as error:  # BrokenPipeError: the worker died since its last answer
            self.kill()
            raise _WorkerFailed("pipe closed") from error

    def kill(self) -> None:
        if self.process.returncode is None:  # once reaped, its process group id may belong to someone else
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:  # already gone
                pass
            self.process.wait()
        self.close_pipes()

    def close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


_lock = threading.Lock()
_worker: _Worker | None = None
# False once a worker reported that math_verify cannot be imported. The worker's pipes and process group need POSIX
# (poll on pipes, killpg): elsewhere answers are compared by exact match only.
_available = os.name == "posix"


def _reset_after_fork() -> None:
    # Another thread may have held the lock at fork time, and would never release it in the child.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _get_worker() -> _Worker | None:
    """The running worker of this process, started if needed; `None` if math_verify is unavailable."""
    global _worker, _available
    if _worker is not None and _worker.owner_pid != os.getpid():
        # Inherited through fork: the parent process talks to it. Drop our copies of its pipes (so it still sees
        # EOF when the parent exits) without killing it, and start one of our own.
        _worker.close_pipes()
        _worker = None
    if _worker is not None and _worker.process.poll() is not None:  # died between calls (killed from outside)
        _worker.kill()
        _worker = None
    if _worker is None and _available:
        worker = _Worker()
        if worker.available:
            _worker = worker
        else:
            logger.warning("math_verify could not be imported; answers are compared by exact match only")
            worker.kill()
            _available = False
    return _worker


def _discard_worker() -> None:
    global _worker
    if _worker is not None:
        _worker.kill()
        _worker = None


def _shutdown() -> None:
    if _worker is not None and _worker.owner_pid == os.getpid():
        _worker.kill()


atexit.register(_shutdown)


def _math_verify_batch(pairs: list[tuple[str, str]]) -> list[bool | None]:
    """math_verify's verdict for each pair; a pair that times out or crashes the worker counts as False, and a pair
    left when the batch deadline (`VERIFY_BATCH_TIMEOUT_S`) has passed is `None` (not verified)."""
    results: list[bool | None] = []
    deadline = time.monotonic() + VERIFY_BATCH_TIMEOUT_S
    slack = 0.2 * VERIFY_TIMEOUT_S
    with _lock:
        while len(results) < len(pairs) and time.monotonic() < deadline:
            worker = None
            try:
                worker = _get_worker()
                if worker is None:
                    break
                # The worker interrupts a pair itself (SIGALRM) a little before the hard timeout, so that the common
                # slow case returns cleanly and only uninterruptible work (one huge big-integer operation) is killed.
                # It also answers `null` for the pairs it reaches after the batch's time is up.
                worker.send(
                    {
                        "budget_s": 0.8 * VERIFY_TIMEOUT_S,
                        "total_s": deadline - time.monotonic() - slack,
                        "pairs": pairs[len(results) :],
                    }
                )
                while len(results) < len(pairs):
                    timeout = min(VERIFY_TIMEOUT_S, max(deadline - time.monotonic(), 0.0) + slack)
                    verdict = worker.read_result(timeout)
                    results.append(None if verdict is None else bool(verdict))
            except Exception as error:  # _WorkerFailed, or an unexpected failure (spawn error, garbled reply)
                logger.warning("math_verify worker failed (%s); answer counted as not verified", error)
                _discard_worker()
                if worker is None:  # it could not even start: do not retry for every pair of the batch
                    break
                # Blame the pair being processed and resend the rest to a fresh worker.
                results.append(False)
            except BaseException:
                # KeyboardInterrupt while waiting: the worker still owes answers that would be read as the answers
                # to the next request.
                _discard_worker()
                raise
    left = len(pairs) - len(results)
    if left and time.monotonic() >= deadline:
        logger.warning(
            "math_verify: batch deadline (%g s) reached, %d answers compared by exact match only",
            VERIFY_BATCH_TIMEOUT_S,
            left,
        )
        return results + [None] * left
    return results + [False] * left  # no worker: exact match only


def _as_text(value: Any) -> str:
    try:
        return ("" if value is None else value if isinstance(value, str) else str(value)).strip()
    except Exception:  # a `__str__` that raises
        return ""


def verify_answers(pairs: Iterable[tuple[Any, Any]]) -> list[bool]:
    """`verify_answer(gold, prediction)` for each pair, with one round trip to the worker for the whole batch."""
    return verify_answers_counted(pairs)[0]


def verify_answers_counted(pairs: Iterable[tuple[Any, Any]]) -> tuple[list[bool], int]:
    """`verify_answers`, and how many pairs math_verify had no time for within the batch deadline
    (`VERIFY_BATCH_TIMEOUT_S`, env `TRL_EXT_VERIFY_BATCH_TIMEOUT_S`): those keep their exact-match verdict."""
    pairs = [(_as_text(gold), _as_text(prediction)) for gold, prediction in pairs]
    unverified = 0
    try:
        results = []
        pending = []  # indices of pairs that need math_verify
        for index, (gold, prediction) in enumerate(pairs):
            if not gold or not prediction:
                results.append(False)
                continue
            gold_normalized = normalize_answer(gold)
            results.append(bool(gold_normalized) and gold_normalized == normalize_answer(prediction))
            if not results[-1] and len(gold) <= MAX_VERIFY_CHARS and len(prediction) <= MAX_VERIFY_CHARS:
                pending.append(index)
        for index, verified in zip(pending, _math_verify_batch([pairs[index] for index in pending])):
            if verified is None:
                unverified += 1
            else:
                results[index] = verified
        return results, unverified
    except Exception:
        logger.warning("answer verification failed", exc_info=True)
        return [False] * len(pairs), unverified


def verify_answer(gold: Any, prediction: Any) -> bool:
    r"""Whether `prediction` is a correct answer for `gold`.

    True when the normalised texts agree (`normalize_answer`), or else when math_verify finds them equal (so "0.5",
    "1/2" and "\frac{1}{2}" agree). math_verify runs in a worker process with a hard timeout of `VERIFY_TIMEOUT_S`
    seconds; texts longer than `MAX_VERIFY_CHARS` are only compared by exact match. Non-string arguments are
    converted with `str()` (`None` counts as empty). An empty side is never correct. Thread- and fork-safe. Never
    raises.
    """
    return verify_answers([(gold, prediction)])[0]
