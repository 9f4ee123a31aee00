"""Compatibility: the TRL versions trl-ext is tested against, with a one-time warning outside them.

The trainers subclass `trl.GRPOTrainer` and rely on its private seams (`_generate_single_turn`,
`_generate_and_score_completions`, `_compute_loss`); those change between TRL minors.
"""

import importlib
import importlib.metadata
import warnings

from packaging.requirements import Requirement


_warned = False


def tested_trl_range() -> str | None:
    """The TRL versions trl-ext is tested with: the `trl` requirement of its package metadata (setup.cfg pins it to
    the tested minor), or `None` when trl-ext runs from a checkout that was never installed."""
    try:
        requirements = importlib.metadata.requires("trl-ext") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name == "trl" and requirement.marker is None:
            return str(requirement.specifier)
    return None


def check_trl_version(version: str | None = None) -> bool:
    """Return whether `version` (default: the installed TRL) is in the tested range; warn once if not."""
    global _warned
    if version is None:
        try:
            version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            return False  # importing a trainer will fail with ImportError, which says enough
    tested = tested_trl_range()
    ok = tested is None or Requirement(f"trl{tested}").specifier.contains(version, prereleases=True)
    if not ok and not _warned:
        _warned = True
        warnings.warn(
            f"trl-ext is tested with trl{tested}, but trl {version} is installed. The trainers rely on "
            f"GRPOTrainer internals that change between releases; install `trl{tested}`.",
            UserWarning,
            stacklevel=3,
        )
    return ok
