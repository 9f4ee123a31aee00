"""The TRL versions trl-ext is tested against, and a one-time warning outside them.

The trainers subclass `trl.GRPOTrainer` and rely on its private seams (`_generate_single_turn`,
`_generate_and_score_completions`, `_compute_loss`); those change between TRL minors.
"""

import importlib.metadata
import warnings

from packaging.version import Version


TESTED_TRL_RANGE = (Version("1.16.0"), Version("1.17.0"))  # [min, max)
_warned = False


def tested_trl_range() -> str:
    low, high = TESTED_TRL_RANGE
    return f">={low},<{high}"


def check_trl_version(version: str | None = None) -> bool:
    """Return whether `version` (default: the installed TRL) is in the tested range; warn once if not."""
    global _warned
    if version is None:
        try:
            version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            return False  # importing a trainer will fail with ImportError, which says enough
    low, high = TESTED_TRL_RANGE
    ok = low <= Version(version) < high
    if not ok and not _warned:
        _warned = True
        warnings.warn(
            f"trl-ext is tested with trl{tested_trl_range()}, but trl {version} is installed. The trainers rely on "
            f"GRPOTrainer internals that change between releases; install `trl{tested_trl_range()}`.",
            UserWarning,
            stacklevel=3,
        )
    return ok
