"""Host side of the sandbox: fork-server processes, a pool of them for batched calls, and the reply -> result step.

Each `ForkServer` is one long-lived interpreter running `forkserver.py`; it executes one snippet at a time, each in
a freshly forked, isolated child. A pool keeps idle servers and starts more on demand, so a batch of `n` snippets
with `max_workers=w` runs on `w` servers at once (results in input order).
"""

from __future__ import annotations

import ast
import atexit
import ctypes
import functools
import json
import os
import queue
import select
import subprocess
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .interpreter import sandbox_interpreter
from .result import ExecutionResult
from .syscall_filter import compile_filter, keyctl_number


SERVER_SOURCE = Path(__file__).with_name("forkserver.py")
# The server's whole environment. It is started with `-s -S -B` and this explicit environment instead of `-I`
# because `-I` ignores PYTHONHASHSEED: a fixed hash seed makes the iteration order of sets of strings the same in
# every worker, on every rank and across restarts, so an execution's value does not depend on where it ran.
SERVER_ENV = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
# Opting in to running with a layer missing: no namespaces (user namespaces refused, root without CAP_SYS_ADMIN
# where they are), or no system-call filter (libseccomp missing).
ALLOW_ENV = "TRL_EXT_SANDBOX_ALLOW_UNISOLATED"
PR_SET_DUMPABLE = 4
# Seconds the host waits beyond a snippet's own timeout before it declares its server hung and replaces it.
SERVER_GRACE_S = 30.0


@dataclass(frozen=True)
class Limits:
    """Per-execution limits (see `execute` for their meaning); validated once per call."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_bytes: int = 1 << 16
    # The host parses what comes back: ast.literal_eval costs it far more than the snippet paid to build the text
    # (a 1 MiB list: ~300 MB and 3 s; a 1 MiB set of ints with equal hashes: ~25 s). 64 KiB: ~20 MB, ~0.1 s.
    max_value_bytes: int = 1 << 16
    file_kb: int = 8 << 10

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s!r}.")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb must be >= 64 (the interpreter itself maps ~20 MB), got {self.memory_mb!r}.")
        for name in ("max_output_bytes", "max_value_bytes", "file_kb"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}.")


class ForkServer:
    """One fork-server process and its line protocol (a JSON request per line in, a JSON reply per line out)."""

    def __init__(self, interpreter: str, allow_unisolated: bool = False):
        config = {**server_config(), "allow_unisolated": allow_unisolated, "home": os.path.expanduser("~")}
        self.proc = subprocess.Popen(
            [interpreter, "-s", "-S", "-B", "-c", SERVER_SOURCE.read_text(), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env=SERVER_ENV,
        )
        self._pending = b""
        hello = self._read_line(time.monotonic() + 60)
        if hello is None:
            self.proc.kill()
            message = self.proc.stderr.read().decode(errors="replace")[-2000:] or f"exit code {self.proc.wait()}"
            self.close()
            raise RuntimeError(f"The sandbox fork server ({interpreter}) did not start: {message}")
        self.info = json.loads(hello)
        if "refused" in self.info:
            self.close()
            raise RuntimeError(
                f"The sandbox cannot isolate snippets here: {self.info['refused']}. Without namespaces snippets run "
                f"next to your processes (as your uid when not root: able to read their memory and environment, API "
                f"keys included) and reach the host's network; without the filter they reach the kernel state it "
                f"guards. Run as root with CAP_SYS_ADMIN, or where user namespaces are allowed (Docker's default "
                f"profile and recent Ubuntu refuse them), with libseccomp installed (`pip install pyseccomp` and the "
                f"system's libseccomp2), or accept this explicitly with {ALLOW_ENV}=1 or "
                f"SandboxPool(allow_unisolated=True): snippets then run with rlimits, the system-call filter where "
                f"there is one, Landlock where the kernel has it, as root a uid of their own per execution, and this "
                f"process not dumpable; isolation()['missing'] names what is missing."
            )
        if self.info.get("mode") == "unisolated (opted in)":  # (a server of an older design has no mode)
            make_undumpable()

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def request(self, code: str, result_var: str | None, limits: Limits) -> dict | None:
        """The server's reply, or None when it died or hung (the caller then discards it)."""
        req = {
            "code": code,
            "result_var": result_var,
            "timeout_s": limits.timeout_s,
            "memory_mb": limits.memory_mb,
            "max_output_bytes": limits.max_output_bytes,
            "max_value_bytes": limits.max_value_bytes,
            "file_kb": limits.file_kb,
        }
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            return None
        line = self._read_line(time.monotonic() + limits.timeout_s + SERVER_GRACE_S)
        return None if line is None else json.loads(line)

    def close(self):
        """End of input stops an idle server; a busy or hung one is killed (its snippet child with it)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


def make_undumpable():
    """PR_SET_DUMPABLE 0 on this process: processes of the same uid (the snippets, when nothing else separates
    them) can no longer read its /proc/<pid>/environ or memory, nor ptrace it."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def allow_unisolated_from_env() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


@functools.cache
def server_config() -> dict:
    """What the fork servers get from the host on their command line: the compiled system-call filters (with and
    without a network namespace) and the numbers of the calls they make without a C library wrapper."""
    programs, numbers, missing = compile_filter()
    return {
        "filters": {mode: program.hex() for mode, program in programs.items()} if programs else None,
        "filter_missing": missing,
        "keyctl": keyctl_number(),
        **numbers,
    }


def to_result(reply: dict, result_var: str | None, limits: Limits) -> ExecutionResult:
    """The server's reply as an `ExecutionResult`; the value is read with `ast.literal_eval`, nothing else, and only
    once its text is known to be within `max_value_bytes` characters (the parse is what costs the host)."""
    ok, error, value, text = reply["ok"], reply["error"], None, reply["value_repr"]
    if not isinstance(text, str):  # the server checks this too; the host does not rely on it
        text = None
    if ok and result_var is not None:
        if text is None or len(text) > limits.max_value_bytes:
            ok, error, text = False, f"unreadable result: no repr within {limits.max_value_bytes} characters", None
        else:
            try:
                value = ast.literal_eval(text)
                repr(value)  # printing a result must not raise (an int beyond sys.get_int_max_str_digits() does)
            except Exception as exc:  # SyntaxError, ValueError, RecursionError, MemoryError ...: a hostile repr
                ok, error, value = False, f"unreadable result: not a Python literal ({type(exc).__name__})", None
    return ExecutionResult(
        ok=ok, stdout=reply["stdout"], error=error, value=value, value_repr=text, duration_s=reply["duration_s"]
    )


class SandboxPool:
    """Idle fork servers, started on demand and reused; thread-safe."""

    def __init__(self, interpreter: str | None = None, allow_unisolated: bool | None = None):
        """`allow_unisolated`: run snippets even where no namespace can be created or no filter built (see
        `ForkServer`); default: the environment variable TRL_EXT_SANDBOX_ALLOW_UNISOLATED=1."""
        self.interpreter = interpreter
        self.allow_unisolated = allow_unisolated_from_env() if allow_unisolated is None else allow_unisolated
        self.pid = os.getpid()
        self._idle: queue.LifoQueue[ForkServer] = queue.LifoQueue()
        self._servers: list[ForkServer] = []
        self._lock = threading.Lock()
        self._warned = False

    def _acquire(self) -> ForkServer:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        server = ForkServer(self.interpreter or sandbox_interpreter(), self.allow_unisolated)
        with self._lock:
            self._servers.append(server)
            if server.info["missing"] and not self._warned:
                self._warned = True
                warnings.warn(
                    "The sandbox is not fully isolated here: " + "; ".join(server.info["missing"]),
                    RuntimeWarning,
                    stacklevel=4,
                )
        return server

    def _discard(self, server: ForkServer):
        server.close()
        with self._lock:
            self._servers.remove(server)

    def run(self, code: str, result_var: str | None, limits: Limits) -> ExecutionResult:
        server = self._acquire()
        reply = server.request(code, result_var, limits)
        if reply is None:
            self._discard(server)
            return ExecutionResult(ok=False, stdout="", error="sandbox server failed (replaced)")
        self._idle.put(server)
        return to_result(reply, result_var, limits)

    def run_many(
        self, codes: Sequence[str], result_var: str | None, limits: Limits, max_workers: int | None
    ) -> list[ExecutionResult]:
        workers = max_workers if max_workers is not None else len(os.sched_getaffinity(0))
        if workers < 1:
            raise ValueError(f"max_workers must be >= 1 (or None for one per CPU core), got {max_workers!r}.")
        workers = min(workers, len(codes))
        if workers <= 1:
            return [self.run(code, result_var, limits) for code in codes]
        with ThreadPoolExecutor(workers, thread_name_prefix="sandbox") as threads:
            return list(threads.map(lambda code: self.run(code, result_var, limits), codes))

    def info(self) -> dict:
        server = self._acquire()
        self._idle.put(server)
        return dict(server.info)

    def close(self):
        """End every server; the pool stays usable and starts new ones on demand."""
        with self._lock:
            servers, self._servers = self._servers, []
            while not self._idle.empty():
                self._idle.get_nowait()
        for server in servers:
            server.close()


_default: SandboxPool | None = None
_default_lock = threading.Lock()


def default_pool() -> SandboxPool:
    """The process-wide pool (a new one after a fork of the host: pipes to servers are not shared)."""
    global _default
    with _default_lock:
        if _default is None or _default.pid != os.getpid():
            _default = SandboxPool()
        return _default


@atexit.register
def _close_default():
    if _default is not None and _default.pid == os.getpid():
        _default.close()
