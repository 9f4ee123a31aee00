"""Answer checking: math_verify in an isolated worker process, falling back to normalised exact match.

sympy can hang, or exhaust memory, on adversarial model output ("9**9**9**9", "(10^{10})!"), and math_verify's own
timeouts rely on SIGALRM, which only works on the main thread and cannot interrupt one long big-integer operation.
So math_verify runs in a persistent worker process (`_verify_worker.py`) with a memory limit; the parent waits for
each pair with a hard wall-clock timeout and kills the worker when it runs over (or crashes). The pair then counts as
wrong, and a fresh worker starts on the next call. A whole batch also has a deadline, so that hostile answers cannot
queue timeout after timeout: cheap pairs are checked first (every pair gets a short budget before any gets its whole
budget), and pairs math_verify has no time left for are not verified (`None`, counted), whatever the batch's order.
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
# Wall-clock limit (seconds) for math_verify on a whole batch; pairs left when it runs out are not verified (None).
VERIFY_BATCH_TIMEOUT_S = float(os.environ.get("TRL_EXT_VERIFY_BATCH_TIMEOUT_S", "10"))
# Budget (seconds) of each pair in the first round of a batch, before slower pairs get their whole budget: far more
# than a normal answer needs, far less than a hostile one takes.
VERIFY_QUICK_S = float(os.environ.get("TRL_EXT_VERIFY_QUICK_S", "0.5"))
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

    def read_result(self, timeout_s: float) -> bool | str | None:
        """The next reply (`true`, `false`, `null` or `"timeout"`, see `_verify_worker.py`); raises `_WorkerFailed`
        (after killing the worker) if none comes in time."""
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
    """math_verify's verdict for each pair, or `None` for a pair not verified before the batch deadline
    (`VERIFY_BATCH_TIMEOUT_S`, from when the worker is ready).

    Each distinct pair is checked once, in an order set by the pairs' texts alone (shortest first), so the verdicts
    do not depend on the batch's order. A first round gives every pair a short budget (`VERIFY_QUICK_S`), so the
    cheap ones, nearly all, are decided before hostile answers spend the batch's time; the pairs it leaves undecided
    get their whole budget (`0.8 * VERIFY_TIMEOUT_S`, killed at `VERIFY_TIMEOUT_S`) in a second round. A pair that
    runs over its whole budget, or crashes the worker, is wrong (model output math_verify cannot decide); one whose
    budget the deadline cut short, or that was not reached, is `None`. Without math_verify every pair is `False`
    (exact match only).
    """
    if not pairs:
        return []
    order = sorted(set(pairs), key=lambda pair: (len(pair[0]) + len(pair[1]), pair))
    verdicts: dict[tuple[str, str], bool] = {}
    with _lock:
        try:
            available = _get_worker() is not None
        except Exception as error:  # it could not start: do not retry for every pair of the batch
            logger.warning("math_verify worker failed to start (%s); answers compared by exact match only", error)
            available = False
        if not available:
            return [False] * len(pairs)
        deadline = time.monotonic() + VERIFY_BATCH_TIMEOUT_S
        whole = 0.8 * VERIFY_TIMEOUT_S
        quick = min(VERIFY_QUICK_S, whole)
        slow = _verify_round(order, quick, deadline, verdicts, last=quick == whole)
        _verify_round(slow, whole, deadline, verdicts, last=True)
    left = sum(pair not in verdicts for pair in order)
    if left:
        logger.warning(
            "math_verify: batch deadline (%g s) reached, %d distinct answers not verified (scored None)",
            VERIFY_BATCH_TIMEOUT_S,
            left,
        )
    return [verdicts.get(pair) for pair in pairs]


def _verify_round(
    pairs: list[tuple[str, str]], budget_s: float, deadline: float, verdicts: dict[tuple[str, str], bool], last: bool
) -> list[tuple[str, str]]:
    """Check `pairs` in order, each within `budget_s` seconds, until `deadline`; their verdicts go into `verdicts`.
    Returns the pairs that ran over `budget_s` (or crashed the worker); in the `last` round those are `False`."""
    slack = 0.2 * VERIFY_TIMEOUT_S
    slow: list[tuple[str, str]] = []
    done = 0

    def over_budget(pair):
        if last:
            verdicts[pair] = False
        else:
            slow.append(pair)

    while done < len(pairs) and time.monotonic() < deadline:
        worker, reading, cut_short = None, False, False
        try:
            worker = _get_worker()
            if worker is None:
                break
            # The worker interrupts a pair itself (SIGALRM) when its budget runs out, so that the common slow case
            # returns cleanly and only uninterruptible work (one huge big-integer operation) is killed, `slack`
            # later. It answers `null` for the pairs the deadline leaves no time for, or cuts short.
            worker.send({"budget_s": budget_s, "total_s": deadline - time.monotonic(), "pairs": pairs[done:]})
            reading = True
            while done < len(pairs):
                cut_short = deadline - time.monotonic() < budget_s
                reply = worker.read_result(min(budget_s, max(deadline - time.monotonic(), 0.0)) + slack)
                pair = pairs[done]
                done += 1
                if reply == "timeout":
                    over_budget(pair)
                elif reply is not None:
                    verdicts[pair] = bool(reply)
        except Exception as error:  # _WorkerFailed, or an unexpected failure (spawn error, garbled reply)
            logger.warning("math_verify worker failed (%s); the rest of the batch goes to a fresh worker", error)
            _discard_worker()
            if worker is None:  # it could not start again: the rest is not verified
                break
            # Blame the pair being processed (unless the deadline cut its time short) and resend the rest to a
            # fresh worker.
            if reading:
                if not cut_short:
                    over_budget(pairs[done])
                done += 1
        except BaseException:
            # KeyboardInterrupt while waiting: the worker still owes answers that would be read as the answers
            # to the next request.
            _discard_worker()
            raise
    return slow


def _as_text(value: Any) -> str:
    try:
        return ("" if value is None else value if isinstance(value, str) else str(value)).strip()
    except Exception:  # a `__str__` that raises
        return ""


def verify_answers(pairs: Iterable[tuple[Any, Any]]) -> list[bool]:
    """`verify_answer(gold, prediction)` for each pair, with one round trip to the worker for the whole batch. A pair
    not verified before the batch deadline is `False` here; [`verify_answers_counted`] tells them apart."""
    return [bool(verdict) for verdict in verify_answers_counted(pairs)[0]]


def verify_answers_counted(pairs: Iterable[tuple[Any, Any]]) -> tuple[list[bool | None], int]:
    """Each pair's verdict, `None` for a pair math_verify had no time for within the batch deadline
    (`VERIFY_BATCH_TIMEOUT_S`, env `TRL_EXT_VERIFY_BATCH_TIMEOUT_S`; see `_math_verify_batch`), and how many are
    `None`. The verdicts do not depend on the order of the pairs."""
    pairs = [(_as_text(gold), _as_text(prediction)) for gold, prediction in pairs]
    unverified = 0
    try:
        results: list[bool | None] = []
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
            unverified += verified is None
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
