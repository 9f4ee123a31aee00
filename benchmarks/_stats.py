"""Intervals, provenance and question de-duplication shared by the replay and Absolute Zero benchmarks."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def bootstrap_interval(values, statistic=np.mean, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """Percentile bootstrap 95% interval of `statistic` over `values` (resampled with replacement, fixed rng):
    `{"value", "low", "high", "n"}`. `None` values (not judged) are left out."""
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return {"value": None, "low": None, "high": None, "n": 0}
    rng = np.random.default_rng(seed)
    samples = data[rng.integers(0, data.size, size=(resamples, data.size))]
    stats = np.apply_along_axis(statistic, 1, samples)
    low, high = np.percentile(stats, [2.5, 97.5])
    return {"value": float(statistic(data)), "low": float(low), "high": float(high), "n": int(data.size)}


def paired_difference_interval(a, b, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED):
    """Bootstrap 95% interval of mean(a) - mean(b) over paired items (the same questions answered by two runs)."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
    return bootstrap_interval([x - y for x, y in pairs], resamples=resamples, seed=seed)


_COMMUTATIVE = re.compile(r"^\s*(-?\d+)\s*([+*])\s*(-?\d+)\s*$")


def normalized_question(text: str) -> str:
    """A question with whitespace collapsed and the operands of a lone `a + b` or `a * b` sorted, so that "3+4",
    "3 + 4" and "4 + 3" are one question. Other expressions keep their order (only whitespace is normalised)."""
    text = " ".join(text.split())
    body = text.removeprefix("What is ").removesuffix("?")
    match = _COMMUTATIVE.match(body)
    if match:
        left, op, right = match.groups()
        left, right = sorted((left, right), key=int)
        body = f"{left} {op} {right}"
    return body.replace(" ", "")


def provenance(seeds) -> dict:
    """What produced a result: commit, package versions, device, command line, seeds."""
    root = Path(__file__).resolve().parent.parent

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    packages = {}
    for name in ("torch", "transformers", "trl", "datasets", "accelerate", "peft", "numpy", "trl-ext"):
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores visible)"
    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "git_modified_files": [line.split(maxsplit=1)[1] for line in status.splitlines()] if status else [],
        "packages": packages,
        "python": platform.python_version(),
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "seeds": list(seeds),
    }
