"""Task families for [`AbsoluteZeroTrainer`]: proposer prompts, question parsers, solver prompts, solver rewards."""

from .arithmetic import arithmetic_task, safe_evaluate
from .base import TaskFamily, TaskState, tagged_question_parser, template_solver_prompt
from .code_reasoning import CodeTaskState, code_reasoning_task
from .evaluation import SolverEvaluation, evaluate_solver
from .workspace import workspace_task


__all__ = ["CodeTaskState", "SolverEvaluation", "TaskFamily", "TaskState", "arithmetic_task", "code_reasoning_task",
           "evaluate_solver", "safe_evaluate", "tagged_question_parser", "template_solver_prompt", "workspace_task"]
