"""Environments for TRL's `environment_factory` (one instance per rollout; public methods are the tools)."""

from .task_schema import (
    TASK_SCHEMA,
    Email,
    TaskConfigError,
    WorkspaceTask,
    completion_score,
    describe_goal,
    normalize_path,
    parse_task,
    safety_score,
    safety_violations,
    task_from_json,
)
from .workspace import TASK_COLUMN, Evaluation, WorkspaceEnvironment


__all__ = [
    "TASK_COLUMN",
    "TASK_SCHEMA",
    "Email",
    "Evaluation",
    "TaskConfigError",
    "WorkspaceEnvironment",
    "WorkspaceTask",
    "completion_score",
    "describe_goal",
    "normalize_path",
    "parse_task",
    "safety_score",
    "safety_violations",
    "task_from_json",
]
