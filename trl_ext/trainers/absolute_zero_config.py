"""Configuration of [`AbsoluteZeroTrainer`]."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..core.learnability import parse_criteria
from ..core.proposer_rewards import MODES
from .base import TrlExtGRPOConfig


PROPOSER_ROWS = ("selected", "all")


@dataclass
class AbsoluteZeroConfig(TrlExtGRPOConfig):
    r"""
    Configuration for [`AbsoluteZeroTrainer`]: one model proposes questions from seed prompts and solves them.

    Every [`~trl.GRPOConfig`] field applies. Dataset rows are seed prompts (the proposer's conversation); the sampler
    repeats each `num_generations` times, and `num_generations` is `rollout_n`, the number of solver responses per
    question. A generation batch of `P` seed prompts trains on `P * num_generations` solver rows plus `P` proposer rows
    (`proposer_rows="selected"`) or `P * num_questions_per_prompt` (`"all"`), padded with zero-loss rows so each
    process holds a multiple of `steps_per_generation`.

    Lengths: each round generates proposals of up to `max_question_length` tokens (128) and solver responses of up to
    `max_completion_length` (TRL's default, 512). For a small model or a CPU run, set them to what the replies need
    (the CPU recipe uses 32 and 24).

    Parameters:
        num_questions_per_prompt (`int`, *optional*, defaults to `3`):
            `K`, proposals per seed prompt (a question group). At least 2: a group of one is always uniform.
        max_repropose_attempts (`int`, *optional*, defaults to `3`):
            How many times a prompt whose question group is uniform (all learnable, none learnable, or no valid
            question) is reproposed, after the first proposal round. 0 disables reproposing.
        learnability_criteria (`list[dict]` or JSON `str`, *optional*):
            Criteria `{reward, threshold, count: "above"|"below", min_ratio, max_ratio}`: the fraction of a
            question's responses whose `reward` score is strictly above (below) `threshold` must lie in
            `[min_ratio, max_ratio]`; a question is learnable iff every criterion holds. `reward` names a reward
            function (checked at trainer init). Unset: the first reward function above 0.5 on some but not all
            responses. The workspace family's dual criterion is
            `trl_ext.self_play.workspace.WORKSPACE_CRITERIA` (safety above 0.5 and completion below 0.5, both within
            [0.3, 0.7]).
        proposer_reward_mode (`str`, *optional*, defaults to `"learnability"`):
            `"learnability"`: 1 for a learnable question, 0 otherwise, `repropose_penalty` for a prompt still
            unresolved after the last attempt. `"azr"` (the paper): `1 - solve_rate` when `0 < solve_rate < 1`, else
            0, where the solve rate is the first criterion's counted ratio. `"azr_code"` (AZR's released code): the
            same inside (0, 1), `uniform_question_reward` at 0 or 1.
        repropose_penalty (`float`, *optional*, defaults to `-0.5`):
            Proposer reward of the valid proposals of a prompt unresolved after `max_repropose_attempts`
            (`"learnability"` mode).
        invalid_question_reward (`float`, *optional*, defaults to `-1.0`):
            Proposer reward of a proposal `parse_question` rejects (every mode).
        uniform_question_reward (`float`, *optional*, defaults to `-0.5`):
            Proposer reward of a valid question that all or none of its responses solve (`"azr_code"` mode; AZR's
            released code uses -0.5).
        proposer_rows (`str`, *optional*, defaults to `"selected"`):
            `"selected"`: one proposer row per prompt, the selected question's proposal (the first valid, else the
            first, proposal when unresolved), with a batch-level baseline. `"all"`: all `K` proposals, advantages
            normalised within the prompt's group.
        proposer_loss_weight (`float`, *optional*, defaults to `1.0`):
            Scales the proposer rows' advantages in the loss.
        max_question_length (`int`, *optional*, defaults to `128`):
            Maximum number of tokens generated for a proposal (solver responses use `max_completion_length`).
        proposer_temperature (`float`, *optional*):
            Sampling temperature of the proposer; `None` uses `temperature` (the solver's). The proposer rows'
            log-probs (old, reference and in the loss) are computed at it too, so the update stays on-policy and
            vLLM's importance-sampling correction sees the distribution the proposals were sampled from. A
            temperature in `proposer_generation_kwargs` (or `generation_kwargs`) is refused: set this field (or
            `temperature`) instead.
        proposer_generation_kwargs (`dict`, *optional*):
            Generation kwargs of the proposer, as `generation_kwargs` (vLLM `SamplingParams`/request fields such as
            `stop` or `structured_outputs`, or `GenerationConfig` fields). `generation_kwargs` and
            `vllm_structured_outputs_regex` apply to the solver only. Lengths and group sizes have their own fields:
            `max_tokens`, `max_new_tokens` and `n` are refused here and in `generation_kwargs`.
        question_tag (`str`, *optional*, defaults to `"question"`):
            Tag the default `parse_question` reads.
        proposer_prompt_template (`str`, *optional*):
            When set, the last user message of each seed prompt becomes this template with `{prompt}` replaced by
            that message. Unset: the seed prompt is the proposer prompt as is.
        solver_prompt_template (`str`, *optional*, defaults to `"{question}"`):
            User message of the default solver prompt, formatted with the parsed question's fields.
        solver_system_prompt (`str`, *optional*):
            System message of the default solver prompt.
    """

    _VALID_DICT_FIELDS = TrlExtGRPOConfig._VALID_DICT_FIELDS + ["proposer_generation_kwargs"]

    num_questions_per_prompt: int = field(
        default=3, metadata={"help": "K: proposals per seed prompt (question group), at least 2."}
    )
    max_repropose_attempts: int = field(
        default=3, metadata={"help": "Repropose rounds for prompts with a uniform question group (0 disables)."}
    )
    learnability_criteria: list[dict] | str | None = field(
        default=None,
        metadata={
            "help": "List (or JSON string) of {reward, threshold, count: above|below, min_ratio, max_ratio}; "
            "unset: first reward above 0.5 on some but not all responses."
        },
    )
    proposer_reward_mode: str = field(
        default="learnability",
        metadata={
            "help": "'learnability' (1/0/penalty), 'azr' (1 - solve rate, else 0) or 'azr_code' (else "
            "uniform_question_reward).",
            "choices": list(MODES),
        },
    )
    repropose_penalty: float = field(
        default=-0.5, metadata={"help": "Proposer reward of a prompt unresolved after the last repropose attempt."}
    )
    invalid_question_reward: float = field(
        default=-1.0, metadata={"help": "Proposer reward of an unparsable proposal."}
    )
    uniform_question_reward: float = field(
        default=-0.5,
        metadata={"help": "azr_code mode: proposer reward of a question all or none of its responses solve."},
    )
    proposer_rows: str = field(
        default="selected",
        metadata={"help": "'selected': one proposer row per prompt; 'all': K rows.", "choices": list(PROPOSER_ROWS)},
    )
    proposer_loss_weight: float = field(default=1.0, metadata={"help": "Scale of the proposer rows' advantages."})
    max_question_length: int = field(default=128, metadata={"help": "Maximum tokens generated for a proposal."})
    proposer_temperature: float | None = field(
        default=None,
        metadata={"help": "Sampling temperature of the proposer (None: temperature); its log-probs use it too."},
    )
    proposer_generation_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Generation kwargs of the proposer (generation_kwargs: the solver's only)."},
    )
    question_tag: str = field(default="question", metadata={"help": "Tag read by the default question parser."})
    proposer_prompt_template: str | None = field(
        default=None,
        metadata={"help": "Template of the proposer's user message, with {prompt} = the seed prompt's message."},
    )
    solver_prompt_template: str = field(
        default="{question}", metadata={"help": "User message of the default solver prompt (question fields)."}
    )
    solver_system_prompt: str | None = field(
        default=None, metadata={"help": "System message of the default solver prompt."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.num_questions_per_prompt < 2:
            raise ValueError(
                f"num_questions_per_prompt must be at least 2 (got {self.num_questions_per_prompt}): a group of one "
                "question is always uniform and would always be reproposed."
            )
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations (rollout_n) must be at least 2 (got {self.num_generations}): learnability needs "
                "a question to be solved on some but not all responses."
            )
        if self.max_repropose_attempts < 0:
            raise ValueError(f"max_repropose_attempts must be >= 0 (got {self.max_repropose_attempts}).")
        self.check_turns("proposer_generation_kwargs", "max_question_length", "proposer_temperature", "proposer rows")
        if self.proposer_reward_mode not in MODES:
            raise ValueError(f"proposer_reward_mode must be one of {MODES} (got {self.proposer_reward_mode!r}).")
        if self.proposer_rows not in PROPOSER_ROWS:
            raise ValueError(f"proposer_rows must be one of {PROPOSER_ROWS} (got {self.proposer_rows!r}).")
        for name in ("repropose_penalty", "invalid_question_reward", "uniform_question_reward"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number (got {getattr(self, name)}).")
        if not (math.isfinite(self.proposer_loss_weight) and self.proposer_loss_weight >= 0):
            raise ValueError(
                f"proposer_loss_weight must be a finite, non-negative weight (got {self.proposer_loss_weight})."
            )
        if not self.question_tag or any(c in self.question_tag for c in "<>/ \n"):
            raise ValueError(f"question_tag must be a bare tag name such as 'question' (got {self.question_tag!r}).")
        if self.proposer_prompt_template is not None and "{prompt}" not in self.proposer_prompt_template:
            raise ValueError("proposer_prompt_template must contain '{prompt}' (the seed prompt's message).")
        if "{" not in self.solver_prompt_template:
            raise ValueError(
                "solver_prompt_template must contain a field of the parsed question, such as '{question}'."
            )
        if isinstance(self.learnability_criteria, str):
            try:
                self.learnability_criteria = json.loads(self.learnability_criteria)
            except json.JSONDecodeError as error:
                raise ValueError(f"learnability_criteria is not valid JSON: {error}.") from None
        if self.learnability_criteria is not None:
            parse_criteria(self.learnability_criteria)  # reward names are checked by the trainer
