"""Task families for [`AbsoluteZeroTrainer`]'s self-play: proposer prompts, question parsers, solver prompts and
rewards, held-out questions."""

from .arithmetic import arithmetic_task, safe_evaluate
from .base import TaskFamily, TaskState, tagged_question_parser, template_solver_prompt
from .code_reasoning import CodeTaskState, code_reasoning_task
from .workspace import WORKSPACE_CRITERIA, workspace_task


__all__ = [
    "WORKSPACE_CRITERIA",
    "CodeTaskState",
    "TaskFamily",
    "TaskState",
    "arithmetic_task",
    "code_reasoning_task",
    "safe_evaluate",
    "tagged_question_parser",
    "template_solver_prompt",
    "workspace_task",
]
