"""Which Python interpreter runs the sandbox's fork server.

As root the snippets run as uid 65534, which must be able to read the interpreter's standard library (a snippet
imports modules after the privilege drop). A virtual environment or a pyenv build under `/root` (mode 0700) is not
readable by that uid, so the candidates are tried in order, each checked by actually running it as uid 65534:
`TRL_EXT_SANDBOX_PYTHON`, the base interpreter the virtual environment was made from, the current interpreter, and
the system's `python3`. The snippets only use the standard library, so any Python >= 3.10 does.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys


ENV_VAR = "TRL_EXT_SANDBOX_PYTHON"
NOBODY = 65534
# What the fork server and its children import: a candidate that cannot do this as uid 65534 is not usable.
_PROBE = (
    "import array, ctypes, json, resource, select, socket, fractions, sys; assert sys.version_info >= (3, 10); "
    "print('ok')"
)


def _candidates() -> list[str]:
    found = []
    if os.environ.get(ENV_VAR):
        found.append(os.environ[ENV_VAR])
    found += [getattr(sys, "_base_executable", sys.executable), sys.executable]
    found += [p for p in (shutil.which("python3", path="/usr/bin:/usr/local/bin:/bin"),) if p]
    unique = []
    for path in found:
        real = os.path.realpath(path)
        if real not in unique:
            unique.append(real)
    return unique


def usable_as(path: str, uid: int) -> bool:
    """Whether `path` runs the fork server's imports as `uid` (checked by running it, so ACLs and modes count)."""
    try:
        done = subprocess.run(
            [path, "-s", "-S", "-c", _PROBE],
            user=uid,
            group=uid,
            extra_groups=[],
            cwd="/",
            env={},
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.strip() == b"ok"


@functools.cache
def sandbox_interpreter() -> str:
    """The interpreter for the fork server: as root, the first candidate usable by uid 65534; otherwise the
    configured or the current one."""
    candidates = _candidates()
    if os.getuid() != 0:
        return candidates[0]
    for path in candidates:
        if usable_as(path, NOBODY):
            return path
    raise RuntimeError(
        f"No Python interpreter usable by uid {NOBODY} (the sandbox's unprivileged user) was found; tried "
        f"{', '.join(candidates)}. A virtual environment or a pyenv build under /root (mode 0700) cannot be read by "
        f"that uid. Install a system Python 3.10+ (e.g. `apt-get install python3`), or make one readable "
        f"(`chmod o+rx` on its directories) and point {ENV_VAR} at it."
    )
