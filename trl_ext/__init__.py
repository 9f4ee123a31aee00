"""trl-ext: reinforcement-learning trainers for LLMs, built as subclasses of TRL's `GRPOTrainer`.

As with `trl`, the trainers, their configs and the most used helpers are importable from the package itself
(`from trl_ext import RLCRMultiTurnTrainer`). They load on first access (PEP 562), so `import trl_ext` imports neither
torch nor TRL: `python -m trl_ext.models.default_model` and the verifier worker start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .compat import check_trl_version


__version__ = "0.1.0.dev0"

check_trl_version()

# public name -> submodule that defines it
_LAZY = {
    "AbsoluteZeroConfig": "trainers",
    "AbsoluteZeroTrainer": "trainers",
    "RLCRMultiTurnConfig": "trainers",
    "RLCRMultiTurnTrainer": "trainers",
    "ReplayGRPOConfig": "trainers",
    "ReplayGRPOTrainer": "trainers",
    "make_accuracy_reward": "rewards",
    "make_brier_reward": "rewards",
    "make_format_reward": "rewards",
    "verify_answer": "rewards",
    "TaskFamily": "self_play",
    "arithmetic_task": "self_play",
    "code_reasoning_task": "self_play",
    "workspace_task": "self_play",
    "WorkspaceEnvironment": "environments",
    "LLMJudge": "rewards",
    "calibration_report": "evaluation.calibration",
    "expected_calibration_error": "evaluation.calibration",
    "DEFAULT_MODEL_NAME": "models.default_model",
    "default_model_path": "models.default_model",
    "use_tool_chat_template": "models.chat_template",
    "ANSWER_FORMAT": "data.graded_arithmetic",
}

if TYPE_CHECKING:  # static analysers and IDEs see the real objects
    from .data.graded_arithmetic import ANSWER_FORMAT
    from .environments import WorkspaceEnvironment
    from .evaluation.calibration import calibration_report, expected_calibration_error
    from .models.chat_template import use_tool_chat_template
    from .models.default_model import DEFAULT_MODEL_NAME, default_model_path
    from .rewards import LLMJudge, make_accuracy_reward, make_brier_reward, make_format_reward, verify_answer
    from .self_play import TaskFamily, arithmetic_task, code_reasoning_task, workspace_task
    from .trainers import (
        AbsoluteZeroConfig,
        AbsoluteZeroTrainer,
        ReplayGRPOConfig,
        ReplayGRPOTrainer,
        RLCRMultiTurnConfig,
        RLCRMultiTurnTrainer,
    )


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # later accesses skip __getattr__
        return value
    raise AttributeError(f"module 'trl_ext' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ANSWER_FORMAT",
    "DEFAULT_MODEL_NAME",
    "AbsoluteZeroConfig",
    "AbsoluteZeroTrainer",
    "LLMJudge",
    "RLCRMultiTurnConfig",
    "RLCRMultiTurnTrainer",
    "ReplayGRPOConfig",
    "ReplayGRPOTrainer",
    "TaskFamily",
    "WorkspaceEnvironment",
    "__version__",
    "arithmetic_task",
    "calibration_report",
    "check_trl_version",
    "code_reasoning_task",
    "default_model_path",
    "expected_calibration_error",
    "make_accuracy_reward",
    "make_brier_reward",
    "make_format_reward",
    "use_tool_chat_template",
    "verify_answer",
    "workspace_task",
]
