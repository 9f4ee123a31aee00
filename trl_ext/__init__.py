"""trl-ext: reinforcement-learning trainers for LLMs, built as subclasses of TRL's `GRPOTrainer`."""

from .compat import check_trl_version


__version__ = "0.1.0.dev0"

check_trl_version()

# Imported on first use: `import trl_ext` stays cheap and `python -m trl_ext.default_model` runs without a warning.
_LAZY = {"DEFAULT_MODEL_NAME": "default_model", "default_model_path": "default_model"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'trl_ext' has no attribute {name!r}")


__all__ = ["DEFAULT_MODEL_NAME", "__version__", "check_trl_version", "default_model_path"]
