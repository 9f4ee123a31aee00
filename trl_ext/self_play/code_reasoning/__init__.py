"""Absolute Zero's code reasoning family: deduction, abduction and induction over model-written Python programs,
checked by execution in the sandbox (`trl_ext.sandbox`)."""

from .family import (
    TASK_TYPES,
    ZERO_TRIPLET,
    CodeTaskState,
    code_reasoning_task,
    make_correctness_reward,
    make_format_reward,
    make_proposal_parser,
    seed_prompts,
    solver_prompt,
)


__all__ = [
    "TASK_TYPES",
    "ZERO_TRIPLET",
    "CodeTaskState",
    "code_reasoning_task",
    "make_correctness_reward",
    "make_format_reward",
    "make_proposal_parser",
    "seed_prompts",
    "solver_prompt",
]
