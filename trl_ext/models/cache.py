"""Checkpoints built once and reused: the embedded default model and the format warm-ups built from it.

A cached build is a directory under [`cache_root`] that holds a completion marker. It is built into a temporary
directory beside it, under a file lock, and renamed into place, so concurrent callers (the ranks of a `torchrun` job,
parallel test workers, two recipes started together) build it once and never see half a checkpoint.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


COMPLETE_MARKER = ".trl_ext_complete"


def cache_root() -> Path:
    """Where built checkpoints live: `$TRL_EXT_CACHE`, else `$XDG_CACHE_HOME/trl_ext`, else `~/.cache/trl_ext`."""
    if os.environ.get("TRL_EXT_CACHE"):
        return Path(os.environ["TRL_EXT_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "trl_ext"


def is_built(target: str | os.PathLike) -> bool:
    return (Path(target) / COMPLETE_MARKER).is_file()


def build_once(target: str | os.PathLike, build: Callable[[Path], None], marker: str, announce: str) -> str:
    """Return `target`, calling `build(tmp_dir)` first unless a complete build is already there.

    `build` writes the checkpoint into an empty directory; `marker` (text) is written into its completion marker
    and `announce` printed to stderr when the build starts. A build that raises leaves nothing behind.
    """
    target = Path(target)
    if is_built(target):
        return str(target)
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if is_built(target):  # another process built it while we waited
            return str(target)
        print(announce, file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            build(tmp)
            (tmp / COMPLETE_MARKER).write_text(marker)
            if target.exists():  # leftover of an interrupted build from before the marker existed
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(target)


def read_marker(path: str | os.PathLike) -> str | None:
    """The completion marker's text of a cached build at `path`, `None` if it is not one."""
    try:
        return (Path(path) / COMPLETE_MARKER).read_text()
    except OSError:
        return None
