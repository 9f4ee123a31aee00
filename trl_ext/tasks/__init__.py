"""Task families for [`AbsoluteZeroTrainer`]: proposer prompts, question parsers, solver prompts, solver rewards."""

from .arithmetic import arithmetic_task, safe_evaluate
from .base import TaskFamily, tagged_question_parser, template_solver_prompt
from .workspace import workspace_task


__all__ = ["TaskFamily", "arithmetic_task", "safe_evaluate", "tagged_question_parser", "template_solver_prompt",
           "workspace_task"]
