"""Run untrusted (model-written) Python snippets isolated at the OS level, not filtered by text.

    from trl_ext.sandbox import execute, execute_many, isolation
    execute("def f(x):\\n    return x * 2\\nresult = f(21)", result_var="result").value   # 42

Each snippet runs in its own freshly forked child of a zygote (a process of the fork server, a separate interpreter
that loads only the standard library, which has never held any request or result), with, as root:

- new mount, PID and network namespaces (and the fork server's IPC namespace): every file system read-only (nosuid),
  a private empty tmpfs on `/tmp` as the working directory, a fresh `/proc` showing only the snippet, no network
  interface that is up (a network namespace of its own, so nothing it bound is left for the next snippet);
- rlimits: address space (`memory_mb`), CPU seconds (`ceil(timeout_s)`), file size, open files, processes 0, no
  core dumps; then the uid/gid drop to 65534 (nobody; `RLIMIT_NPROC` does not bind root), `no_new_privs`, a new
  session keyring, and a seccomp filter (no new user namespaces, keyrings, memfd, shared memory, ptrace, bpf, page
  cache eviction or probing, socket families other than Unix and IP, ...);
- a wall-clock timeout that kills the child, which as PID 1 of its namespace takes anything it started with it;
  capped output; the value of `result_var` sent back as `repr()` text on a private pipe and read with
  `ast.literal_eval` (never unpickled), only within `max_value_bytes` characters.

Root without CAP_SYS_ADMIN (a container's default root): the fork server enters a user namespace mapping root and
65534, and gets the same namespaces. Not root: the fork server enters a user namespace (where the kernel allows
unprivileged ones) to get the same namespaces, and the child keeps the caller's uid but drops all capabilities; the
caller's home directory is hidden. Where no user namespace can be had, or libseccomp is missing, the sandbox refuses
to run unless the caller opts in (`TRL_EXT_SANDBOX_ALLOW_UNISOLATED=1` or `SandboxPool(allow_unisolated=True)`), and
then adds what works without (Landlock, the filter with no `socket()`, as root a uid of its own per execution,
non-dumpable host and servers); a `RuntimeWarning` names what is not isolated. `isolation()` reports what is in
effect; docs/design.md#threat-model what each mode isolates.

The interpreter must be readable by uid 65534 when root: see `trl_ext.sandbox.interpreter` (a pyenv or virtualenv
under `/root` is not; the system `python3` or `TRL_EXT_SANDBOX_PYTHON` is used instead).
"""

from __future__ import annotations

from collections.abc import Sequence

from .interpreter import sandbox_interpreter
from .pool import Limits, SandboxPool, default_pool
from .result import ExecutionResult


__all__ = ["ExecutionResult", "SandboxPool", "execute", "execute_many", "isolation", "sandbox_interpreter"]


def execute(
    code: str,
    *,
    result_var: str | None = None,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 1 << 16,
    max_value_bytes: int = 1 << 16,
) -> ExecutionResult:
    """Run `code` in the sandbox and return its `ExecutionResult`; never raises for anything the code does.

    Args:
        code: Python source, executed as `__main__` in a fresh global scope.
        result_var: Name of a global whose value is read back (`repr` in the child, `ast.literal_eval` here); the
            result is not `ok` when it is missing or not a literal.
        timeout_s: Wall-clock limit; the CPU-time limit is `ceil(timeout_s)` seconds.
        memory_mb: Address-space limit of the child (includes the ~20 MB the interpreter itself maps).
        max_output_bytes: Output beyond this kills the snippet ("output too large").
        max_value_bytes: Longest `repr` of the value that is read back, in characters: a longer one is an
            "unreadable result", rejected before the host parses it (parsing costs the host far more memory and time
            than the snippet spent: pass the smallest bound the caller can use).
    """
    limits = Limits(
        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, max_value_bytes=max_value_bytes
    )
    return default_pool().run(code, result_var, limits)


def execute_many(
    codes: Sequence[str],
    *,
    result_var: str | None = None,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_workers: int | None = None,
    max_output_bytes: int = 1 << 16,
    max_value_bytes: int = 1 << 16,
) -> list[ExecutionResult]:
    """`execute` for a batch, on up to `max_workers` fork servers at once (default: one per available CPU core);
    results in the order of `codes`."""
    limits = Limits(
        timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, max_value_bytes=max_value_bytes
    )
    return default_pool().run_many(list(codes), result_var, limits, max_workers)


def isolation() -> dict:
    """What is in effect for the next execution: `mode` ("root", "root (user namespace)", "user namespace" or
    "unisolated (opted in)"), `namespaces`, `uid` the snippets run as (a text naming the range where each execution
    gets its own), `privileges`, `rlimits`, `missing` (what could not be isolated here,
    empty when fully isolated), `memory` (what bounds a snippet's memory), `interpreter` and its `python` version.
    Raises RuntimeError where the sandbox refuses to run (see the module's docstring)."""
    return default_pool().info()
