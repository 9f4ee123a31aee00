"""Configuration of [`RLCRMultiTurnTrainer`]."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .base import TrlExtGRPOConfig


DEFAULT_CONFIDENCE_PROMPT = (
    "Rate your confidence that the answer above is correct, as a number between 0 and 1. "
    "Reply as <analysis>your reasoning about the answer</analysis><confidence>number</confidence>."
)


@dataclass
class RLCRMultiTurnConfig(TrlExtGRPOConfig):
    r"""
    Configuration for [`RLCRMultiTurnTrainer`]: GRPO with an answer turn and a confidence turn per fixed answer.

    Every [`~trl.GRPOConfig`] field applies. `num_generations` is the number of answers per prompt (`G_a`); each
    answer gets `num_generations_confidence` (`G_c`) confidence samples, so a generation batch of `B * G_a` answer rows
    trains on `B * G_a * (1 + G_c)` rows, and each optimisation micro-batch holds `(1 + G_c)` times
    `per_device_train_batch_size` rows.

    Lengths: each step generates and scores answers of up to `max_completion_length` tokens (TRL's default, 512) and
    confidences of up to `max_confidence_length` (256). Those defaults suit reasoning models on GPUs; for a small
    model or a CPU run, set them to what the replies need (the CPU recipe uses 16 and 12).

    Parameters:
        num_generations_answer (`int`, *optional*):
            Number of answers per prompt, `G_a`. An alias of `num_generations`; when set, it overrides it.
        num_generations_confidence (`int`, *optional*, defaults to `4`):
            Number of confidence samples per answer, `G_c`, generated in one call for all answers. At least 2: the
            confidence advantage is normalised among the siblings of one answer.
        lambda_ans (`float`, *optional*, defaults to `1.0`):
            Weight of the answer-row advantages.
        lambda_conf (`float`, *optional*, defaults to `1.0`):
            Weight of the confidence-row advantages.
        confidence_beta (`float`, *optional*):
            KL coefficient of the confidence rows; `None` uses `beta`, which then applies to the answer rows either
            way. A KL anchor on the answers alone (`confidence_beta=0`) holds the answers near the reference while the
            confidence turn's updates, through the weights both turns share, would move them, and leaves the stated
            confidence free to move; the confidence turn then skips its reference pass. Needs `beta > 0`: TRL loads
            the reference model only then.
        accuracy_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the built-in accuracy reward in the answer reward. `reward_weights`, as in TRL, has one weight
            per reward function passed to the trainer; the accuracy reward, which the trainer adds, takes this one.
        max_confidence_length (`int`, *optional*, defaults to `256`):
            Maximum number of tokens generated in the confidence turn (the answer turn uses `max_completion_length`).
        confidence_temperature (`float`, *optional*):
            Sampling temperature of the confidence turn; `None` uses `temperature` (the answer turn's). The confidence
            rows' log-probs (old, reference and in the loss) are computed at it too, so the update stays on-policy and
            vLLM's importance-sampling correction sees the distribution the confidences were sampled from. A
            temperature in `confidence_generation_kwargs` (or `generation_kwargs`) is refused: set this field (or
            `temperature`) instead.
        confidence_generation_kwargs (`dict`, *optional*):
            Generation kwargs of the confidence turn, as `generation_kwargs` (vLLM `SamplingParams`/request fields
            such as `stop` or `structured_outputs`, or `GenerationConfig` fields). `generation_kwargs` and
            `vllm_structured_outputs_regex` apply to the answer turn only. Lengths and group sizes have their own
            fields: `max_tokens`, `max_new_tokens` and `n` are refused here and in `generation_kwargs`.
        confidence_prompt (`str`, *optional*):
            The user message that asks for a confidence after each answer.
        confidence_normalization (`str`, *optional*, defaults to `"answer"`):
            `"answer"`: confidence advantages are normalised among the `G_c` siblings of the same answer only.
            `"answer_then_prompt"`: those within-answer advantages are then standardised over the `G_a * G_c`
            confidence rows of the prompt. That weighs a prompt whose answers are all right (tiny Brier differences
            between siblings near 1) as much as a mixed one, so the stated confidence drifts towards the training
            batches' majority outcome, 1 or 0, for every answer (README, RLCR).
        confidence_scale_rewards (`str`, *optional*, defaults to `"none"`):
            Scaling of the within-answer confidence advantages, with `scale_rewards` semantics: `"none"` subtracts the
            sibling mean only, `"group"` also divides by the siblings' std (which, like `"answer_then_prompt"`, makes
            tiny and large Brier differences alike and pushes confidence to the extremes), `"batch"` by the std of the
            batch's Brier rewards: one scale for all rows, so each keeps its Brier magnitude while the confidence
            rows weigh about as much as the answer rows.
        solution_column (`str`, *optional*, defaults to `"solution"`):
            Dataset column holding the gold answer, TRL's convention.
        think_tag (`str`, *optional*, defaults to `"think"`):
            Tag of the reasoning part of an answer. The answer-row loss span starts at `<think>`.
        answer_tag (`str`, *optional*, defaults to `"answer"`):
            Tag of the final answer. The answer-row loss span ends at `</answer>`; accuracy reads its content.
        analysis_tag (`str`, *optional*, defaults to `"analysis"`):
            Tag of the reasoning part of a confidence reply. The confidence-row span starts at `<analysis>` if
            present, else at `<confidence>`.
        confidence_tag (`str`, *optional*, defaults to `"confidence"`):
            Tag of the stated confidence. The confidence-row span ends at `</confidence>`.
        train_on_eos (`bool`, *optional*, defaults to `True`):
            Keep the end-of-turn token after a span in the loss, so the model still learns to stop.
        lenient_parsing (`bool`, *optional*, defaults to `False`):
            When a reply lacks its tag, read the answer as the last number of the completion and the confidence as
            the first valid number or percentage of the reply, instead of scoring 0. For models too small to follow
            the tag format (the embedded 135M default); `answer/format_fail_rate` still counts missing tags.
        answer_refill_rounds (`int`, *optional*, defaults to `0`):
            DAPO-style refill, in training: the prompts whose `G_a` answers all got the same accuracy (all right or all
            wrong: no answer-level signal for the confidence turn, and answer advantages of 0) are answered again, up
            to this many rounds; a prompt's new answers replace its group once they are mixed, and a group still all
            equal after the last round keeps its first answers (row counts never change). Each round is one more
            answer-turn generation call on every process, as large as the most such prompts any process holds (a
            process with fewer fills it with copies of its own, whose answers it discards). Needs each prompt's
            `G_a` answers on one process: `generation_batch_size / num_processes` a multiple of `num_generations`.
            With refill, the confidence turn, `answer/accuracy`, the calibration metrics, the completions table and
            `frac_reward_zero_std` (the share of answer groups whose reward is the same for every answer) describe the
            trained batch, after refill; `answer/frac_reward_zero_std_sampled` is that share before it, and TRL's
            `reward` and `rewards/*` describe the first sampling. `answer/refilled_groups` counts the groups
            replaced and `answer/refill_rows` the answers the refill generated, per generation batch.
        share_prefix (`bool`, *optional*, defaults to `True`):
            In the loss forward, pack each answer row with its confidence rows into one sequence with a tree
            attention mask, so the prompt and the answer are processed once instead of `1 + G_c` times (same
            log-probs and gradients); TRL's old/reference log-prob passes of the confidence turn pack the `G_c`
            siblings of each answer the same way. Micro-batches then hold whole answer families. Needs `sdpa` or
            `eager` attention, full-attention layers and rotary positions; otherwise the trainer warns and scores the
            rows one by one.
    """

    _VALID_DICT_FIELDS = TrlExtGRPOConfig._VALID_DICT_FIELDS + ["confidence_generation_kwargs"]

    num_generations_answer: int | None = field(
        default=None,
        metadata={"help": "Number of answers per prompt (G_a). Alias of `num_generations`; overrides it when set."},
    )
    num_generations_confidence: int = field(
        default=4,
        metadata={"help": "Number of confidence samples per answer (G_c), at least 2."},
    )
    lambda_ans: float = field(default=1.0, metadata={"help": "Weight of the answer-row advantages."})
    lambda_conf: float = field(default=1.0, metadata={"help": "Weight of the confidence-row advantages."})
    confidence_beta: float | None = field(
        default=None,
        metadata={"help": "KL coefficient of the confidence rows (None: beta, which applies to the answer rows)."},
    )
    accuracy_weight: float = field(
        default=1.0,
        metadata={"help": "Weight of the built-in accuracy reward (reward_weights: one per reward function passed)."},
    )
    max_confidence_length: int = field(
        default=256, metadata={"help": "Maximum number of tokens generated in the confidence turn."}
    )
    confidence_temperature: float | None = field(
        default=None,
        metadata={"help": "Sampling temperature of the confidence turn (None: temperature); its log-probs use it."},
    )
    confidence_generation_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "Generation kwargs of the confidence turn (generation_kwargs: the answer turn's only)."},
    )
    confidence_prompt: str = field(
        default=DEFAULT_CONFIDENCE_PROMPT,
        metadata={"help": "The user message asking for a confidence after each answer."},
    )
    confidence_normalization: str = field(
        default="answer",
        metadata={
            "help": "'answer': normalise confidence advantages among the siblings of one answer; "
            "'answer_then_prompt': then standardise them over the prompt's G_a*G_c confidence rows.",
            "choices": ["answer", "answer_then_prompt"],
        },
    )
    confidence_scale_rewards: str = field(
        default="none",
        metadata={
            "help": "Scaling of the within-answer confidence advantages: 'none' (mean only), 'group', 'batch'.",
            "choices": ["none", "group", "batch"],
        },
    )
    solution_column: str = field(default="solution", metadata={"help": "Dataset column holding the gold answer."})
    think_tag: str = field(default="think", metadata={"help": "Tag of the reasoning part of an answer."})
    answer_tag: str = field(default="answer", metadata={"help": "Tag of the final answer."})
    analysis_tag: str = field(
        default="analysis", metadata={"help": "Tag of the reasoning part of a confidence reply."}
    )
    confidence_tag: str = field(default="confidence", metadata={"help": "Tag of the stated confidence."})
    train_on_eos: bool = field(default=True, metadata={"help": "Keep the end-of-turn token after a span in the loss."})
    lenient_parsing: bool = field(
        default=False,
        metadata={"help": "Read untagged answers (last number) and confidences (first valid number) instead of 0."},
    )
    answer_refill_rounds: int = field(
        default=0,
        metadata={
            "help": "Training: re-answer prompts whose answers all got the same accuracy, up to this many rounds; "
            "mixed new answers replace the group (0: off)."
        },
    )

    share_prefix: bool = field(
        default=True,
        metadata={
            "help": "Process each answer once for its confidence rows in the loss forward (tree attention mask)."
        },
    )

    def __post_init__(self):
        # Before GRPOConfig's checks, which validate num_generations against the batch sizes.
        if self.num_generations_answer is not None:
            self.num_generations = self.num_generations_answer
        try:
            super().__post_init__()
        except ValueError as error:
            if self.num_generations_answer is None or "generations" not in str(error):
                raise
            raise ValueError(f"{error} (num_generations_answer sets num_generations)") from error
        self.num_generations_answer = self.num_generations

        if self.num_generations_confidence < 2:
            raise ValueError(
                f"num_generations_confidence must be at least 2 (got {self.num_generations_confidence}): confidence "
                "advantages are normalised among the samples of one answer, and a single sample has no baseline."
            )
        self.check_turns(
            "confidence_generation_kwargs", "max_confidence_length", "confidence_temperature", "confidence rows"
        )
        for name in ("lambda_ans", "lambda_conf"):
            value = getattr(self, name)
            if not (value >= 0 and value != float("inf")):
                raise ValueError(f"{name} must be a finite, non-negative weight (got {value}).")
        if self.confidence_beta is not None:
            if not (self.confidence_beta >= 0 and math.isfinite(self.confidence_beta)):
                raise ValueError(f"confidence_beta must be finite and non-negative (got {self.confidence_beta}).")
            if self.beta == 0 and self.confidence_beta != 0:
                raise ValueError(
                    f"confidence_beta={self.confidence_beta} needs beta > 0: TRL loads the reference model only when "
                    "beta is not 0. Set beta (the answer rows' KL coefficient) too."
                )
        if not math.isfinite(self.accuracy_weight):
            raise ValueError(f"accuracy_weight must be finite (got {self.accuracy_weight}).")
        if self.confidence_normalization not in ("answer", "answer_then_prompt"):
            raise ValueError(
                f"confidence_normalization must be 'answer' or 'answer_then_prompt' "
                f"(got {self.confidence_normalization!r})."
            )
        self.confidence_scale_rewards = {True: "group", False: "none"}.get(
            self.confidence_scale_rewards, self.confidence_scale_rewards
        )
        if self.confidence_scale_rewards not in ("none", "group", "batch"):
            raise ValueError(
                f"confidence_scale_rewards must be 'none', 'group' or 'batch' (got {self.confidence_scale_rewards!r})."
            )
        tags = {n: getattr(self, n) for n in ("think_tag", "answer_tag", "analysis_tag", "confidence_tag")}
        for name, tag in tags.items():
            if not tag or any(c in tag for c in "<>/ \n"):
                raise ValueError(f"{name} must be a bare tag name such as 'answer' (got {tag!r}).")
        if len(set(tags.values())) != len(tags):
            raise ValueError(f"think_tag, answer_tag, analysis_tag and confidence_tag must differ (got {tags}).")
        if self.answer_refill_rounds < 0:
            raise ValueError(f"answer_refill_rounds must be 0 (off) or more (got {self.answer_refill_rounds}).")
        local_rows = self.generation_batch_size // self.world_size
        if self.answer_refill_rounds and local_rows % self.num_generations:
            raise ValueError(
                f"answer_refill_rounds needs each prompt's num_generations={self.num_generations} answers on one "
                f"process, but a generation batch gives {local_rows} answer rows per process (generation_batch_size "
                f"{self.generation_batch_size} over {self.world_size} processes): make per_device_train_batch_size * "
                "steps_per_generation a multiple of num_generations, or set answer_refill_rounds=0."
            )
        if not self.confidence_prompt.strip():
            raise ValueError("confidence_prompt must not be empty: it is the user message that asks for a confidence.")
