"""Compatibility: the TRL versions trl-ext is tested against (a one-time warning outside them), and the module paths
of earlier releases, which still import.

The trainers subclass `trl.GRPOTrainer` and rely on its private seams (`_generate_single_turn`,
`_generate_and_score_completions`, `_compute_loss`); those change between TRL minors.
"""

import importlib
import importlib.abc
import importlib.metadata
import importlib.util
import sys
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


# Module paths of earlier releases -> where the code lives now. A moved package's submodules follow it
# (`trl_ext.tasks.workspace` -> `trl_ext.self_play.workspace`); the longest matching old path wins.
MOVED_MODULES = {
    "trl_ext.cache": "trl_ext.models.cache",
    "trl_ext.calibration": "trl_ext.evaluation.calibration",
    "trl_ext.curves": "trl_ext.evaluation.curves",
    "trl_ext.data.arithmetic": "trl_ext.data.graded_arithmetic",
    "trl_ext.default_model": "trl_ext.models.default_model",
    "trl_ext.environments.workspace_task": "trl_ext.environments.task_schema",
    "trl_ext.greedy": "trl_ext.evaluation.greedy",
    "trl_ext.rlcr_evaluation": "trl_ext.evaluation.rlcr",
    "trl_ext.tasks": "trl_ext.self_play",
    "trl_ext.tasks.evaluation": "trl_ext.evaluation.solver",
    "trl_ext.tasks.workspace_warmup": "trl_ext.self_play.workspace_warmup",
    "trl_ext.tool_chat_template": "trl_ext.models.chat_template",
    "trl_ext.user_calls": "trl_ext.rewards.user_calls",
    "trl_ext.warmup": "trl_ext.models.warmup",
}
# Names an old module exported that now live in another module.
MOVED_NAMES = {
    "trl_ext.tasks": {"SolverEvaluation": "trl_ext.evaluation.solver", "evaluate_solver": "trl_ext.evaluation.solver"},
    "trl_ext.trainers.absolute_zero_config": {"SEED_CRITERIA": "trl_ext.self_play.workspace:WORKSPACE_CRITERIA"},
}


_LONGEST_FIRST = sorted(MOVED_MODULES, key=len, reverse=True)


def moved_to(old: str) -> str | None:
    """The module an earlier release's module path `old` now resolves to, or `None` if it did not move."""
    for prefix in _LONGEST_FIRST:
        if old == prefix or old.startswith(prefix + "."):
            return MOVED_MODULES[prefix] + old[len(prefix) :]
    return None


def moved_name(module: str, name: str):
    """The object `module.name` of an earlier release, when `name` moved to another module; raises AttributeError."""
    target = MOVED_NAMES.get(module, {}).get(name)
    if target is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    where, _, attribute = target.partition(":")
    warnings.warn(f"{module}.{name} moved to {where}.{attribute or name}.", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(where), attribute or name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as a thin module that forwards every attribute to the module's new home (with a
    `DeprecationWarning` naming it), so `from trl_ext.calibration import ...` keeps working."""

    def find_spec(self, fullname, path=None, target=None):
        new = moved_to(fullname)
        new_spec = importlib.util.find_spec(new) if new is not None else None
        if new_spec is None:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, is_package=new_spec.submodule_search_locations is not None
        )

    def create_module(self, spec):
        return None  # a plain module; `exec_module` fills it

    def exec_module(self, module):
        old = module.__name__
        new = moved_to(old)
        warnings.warn(f"{old} moved to {new}; import it from there.", DeprecationWarning, stacklevel=2)
        target = importlib.import_module(new)

        def forward(name):
            if hasattr(target, name):
                return getattr(target, name)
            return moved_name(old, name)

        module.__getattr__ = forward
        module.__all__ = list(getattr(target, "__all__", [n for n in dir(target) if not n.startswith("_")]))
        if hasattr(target, "__path__"):
            module.__path__ = []  # a package: its submodules resolve through this finder too

    def get_code(self, fullname):
        """`python -m <old path>` runs the new module as `__main__`."""
        return compile(
            f"import runpy; runpy.run_module({moved_to(fullname)!r}, run_name='__main__', alter_sys=True)",
            fullname,
            "exec",
        )


def install_moved_module_aliases() -> None:
    """Let the module paths of earlier releases import (once per interpreter)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
