"""Absolute Zero self-play: one model proposes questions from seed prompts and solves them.
Design: docs/design.md#absolutezerotrainer.

Per seed prompt, a group of `K` proposals is generated and parsed; every valid question is solved `rollout_n` times;
a question is learnable when its responses' reward scores meet `learnability_criteria`. Prompts whose group is
uniform are reproposed (only those, up to `max_repropose_attempts`). One learnable question per prompt is drawn, and
its solver rows train together with proposer rows in one update.

Generation goes through TRL's `_generate` (hence `_generate_single_turn`: vLLM server/colocate or transformers), and
rewards through TRL's `_calculate_rewards`. Those are collectives under vLLM server mode and multi-process training,
so the rounds are decided on gathered data: every process makes the same calls with the same row counts, padding
with copies of a real row when it has less work. Once the rows are chosen, each row kind's batch is built by
`GRPOTrainer._generate_and_score_completions` itself, replaying the recorded generations and rewards (see
`_replayed`), so old/ref log-probs, vLLM importance sampling, solver advantages, logging and the completions table
are TRL's. The trainer then sets the proposer advantages and the loss masks, and concatenates the two batches.

Tools and environments (`tools`, `environment_factory`) belong to the solver. Proposer generation runs with them
switched off (no tool schema in its prompts, no environment, no tool loop). A solving round runs the start of TRL's own
`_generate_and_score_completions` up to its `_generate` call (`_episodes`): TRL draws one environment per row, calls
`reset(**row)` with the solver input row and runs its tool loop; the round then scores the rows while their
environments are live, and the final batch replays those recorded scores with the recorded `tool_mask`.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import gather_object

from ..core.advantages import batch_baseline_advantages, group_advantages
from ..core.learnability import (
    counted_ratio,
    default_criteria,
    is_learnable,
    needs_repropose,
    parse_criteria,
    select_question,
)
from ..core.model_text import neutralize_prompt
from ..core.proposer_rewards import padded_rows, proposer_rewards
from ..evaluation.heldout_metrics import accuracy_by_field, sample_accuracy
from ..rewards.parsing import completion_text
from ..rewards.user_calls import UserCallGuard
from ..self_play.base import plain_text_prompts, tagged_question_parser, template_fields, template_solver_prompt
from .absolute_zero_config import AbsoluteZeroConfig
from .base import TrlExtGRPOTrainer
from .seams.call_record import GenerateOutput
from .seams.context_limit import VLLMContextLimit
from .seams.heldout import nan_to_none
from .seams.init_checks import (
    check_conversational_prompts,
    check_not_empty,
    checked_args,
    refuse_rollout_func,
    user_message_prompts,
)
from .seams.model_card import arxiv_paper
from .seams.row_batches import KIND_KEY, concat_row_kinds, local_rows, process_share, restrict_loss
from .seams.row_kind_forwards import ForwardRows, KindCall, RowKindForwards
from .seams.scoping import scoped_call
from .seams.tool_rounds import CollectiveToolRounds


logger = logging.getLogger(__name__)

SOLVER, PROPOSER = 0, 1  # row kinds
# Keyword arguments TRL passes to reward functions itself (and the prompt, which the solver prompt replaces), and
# `environment`, with which a seed row picks one of several environments (a proposal must not choose it).
_RESERVED = {
    "prompt",
    "prompts",
    "completion",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
    "environment",
}

PAPER = arxiv_paper(  # the paper the model card cites
    "zhao2025absolute",
    "Absolute Zero: Reinforced Self-play Reasoning with Zero Data",
    "Andrew Zhao and Yiran Wu and Yang Yue and Tong Wu and Quentin Xu and Matthieu Lin and Shenzhi Wang and Qingyun Wu and Zilong Zheng and Gao Huang",
    2025,
    "2505.03335",
)


class _EpisodesGenerated(Exception):  # a control-flow signal, not an error
    """Carries `_generate`'s output out of `GRPOTrainer._generate_and_score_completions` (see `_episodes`)."""

    def __init__(self, output):
        super().__init__()
        self.output = output


@dataclass
class _Generated:
    """One generated row, as every process sees it after gathering."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None
    completion: Any  # TRL's decoded completion (a message list for conversational prompts)
    tool_mask: list[int] | None = None  # TRL's: 0 on tool-output tokens (episodes with tools), else None


@dataclass
class _Group:
    """The latest question group of one seed prompt."""

    prompt: list = field(default_factory=list)  # the proposer conversation of this round
    context: dict = field(default_factory=dict)  # the TaskState's context of that prompt (e.g. task_type)
    proposals: list[_Generated] = field(default_factory=list)
    questions: list[dict | None] = field(default_factory=list)  # None: invalid proposal
    solver_inputs: dict[int, dict] = field(default_factory=dict)  # proposal index -> reward-function input row
    responses: dict[int, list[_Generated]] = field(default_factory=dict)  # proposal index -> rollout_n responses
    rewards: dict[int, torch.Tensor] = field(default_factory=dict)  # proposal index -> (rollout_n, num_rewards)
    learnable: list[bool | None] = field(default_factory=list)
    solve_rates: list[float | None] = field(default_factory=list)
    rounds: int = 0


@dataclass
class _SelfPlay:
    """One generation batch of self-play, filled in by its steps; identical on every process."""

    seeds: list[dict]  # the gathered seed rows, one per prompt
    group_size: int  # solver responses per question (rollout_n)
    groups: list[_Group]  # per seed prompt
    valid_questions: list[dict] = field(default_factory=list)  # every round's, in order: the task state's update
    reproposed: set[int] = field(default_factory=set)  # prompts that needed another round
    attempts: int = 0  # prompts reproposed, summed over rounds
    selected: list[int | None] = field(default_factory=list)  # per prompt, the trained question (None: unresolved)
    proposer_rewards: list[list[float]] = field(default_factory=list)  # per prompt, per proposal
    generation_calls: int = 0
    generated: defaultdict = field(default_factory=lambda: defaultdict(int))  # "<kind>_rows", "<kind>_tokens"
    missing_fields: int = 0  # valid questions lacking a field of the solver prompt template


HELDOUT_FIELDS = ("task_type", "level")  # question fields the held-out accuracy is broken down by, when present


class AbsoluteZeroTrainer(
    RowKindForwards,
    CollectiveToolRounds,
    VLLMContextLimit,
    TrlExtGRPOTrainer,
):
    """One model as proposer and solver, with a learnability filter, reproposing and a joint update.

    Overrides from [`~trl.GRPOTrainer`]: `_generate_and_score_completions` (the self-play rounds on gathered data,
    then TRL's own method once per row kind, replaying the recorded rows and rewards, and the joined batch) and
    `_compute_loss` (proposer rows weighted, rows without loss skipped, then TRL's loss); for one call each,
    `_generate` and `_calculate_rewards` (recorded rows and rewards) and `_generate` again to end a solving round's
    episodes once TRL has run them. Through its seams: `_get_per_token_logps_and_entropies` (`RowKindForwards`: one
    forward per row kind at its temperature), the tool loop in step across processes (`CollectiveToolRounds`) and
    `_generate_single_turn` (`VLLMContextLimit`); the base adds checkpoints, model cards, held-out evaluation and
    generation-backend handling (`TrlExtGRPOTrainer`). Inherited unchanged: generation on every backend, tool
    episodes, old and reference log-probs, solver rewards and group advantages, vLLM importance sampling, the loss of
    every `loss_type`, logging and the completions table.

    Args:
        model: As [`~trl.GRPOTrainer`].
        reward_funcs: Solver reward functions in TRL's signature. The parsed question's fields arrive as columns
            (e.g. the gold `solution`), with the seed row's other columns; with an environment, `environments=` holds
            each row's live instance. Their names (and an environment's `get_reward` column, named after its class)
            are what `learnability_criteria` refer to. May be omitted when the environment defines `get_reward`.
        args: An [`AbsoluteZeroConfig`].
        parse_question: `f(proposal_text) -> dict | None`; `None` marks an invalid proposal. Defaults to the content
            of `<question_tag>` as `{"question": ...}`. An exception counts as an invalid proposal: its first
            traceback is logged once, and `errors/parse_question` counts them per step.
        solver_prompt_fn: `f(question_fields, seed_row) -> conversation`. Defaults to `solver_prompt_template` (and
            `solver_system_prompt`) formatted with the question's fields; a template field that the parser declares
            it never produces (`parse_question.question_fields`) fails at init, one a question lacks renders empty
            with a one-time warning naming it (`warnings/solver_prompt_missing_fields` counts such questions). An
            exception makes the question invalid (first traceback logged once, `errors/solver_prompt_fn` counts).
            The question fields are model-written: special-token strings in the conversation it returns are made
            plain text (`trl_ext.self_play.base.plain_text_prompts`), as they are in a `task_state`'s proposer prompts.
        heldout_questions: A family's held-out solver questions (`TaskFamily.heldout_questions`, called as
            `f(None, args.seed)`, or the list it returns): the evaluation set when no `eval_dataset` is given.
        task_state: A family's [`~trl_ext.self_play.TaskState`] (e.g. the code family's triplet buffer): proposer prompts
            are built from it, parsed proposals are validated through it (each process its share, verdicts
            gathered), each training batch's valid questions update it, and it is saved in every checkpoint
            (`absolute_zero_state.json`) and restored on resume.
        **kwargs: `train_dataset` (seed prompts: a `prompt` column, conversations or plain text taken as one user
            message), `eval_dataset` (held-out solver
            questions: each row the fields of a validated proposal, gold included, as `heldout_questions` gives them;
            `evaluate()` logs TRL's evaluation loss and metrics of the solver's sampled groups on them, and answers
            them with the solver's settings: the first reward's mean as `accuracy`, with mean@k, pass@k and
            `accuracy/task_type_<t>`, `accuracy/level_<l>`),
            `processing_class`, `reward_processing_classes`, `callbacks`, `optimizers`, `peft_config`, as
            [`~trl.GRPOTrainer`]; `tools` and `environment_factory` (a callable or a dict of them, as
            [`~trl.GRPOTrainer`]) for the solver: each solver rollout gets its own environment, reset with the solver
            input row (`reset(**row)`: the seed row's columns, the parsed question's fields and the solver `prompt`),
            and runs as a multi-step episode in TRL's tool loop. Proposer generation never sees tools. A dict factory
            picks the environment from the seed row's `environment` column. `rollout_func` is not supported.

    Batch rows (per process): the solver rows, in the order of the seed rows received (rollout_n per prompt), then
    the proposer rows with zero-loss padding; the row kind is in `row_kind` (0 solver, 1 proposer), and `tool_mask` zeroes
    the loss of tool-output tokens (TRL's), of unresolved prompts' solver rows and of padding rows.

    Scores that need the live environment (`get_reward`, reward functions reading `environments`) are computed in the
    solving round that ran the episode, like every solver reward, and the final batch replays the recorded values.
    """

    ROW_KINDS = (SOLVER, PROPOSER)  # scored one forward each in the loss (`RowKindForwards`)

    _tag_names = ["trl", "grpo", "trl-ext", "absolute-zero", "self-play"]
    checkpoint_state_name = "absolute_zero_state"
    _name = "Absolute Zero"
    _paper = PAPER

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: AbsoluteZeroConfig | None = None,
        parse_question=None,
        solver_prompt_fn=None,
        task_state=None,
        heldout_questions=None,
        **kwargs,
    ):
        args = checked_args(args, AbsoluteZeroConfig, "AbsoluteZero")
        refuse_rollout_func(
            kwargs,
            "AbsoluteZeroTrainer",
            "it generates both row kinds itself (propose, solve, "
            "repropose), and a rollout_func would replace that generation for the proposer as well. "
            "For multi-step solver episodes pass `environment_factory` or `tools`, which run inside "
            "TRL's generation.",
        )
        if not reward_funcs and kwargs.get("environment_factory") is None:
            raise ValueError(
                "reward_funcs must hold at least one solver reward function (e.g. a numeric match), unless an "
                "environment_factory whose environment defines `get_reward` scores the solver."
            )
        kwargs["train_dataset"] = user_message_prompts(kwargs.get("train_dataset"))  # plain text: one user message
        check_conversational_prompts(
            kwargs.get("train_dataset"),
            "train_dataset",
            required={"prompt": "it must hold the seed prompts"},
            why="the proposer and solver prompts go through the chat template",
        )
        if kwargs.get("eval_dataset") is None and heldout_questions is not None:
            questions = heldout_questions(None, args.seed) if callable(heldout_questions) else heldout_questions
            kwargs["eval_dataset"] = [dict(question) for question in questions]
        _check_heldout_questions(kwargs.get("eval_dataset"))
        with scoped_call(args, generation_kwargs=None):  # they are the solver's: applied per row kind below
            super().__init__(model, reward_funcs=reward_funcs, args=args, **kwargs)
        self._set_turns("solver", "proposer", PROPOSER, args.proposer_generation_kwargs, self._proposer_temperature)
        # The proposer rows' call of TRL's batch code: recorded proposals, one row a group, a given reward (no
        # generation, no reward function: `_replayed` hands TRL the recorded rows and the proposer rewards)
        self._proposer = KindCall(
            prefix="proposer",
            group_size=1,
            reward_func_names=[args.proposer_reward_mode],
            temperature=self._proposer_temperature,
        )

        self.parse_question = parse_question or tagged_question_parser(args.question_tag)
        self.solver_prompt_fn = plain_text_prompts(  # proposals are model-written, the user's function too gets them
            solver_prompt_fn or template_solver_prompt(args.solver_prompt_template, args.solver_system_prompt)
        )
        self._calls = {
            "parse_question": UserCallGuard("parse_question", "the proposal counts as invalid"),
            "solver_prompt_fn": UserCallGuard("solver_prompt_fn", "the question counts as invalid"),
        }
        # The template's fields, to warn about those a question lacks (None: a custom solver_prompt_fn).
        self._template_fields = None if solver_prompt_fn is not None else template_fields(args.solver_prompt_template)
        known = getattr(self.parse_question, "question_fields", None)
        if self._template_fields is not None and known is not None and not self._template_fields <= set(known):
            raise ValueError(
                f"solver_prompt_template names {sorted(self._template_fields - set(known))}, which parse_question "
                f"never produces (its fields: {sorted(known)}); fix the template."
            )
        self._warned_fields = set()
        if args.learnability_criteria is not None:
            self._criteria = parse_criteria(args.learnability_criteria)
            unknown = [c.reward for c in self._criteria if c.reward not in self.reward_func_names]
            if unknown:
                raise ValueError(
                    f"learnability_criteria name reward(s) {unknown} that are not among the reward functions "
                    f"{self.reward_func_names}; use one of those names (a function's __name__)."
                )
        else:
            self._criteria = None  # `default_criteria` for the group size
        self.task_state = task_state
        self._draw = (None, 0)  # (global step, draws at that step): seeds the question selection

    @property
    def _proposer_temperature(self) -> float:
        """The proposer's sampling temperature, at which its rows are scored too."""
        temperature = self.args.proposer_temperature
        return self.temperature if temperature is None else temperature

    # -- held-out evaluation (trainers/seams/heldout.py) -------------------------------------------------------------------
    def _heldout_records(self, rows, num_samples):
        """The solver answers each held-out question `num_samples` times (its prompt from `solver_prompt_fn` with an
        empty seed row, its generation settings and length); the first reward function scores each answer (`None`:
        not scorable, counted) and the reply's text."""
        prompts = [self.solver_prompt_fn(dict(row), {}) for row in rows]
        samples = self._heldout_samples(rows, prompts, num_samples, self._generation["solver"])
        replies = [c[0].get("content") if isinstance(c, list) else c for c in samples.completions]
        return [
            {"score": nan_to_none(value), "reply": reply}
            for value, reply in zip(samples.rewards[:, 0].tolist(), replies, strict=True)
        ]

    def _heldout_metrics(self, rows, records):
        k = len(records) // len(rows)
        scores = [record["score"] for record in records]
        metrics = sample_accuracy([scores[i * k : (i + 1) * k] for i in range(len(rows))])
        metrics.update(accuracy_by_field(scores, [row for row in rows for _ in range(k)], HELDOUT_FIELDS))
        return metrics

    def _compute_loss(self, model, inputs):
        # TRL's loss over the micro-batch's solver and proposer rows, with two changes: the proposer rows' weight and
        # the forward (one per row kind, rows without loss skipped).
        # Proposer rows are weighted here rather than in the batch, so logged advantages stay comparable per kind.
        advantages = torch.nan_to_num(inputs["advantages"], nan=0.0)  # (B,), or (B, T) with per-token advantages
        if KIND_KEY in inputs:
            weight = torch.where(inputs[KIND_KEY] == PROPOSER, self.args.proposer_loss_weight, 1.0)
            advantages = advantages * (weight if advantages.dim() == 1 else weight.unsqueeze(1)).to(advantages.dtype)
        # A batch holds rows trained at zero loss (an unresolved prompt's solver rows, the proposer padding rows; see
        # `_solver_batch`) and pads solver and proposer rows to the longer of the two: the loss forward skips the
        # former (log-probs 0; their loss is 0 either way and every normalisation counts the same rows and tokens)
        # and trims each kind's live rows to their own padding (`RowKindForwards`).
        loss_mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)  # (B, T)
        kinds = inputs.get(KIND_KEY)
        if kinds is None:  # TRL's evaluation loop: solver rows only
            kinds = torch.full((loss_mask.size(0),), SOLVER)
        with scoped_call(self, _forward_rows=ForwardRows(kinds, scored=loss_mask.sum(-1) > 0)):
            return super()._compute_loss(model, {**inputs, "advantages": advantages})

    def _replayed(self, rows: list[_Generated], rewards: torch.Tensor) -> dict:
        """Attributes that make TRL's `_generate` and `_calculate_rewards` return recorded rows (this process's) and
        rewards (gathered, all processes), so `_generate_and_score_completions` builds the batch without generating.

        No environment is drawn or reset and no tool runs: the episodes are over, their scores recorded."""
        logprobs = [r.logprobs for r in rows]
        tool_mask = None
        if any(r.tool_mask is not None for r in rows):
            tool_mask = [r.tool_mask if r.tool_mask is not None else [1] * len(r.completion_ids) for r in rows]
        generation = GenerateOutput(
            prompt_ids=[r.prompt_ids for r in rows],
            completion_ids=[r.completion_ids for r in rows],
            tool_mask=tool_mask,
            completions=[r.completion for r in rows],
            logprobs=None if any(lp is None for lp in logprobs) else logprobs,
            extra_fields={},
            images=None,
            tool_images=[],
        )
        rewards = rewards.to(self.accelerator.device)
        return {
            "_generate": lambda prompts: tuple(generation),
            "_calculate_rewards": lambda *args: rewards,
            **self._no_tools(),
        }

    def _no_tools(self) -> dict:
        """Attributes that switch TRL's tools and environments off for one call (proposer rows, replayed batches)."""
        return {"tools": [], "environment_factories": None, "environments": None}

    def _episodes(self, inputs: list[dict]):
        """`_generate`'s output for solver `inputs` (this process's), generated the way GRPOTrainer does it.

        With an environment, TRL draws one instance per row, resets it with the row and runs the tool loop in the
        first part of `_generate_and_score_completions`, before its `_generate` call; that part is not a method of
        its own. It runs here up to that call, which hands its output back by exception, so the log-prob passes and
        scoring that follow are skipped. `self.environments` keeps the live instances for the round's rewards.
        """
        generate = self._generate

        def generate_then_stop(prompts):
            raise _EpisodesGenerated(generate(prompts))

        with scoped_call(self, _generate=generate_then_stop):
            try:
                super()._generate_and_score_completions(inputs)
            except _EpisodesGenerated as generated:
                return generated.output
        raise RuntimeError("GRPOTrainer._generate_and_score_completions returned without calling _generate.")

    # -- generation rounds -------------------------------------------------------------------------------------------
    def _generate_rows(
        self,
        play: _SelfPlay,
        prompts: list,
        *,
        group_size: int,
        prefix: str | None = None,
        max_new_tokens: int | None = None,
        inputs: list[dict] | None = None,
    ) -> list[_Generated]:
        """One `_generate` call on this process's rows; returns every process's rows, in process order.

        Proposer rows (`inputs` None) are generated from `prompts` without tools; solver rows run as episodes of
        their input rows (`_episodes`)."""
        generation = self._generation["proposer" if inputs is None else "solver"]
        with scoped_call(
            self,
            mode="train",
            prefix=prefix,
            max_new_tokens=max_new_tokens,
            generation=generation,
            num_generations=group_size,
            num_generations_eval=group_size,
        ):
            if inputs is None:
                with scoped_call(self, **self._no_tools()):
                    output = self._generate(prompts)
            else:
                output = self._episodes(inputs)
        output = GenerateOutput(*output)
        logprobs = output.logprobs or [None] * len(prompts)
        tool_mask = output.tool_mask or [None] * len(prompts)
        local = [
            _Generated(list(map(int, p)), list(map(int, c)), lp, comp, None if tm is None else list(map(int, tm)))
            for p, c, lp, comp, tm in zip(
                output.prompt_ids, output.completion_ids, logprobs, output.completions, tool_mask, strict=True
            )
        ]
        rows = gather_object(local)
        play.generation_calls += 1
        play.generated[f"{prefix or 'solver'}_rows"] += len(rows)
        play.generated[f"{prefix or 'solver'}_tokens"] += sum(len(r.completion_ids) for r in rows)
        return rows

    def _proposer_prompt(self, seed_row, rng: random.Random | None) -> tuple[list, dict]:
        """The proposer conversation of a seed row and its context: from the task state when there is one."""
        if self.task_state is not None:
            prompt, context = self.task_state.proposer_prompt(seed_row, rng)
            return neutralize_prompt(prompt), dict(context)  # built from earlier model-written proposals
        prompt = seed_row["prompt"]
        template = self.args.proposer_prompt_template
        if template is None:
            return prompt, {}
        *messages, last = prompt
        return [*messages, {**last, "content": template.replace("{prompt}", completion_text([last]))}], {}

    def _parse(self, completion, context: dict | None = None) -> dict | None:
        # A parser that raises on model output must not stop training: an invalid proposal, logged and counted.
        question, _ = self._calls["parse_question"](self.parse_question, completion_text(completion))
        if not isinstance(question, dict):
            return None
        # Fields become reward-function keyword arguments: a model-written name must not collide with TRL's own.
        question = {
            k: v for k, v in question.items() if isinstance(k, str) and k.isidentifier() and k not in _RESERVED
        }
        return {**question, **(context or {})} if question else None  # the model cannot overwrite the context

    def _task_state_verdicts(self, slots: list[tuple[int, int]], groups: list[_Group]) -> None:
        """Task-state validation of the parsed questions at `slots`: each process checks a contiguous share and the
        verdicts are gathered, so every process holds the same questions without running all the checks. (Running
        everything on every process would cost `world` times the executions, and a check near a time limit could
        pass on one process and fail on another, splitting the decisions.)"""
        share, num_real = process_share(self.accelerator, slots)
        mine = share[:num_real]
        checked = self.task_state.validate([groups[p].questions[i] for p, i in mine])
        if len(checked) != len(mine):
            raise RuntimeError(f"TaskState.validate returned {len(checked)} verdicts for {len(mine)} questions.")
        checked = gather_object([q if isinstance(q, dict) and q else None for q in checked])
        for (p, i), question in zip(slots, checked, strict=True):
            groups[p].questions[i] = question

    # -- the self-play round: propose, validate, solve, estimate learnability ---------------------------------------
    def _round(self, play: _SelfPlay, pending: list[int]) -> None:
        """One round for the `pending` prompts: a fresh group of proposals each, every valid question solved, each
        question's learnability judged from its responses' rewards."""
        self._propose(play, pending)
        valid = self._validate(play, pending)
        if valid:
            self._solve(play, valid)
        self._estimate_learnability(play, pending)

    def _propose(self, play: _SelfPlay, pending: list[int]) -> None:
        """`num_questions_per_prompt` proposals for each pending prompt, from a proposer prompt built afresh."""
        args, k = self.args, self.args.num_questions_per_prompt
        groups = play.groups
        rng = self._selection_rng() if self.task_state is not None else None  # the same prompts on every process
        for p in pending:
            group = groups[p] = _Group(rounds=groups[p].rounds + 1)
            group.prompt, group.context = self._proposer_prompt(play.seeds[p], rng)
        share, _ = process_share(self.accelerator, pending)
        prompts = [groups[p].prompt for p in share for _ in range(k)]
        proposals = self._generate_rows(
            play, prompts, group_size=k, prefix="proposer", max_new_tokens=args.max_question_length
        )
        for j, p in enumerate(pending):  # the padding copies come after the real prompts
            groups[p].proposals = proposals[j * k : (j + 1) * k]

    def _validate(self, play: _SelfPlay, pending: list[int]) -> list[tuple[int, int]]:
        """Parse the pending prompts' proposals into questions, have the task state check them, and build each valid
        question's solver input; returns the valid questions' `(prompt, proposal)` slots (an invalid one is None)."""
        groups = play.groups
        for p in pending:
            groups[p].questions = [self._parse(row.completion, groups[p].context) for row in groups[p].proposals]
        valid = [(p, i) for p in pending for i, q in enumerate(groups[p].questions) if q is not None]
        if self.task_state is not None and valid:
            self._task_state_verdicts(valid, groups)
            valid = [(p, i) for p, i in valid if groups[p].questions[i] is not None]
        if not valid:
            return valid
        columns = sorted({key for p, i in valid for key in groups[p].questions[i]})
        for p, i in valid:
            fields = {key: groups[p].questions[i].get(key) for key in columns}
            row = {key: value for key, value in play.seeds[p].items() if key != "prompt"}
            play.missing_fields += self._check_template_fields(groups[p].questions[i])
            prompt, ok = self._calls["solver_prompt_fn"](self.solver_prompt_fn, fields, play.seeds[p])
            if ok:
                groups[p].solver_inputs[i] = {**row, **fields, "prompt": prompt}
            else:
                groups[p].questions[i] = None
        valid = [(p, i) for p, i in valid if groups[p].questions[i] is not None]
        play.valid_questions.extend(groups[p].questions[i] for p, i in valid)
        return valid

    def _solve(self, play: _SelfPlay, valid: list[tuple[int, int]]) -> None:
        """`group_size` responses to each valid question, scored by the solver reward functions."""
        group_size, groups = play.group_size, play.groups
        share, _ = process_share(self.accelerator, valid)
        inputs = [groups[p].solver_inputs[i] for p, i in share for _ in range(group_size)]
        prompts = [row["prompt"] for row in inputs]
        responses = self._generate_rows(play, prompts, group_size=group_size, inputs=inputs)
        local = responses[local_rows(self.accelerator, len(inputs))]
        # `self.environments` still holds this round's episodes: environment scores are recorded now.
        rewards = (
            super()
            ._calculate_rewards(inputs, prompts, [r.completion for r in local], [r.completion_ids for r in local])
            .cpu()
        )
        # Columns logged by reward functions describe rows that may not be kept; TRL's table has no place for them.
        self._pending_extra_logs.clear()
        for n, (p, i) in enumerate(valid):
            rows = slice(n * group_size, (n + 1) * group_size)
            groups[p].responses[i] = responses[rows]
            groups[p].rewards[i] = rewards[rows]

    def _estimate_learnability(self, play: _SelfPlay, pending: list[int]) -> None:
        """Per question of the pending prompts: learnable or not (None: invalid), and its solve rate."""
        criteria = self._criteria or default_criteria(self.reward_func_names[0], play.group_size)
        for p in pending:
            group = play.groups[p]
            for i, question in enumerate(group.questions):
                if question is None:
                    group.learnable.append(None)
                    group.solve_rates.append(None)
                    continue
                scores = {name: group.rewards[i][:, f].tolist() for f, name in enumerate(self.reward_func_names)}
                group.learnable.append(is_learnable(scores, criteria))
                group.solve_rates.append(counted_ratio(scores[criteria[0].reward], criteria[0]))

    def _check_template_fields(self, question: dict) -> bool:
        """Whether this question lacks a template field (it renders empty); warns once per field."""
        if self._template_fields is None:
            return False
        missing = sorted(name for name in self._template_fields if question.get(name) is None)
        for name in missing:
            if name not in self._warned_fields:
                self._warned_fields.add(name)
                logger.warning(
                    "solver_prompt_template names {%s}, which a parsed question lacks (its fields: %s): it renders "
                    "empty. A typo in the template? `warnings/solver_prompt_missing_fields` counts such questions.",
                    name,
                    sorted(question),
                )
        return bool(missing)

    def _selection_rng(self) -> random.Random:
        """Seeded by (seed, global step, draw at that step): identical on every process, and reproduced on resume."""
        step, draws = self._draw
        draws = draws + 1 if step == self.state.global_step else 0
        self._draw = (self.state.global_step, draws)
        return random.Random(f"{self.args.seed}-{self.state.global_step}-{draws}")

    # -- the self-play batch -----------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            # TRL's evaluation loop (`evaluate()`) runs over the held-out questions, not seed prompts: its loss and
            # metrics are the solver's GRPO batch on them, prompted as the held-out evaluation prompts them.
            return super()._generate_and_score_completions(
                [{**row, "prompt": self.solver_prompt_fn(dict(row), {})} for row in inputs]
            )
        # Self-play runs in training only: from here on the mode is "train", the group size G = `num_generations`.
        # Every decision below is taken on gathered data, identically on every process: generation and reward
        # calls are collectives (vLLM server mode, multi-process), so every process makes the same calls with the
        # same row counts.
        args = self.args
        group_size = self.num_generations
        seeds = gather_object(list(inputs))[::group_size]  # the sampler repeats each seed prompt group_size times
        play = _SelfPlay(seeds, group_size, groups=[_Group() for _ in seeds])

        # 1. Rounds: propose K questions per seed prompt, validate, solve each valid one G times, estimate
        #    learnability; repropose for the prompts with no learnable question
        pending = list(range(len(seeds)))
        while True:
            self._round(play, pending)
            pending = [p for p in pending if needs_repropose(play.groups[p].learnable)]
            if not pending or play.groups[pending[0]].rounds > args.max_repropose_attempts:
                break
            play.reproposed.update(pending)
            play.attempts += len(pending)
        if self.task_state is not None:
            self.task_state.update(play.valid_questions)

        # 2. Select: one learnable question per prompt trains the solver; the proposer's reward is its proposals'
        #    learnability
        rng = self._selection_rng()
        play.selected = [select_question(g.learnable, rng) for g in play.groups]
        play.proposer_rewards = [
            proposer_rewards(
                g.learnable,
                g.solve_rates,
                choice is None,
                args.proposer_reward_mode,
                args.invalid_question_reward,
                args.repropose_penalty,
                args.uniform_question_reward,
            )
            for g, choice in zip(play.groups, play.selected, strict=True)
        ]

        # 3. The batch: TRL builds each kind's rows from the recorded generations, solver rows first: B = len(inputs)
        #    solver rows (G per prompt), then the proposer rows, padded to a per-process multiple of
        #    `steps_per_generation`; the two pad to one T when joined
        solver = self._solver_batch(play, len(inputs))
        proposer, num_proposer_rows = self._proposer_batch(play)
        batch = concat_row_kinds({SOLVER: solver, PROPOSER: proposer}, self._tokenizer.pad_token_id, self.accelerator)

        self._log_self_play(play, num_proposer_rows)
        return batch

    def _solver_batch(self, play: _SelfPlay, num_local: int):
        """Solver rows in the order of the seed rows: the selected question's responses. An unresolved prompt keeps
        its first valid question's rows, or with none its first proposal as a stand-in (rewards NaN), at zero loss."""
        group_size, seeds = play.group_size, play.seeds
        rows, rewards, inputs, keep = [], [], [], []
        for p, (group, choice) in enumerate(zip(play.groups, play.selected, strict=True)):
            index = choice if choice is not None else min(group.responses, default=None)
            if index is None:
                rows.extend([group.proposals[0]] * group_size)
                rewards.append(torch.full((group_size, len(self.reward_funcs)), torch.nan))
                inputs.extend([{**seeds[p], "prompt": group.prompt}] * group_size)
            else:
                rows.extend(group.responses[index])
                rewards.append(group.rewards[index])
                inputs.extend([group.solver_inputs[index]] * group_size)
            keep.extend([choice is not None] * group_size)
        local = local_rows(self.accelerator, num_local)
        with scoped_call(self, **self._replayed(rows[local], torch.cat(rewards))):
            batch = super()._generate_and_score_completions(inputs[local])
        mask = torch.tensor(keep[local], dtype=torch.long, device=batch["advantages"].device)
        restrict_loss(batch, mask)
        batch["advantages"] = batch["advantages"] * mask
        return batch

    def _proposer_batch(self, play: _SelfPlay):
        """Proposer rows (one per prompt, or K), padded to a per-process multiple of `steps_per_generation`."""
        args, k = self.args, self.args.num_questions_per_prompt
        seeds, groups, rewards, world = play.seeds, play.groups, play.proposer_rewards, self.accelerator.num_processes
        slots = []  # (prompt, proposal) in row order
        for p, (group, choice) in enumerate(zip(groups, play.selected, strict=True)):
            if args.proposer_rows == "all":
                slots.extend((p, i) for i in range(k))
            else:
                fallback = next((i for i, q in enumerate(group.questions) if q is not None), 0)
                slots.append((p, fallback if choice is None else choice))
        real = torch.tensor([rewards[p][i] for p, i in slots], dtype=torch.float32)
        if args.proposer_rows == "all":
            advantages = group_advantages(real, k, self.scale_rewards)
        else:
            advantages = batch_baseline_advantages(real, self.scale_rewards)

        per_process = padded_rows(len(slots), world, args.steps_per_generation)
        pad = per_process * world - len(slots)
        slots = slots + [slots[0]] * pad
        real = torch.cat([real, torch.zeros(pad)])
        advantages = torch.cat([advantages, torch.zeros(pad)])
        keep = torch.cat([torch.ones(len(slots) - pad), torch.zeros(pad)])

        local = local_rows(self.accelerator, per_process)
        rows = [groups[p].proposals[i] for p, i in slots][local]
        local_inputs = [{**seeds[p], "prompt": groups[p].prompt} for p, _ in slots[local]]
        # The proposer's reward is given, not computed: one reward named after its mode (logged under
        # `proposer/rewards/<mode>/`), groups of one (advantages set below).
        with self._kind_call(self._proposer, "train", **self._replayed(rows, real.unsqueeze(1))):
            batch = super()._generate_and_score_completions(local_inputs)
        device = batch["advantages"].device
        batch["advantages"] = advantages[local].to(device)
        restrict_loss(batch, keep[local].to(device=device, dtype=torch.long))
        return batch, len(slots) - pad

    def _log_self_play(self, play: _SelfPlay, num_proposer_rows: int):
        """Self-play metrics (README, AbsoluteZeroTrainer), computed from gathered data (identical on every process)."""
        m, groups, selected = self._metrics["train"], play.groups, play.selected
        learnable = [x for g in groups for x in g.learnable if x is not None]
        proposals = [x for g in groups for x in g.learnable]
        trained_rewards = [r for g_rewards in play.proposer_rewards for r in g_rewards]
        resolved = sum(s is not None for s in selected)
        m["unified_filter/num_learnable"].append(float(sum(learnable)))
        m["unified_filter/num_total"].append(float(len(learnable)))
        m["unified_filter/learnable_ratio"].append(sum(learnable) / len(learnable) if learnable else 0.0)
        m["unified_filter/num_sampled"].append(float(resolved))
        m["unified_filter/num_repropose"].append(float(len(play.reproposed)))
        m["repropose/total_attempts"].append(float(play.attempts))
        m["repropose/rounds"].append(float(max(g.rounds for g in groups) - 1))
        m["repropose/final_non_learnable"].append(float(len(groups) - resolved))
        m["proposer/reward_mean"].append(sum(trained_rewards) / len(trained_rewards))
        m["proposer/invalid_rate"].append(sum(x is None for x in proposals) / len(proposals))
        m["proposer/num_integrated"].append(float(num_proposer_rows))
        m["joint/proposer_solver_ratio"].append(num_proposer_rows / max(resolved * play.group_size, 1))
        m["generation/calls"].append(float(play.generation_calls))
        for guard in self._calls.values():
            m[guard.metric].append(float(guard.take()))
        if self._template_fields is not None:
            m["warnings/solver_prompt_missing_fields"].append(float(play.missing_fields))
        for name, count in play.generated.items():
            m[f"generation/{name}"].append(float(count))
        all_rewards = [r for g in groups for r in g.rewards.values()]
        if all_rewards:
            table = torch.cat(all_rewards)
            for f, name in enumerate(self.reward_func_names):
                column = table[:, f]
                column = column[~torch.isnan(column)]
                if column.numel():
                    m[f"solver/{name}_mean"].append(column.mean().item())
        by_type = defaultdict(list)
        for group in groups:
            if group.context.get("task_type") is not None:
                by_type[group.context["task_type"]].append(group)
        for task_type, typed in by_type.items():
            verdicts = [x for g in typed for x in g.learnable]
            valid = [x for x in verdicts if x is not None]
            rates = [r for g in typed for r in g.solve_rates if r is not None]
            m[f"task/{task_type}/valid_rate"].append(len(valid) / len(verdicts))
            if valid:
                m[f"task/{task_type}/solve_rate"].append(sum(rates) / len(rates))
                m[f"task/{task_type}/learnable_ratio"].append(sum(valid) / len(valid))
        if self.task_state is not None:
            for name, value in self.task_state.metrics().items():
                m[f"task/{name}"].append(float(value))

    # -- checkpoints -------------------------------------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        # Written for every run (a stateless family saves None), so any Absolute Zero checkpoint can be resumed.
        return {"task_state": None if self.task_state is None else self.task_state.state_dict()}

    def load_checkpoint_state(self, state: dict) -> None:
        saved = state["task_state"]
        if self.task_state is None:
            return
        if saved is None:
            raise ValueError("the checkpoint was written without a task state; resume with the family it was run with")
        self.task_state.load_state_dict(saved)


def _check_heldout_questions(dataset) -> None:
    """The evaluation set holds solver questions; seed prompts (a conversational `prompt`) are refused."""
    check_not_empty(dataset, "eval_dataset")
    for split in dataset.values() if isinstance(dataset, dict) else [] if dataset is None else [dataset]:
        first = next(iter(split))
        if isinstance(first.get("prompt"), list):
            raise ValueError(
                "eval_dataset holds seed prompts (a conversational `prompt` column), but the evaluation answers "
                "held-out solver questions: rows with a validated proposal's fields, gold included (e.g. "
                "TaskFamily.heldout_questions; pass heldout_questions=family.heldout_questions)."
            )
