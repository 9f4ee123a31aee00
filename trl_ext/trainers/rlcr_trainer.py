"""RLCR with a confidence turn per fixed answer (docs/design.md#rlcrmultiturntrainer).

Per prompt, `G_a` answers are sampled; then, for each answer, `G_c` confidences are sampled in a second turn whose
context is the prompt, that answer, and a user message asking for a confidence. Accuracy rewards the answers, the
Brier score rewards the confidences against their own answer's correctness, and both row kinds train in one update.

The turn-2 prompt is built on token ids, so it is exactly what the model sampled in plus the template's follow-up
tokens; templates that render earlier assistant turns differently once a user message follows (Qwen3 and its
successors) are swapped for TRL's prefix-preserving training version, for both turns, as TRL does for tool turns.

Both turns run through `GRPOTrainer._generate_and_score_completions`, so generation (vLLM server/colocate,
transformers), old/ref log-probs and vLLM's importance-sampling correction are TRL's own. The confidence turn runs it
inside `_confidence_turn()`, which scopes what differs for that call: the group size (`G_c`), the reward function
(Brier), the scaling, the generation length and settings, and the prompt ids, built by token concatenation and
returned by `_tokenize_prompts`. The trainer then adds span masks (`tool_mask`), weights and re-normalises advantages,
and concatenates the rows. The loss is TRL's, unchanged: it reads the span mask and per-row advantages.

Names: a row's kind is ANSWER or CONFIDENCE (batch key `row_kind`); an answer row and its confidence rows are a
family (batch key `family`, the process-local index of the answer).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from contextlib import contextmanager
from functools import partial

import torch

from ..core.advantages import group_advantages
from ..core.batch import concat_row_batches, group_rows, merge_rows
from ..core.confidence_diagnostics import confidence_correctness_correlation, confidence_leak, confidence_spread
from ..core.prefix_tree import family_chunks, pack_prefix_families, tree_attention_mask, tree_mask_unsupported
from ..core.refill import GroupRefill, equal_reward_groups
from ..core.spans import span_token_mask
from ..core.turns import follow_up_turn
from ..evaluation.calibration import calibration_report
from ..evaluation.heldout_metrics import calibration_metrics
from ..rewards import extract_answer, extract_confidence, make_accuracy_reward, make_brier_reward
from ..rewards.verify import verify_answer
from .base import TrlExtGRPOTrainer
from .rlcr_config import RLCRMultiTurnConfig
from .seams.call_record import CallRecord, RecordsCalls
from .seams.context_limit import VLLMContextLimit
from .seams.heldout import nan_to_none
from .seams.init_checks import (
    check_conversational_prompts,
    check_datasets,
    checked_args,
    refuse_rollout_func,
    user_message_prompts,
)
from .seams.model_card import arxiv_paper
from .seams.policy_reference import PolicyReference
from .seams.row_batches import KIND_KEY, RowBeta, concat_row_kinds, local_rows, restrict_loss
from .seams.row_kind_forwards import ForwardRows, KindCall, RowKindForwards
from .seams.scoping import scoped_call


ANSWER, CONFIDENCE = 0, 1  # row kinds
FAMILY_KEY = "family"  # batch key: a row's family, the process-local index of its answer
LABEL_COLUMN = "answer_correct"  # the parent answer's accuracy, passed to the Brier reward

logger = logging.getLogger(__name__)

PAPER = arxiv_paper(  # the paper the model card cites
    "damani2025beyond",
    "Beyond Binary Rewards: Training LMs to Reason About Their Uncertainty",
    "Mehul Damani and Isha Puri and Stewart Slocum and Idan Shenfeld and Leshem Choshen and Yoon Kim and Jacob Andreas",
    2025,
    "2507.16806",
)


class ConfidenceReferenceSkip(PolicyReference):
    """`confidence_beta=0` (with `beta` non-zero): the confidence rows have no KL term, so their turn skips TRL's
    reference pass (a no-grad forward of every confidence row, about 15% of a CPU step at G_c 4); the loss then gives
    those rows the policy's own log-probs as reference, a KL of exactly 0 with a zero gradient.

    The whole mechanism, in batch order: `turn_attributes` (the confidence turn's call runs with `beta` 0, so TRL
    skips the pass), `mark` (its rows' reference log-probs are NaN until the loss), `in_loss` (the loss names them)
    and `fill` (the loss forward puts its log-probs there)."""

    def __init__(self, active: bool):
        super().__init__()
        self.active = active

    def turn_attributes(self) -> dict:
        return {"beta": 0.0} if self.active else {}

    def mark(self, confidences: dict, answers: dict) -> None:
        if self.active:
            confidences["ref_per_token_logps"] = torch.full_like(
                confidences["completion_mask"], math.nan, dtype=answers["ref_per_token_logps"].dtype
            )

    def in_loss(self, inputs: dict, rows: torch.Tensor | None):
        """`PolicyReference.in_loss` at the confidence rows `(B,)` when the skip is on (`None`: no KL per row kind)."""
        return super().in_loss(inputs, rows if self.active else None)


class RLCRMultiTurnTrainer(
    RowKindForwards,
    RecordsCalls,
    VLLMContextLimit,
    TrlExtGRPOTrainer,
):
    """GRPO with an answer turn and a confidence turn per fixed answer (RLCR, multi-turn).

    Overrides from [`~trl.GRPOTrainer`]: `_generate_and_score_completions` (the two turns: TRL's own method called once
    per turn, and once per refill round of all-equal answer groups with `answer_refill_rounds`, then span masks,
    advantage weights and the joined batch), `_compute_loss` (sets the rows the loss forward scores and the KL per row
    kind, then TRL's loss), `_prepare_inputs` (keeps each answer with its confidences), and through its seams
    `_get_per_token_logps_and_entropies` (`RowKindForwards`: packed families, or one forward per row kind at its
    temperature), `_generate` / `_calculate_rewards` (`RecordsCalls`) and `_generate_single_turn` (`VLLMContextLimit`);
    the base adds checkpoints, model cards, held-out evaluation and generation-backend handling (`TrlExtGRPOTrainer`).
    Inherited unchanged: generation on every backend, old and reference log-probs, reward gathering and group
    advantages, vLLM importance sampling, the loss of every `loss_type`, logging and the completions table.

    Args:
        model: As [`~trl.GRPOTrainer`].
        reward_funcs: Extra reward functions for the answer rows (e.g. a format reward). Accuracy (answer rows) and
            the Brier score (confidence rows) are built in.
        args: An [`RLCRMultiTurnConfig`].
        accuracy_func: `f(gold: str, prediction: str) -> bool` deciding correctness. Defaults to
            [`~trl_ext.rewards.verify_answer`] (math_verify with a normalised exact-match fallback).
        **kwargs: `train_dataset`, `eval_dataset`, `processing_class`, `reward_processing_classes`, `callbacks`,
            `optimizers`, `peft_config`, as [`~trl.GRPOTrainer`]. The dataset needs a `prompt` column (a
            conversation, or plain text, taken as one user message: the confidence turn continues the conversation
            through the chat template) and the gold answer in `args.solution_column`.

    `evaluate()` (every `eval_steps` with `eval_strategy="steps"`) logs TRL's evaluation loss and metrics, and adds the
    held-out metrics: it answers `eval_dataset`'s questions, asks the confidence turn on each answer, and logs
    accuracy and calibration (`_heldout_metrics`).

    Batch rows: the `B * G_a` answer rows first, then the `B * G_a * G_c` confidence rows grouped by parent answer,
    with the row kind in `row_kind` (0 answer, 1 confidence), the row's family in `family` (the
    process-local index of its answer) and the loss-only span mask in `tool_mask`.
    """

    ROW_KINDS = (ANSWER, CONFIDENCE)  # scored one forward each in the loss (`RowKindForwards`)

    _tag_names = ["trl", "grpo", "trl-ext", "rlcr", "calibration"]
    _name = "RLCR (multi-turn)"
    _paper = PAPER

    def __init__(
        self, model, reward_funcs=None, args: RLCRMultiTurnConfig | None = None, accuracy_func=None, **kwargs
    ):
        args = checked_args(args, RLCRMultiTurnConfig, "RLCR-multi-turn")
        refuse_rollout_func(
            kwargs,
            "RLCRMultiTurnTrainer",
            "it builds its own two-turn rollout (an answer, then a "
            "confidence turn generated after it), which a rollout_func would replace.",
        )
        for unsupported in ("tools", "environment_factory"):
            if kwargs.get(unsupported) is not None:
                raise ValueError(
                    f"RLCRMultiTurnTrainer does not support `{unsupported}`: the confidence turn is asked right after "
                    "the answer turn, and its prompt, span masks and calibration reward treat the answer completion "
                    "as model text; a tool transcript inside it is not modelled. For tool episodes use "
                    "ReplayGRPOTrainer or AbsoluteZeroTrainer."
                )
        for split in ("train_dataset", "eval_dataset"):  # plain-text prompts become one user message each
            kwargs[split] = user_message_prompts(kwargs.get(split))
        check_datasets(
            kwargs,
            partial(
                check_conversational_prompts,
                why="the confidence turn continues the conversation through the chat template",
                required={
                    args.solution_column: "it must hold the gold answers: rename the column or set "
                    "RLCRMultiTurnConfig.solution_column"
                },
            ),
        )

        extra = (
            [] if reward_funcs is None else list(reward_funcs) if isinstance(reward_funcs, list) else [reward_funcs]
        )
        accuracy = make_accuracy_reward(
            args.answer_tag, args.solution_column, accuracy_func or verify_answer, lenient=args.lenient_parsing
        )
        weights = args.reward_weights
        if weights is not None and len(weights) != len(extra):
            raise ValueError(
                f"reward_weights has {len(weights)} weights for {len(extra)} reward functions passed to the trainer: "
                "give one weight per reward function you pass; the built-in accuracy reward's weight is "
                "accuracy_weight."
            )
        # TRL weighs every reward function it holds, the accuracy reward first. Its generation kwargs are the answer
        # turn's: they are applied per turn below.
        with scoped_call(
            args, reward_weights=[args.accuracy_weight, *(weights or [1.0] * len(extra))], generation_kwargs=None
        ):
            super().__init__(model, reward_funcs=[accuracy, *extra], args=args, **kwargs)
        self._set_turns(
            "answer", "confidence", CONFIDENCE, args.confidence_generation_kwargs, self._confidence_temperature
        )
        # The confidence turn's call of TRL's batch code: G_c samples per answer, the Brier reward alone
        self._confidence = KindCall(
            prefix="confidence",
            group_size=args.num_generations_confidence,
            reward_func_names=["brier"],
            temperature=self._confidence_temperature,
            reward_funcs=[make_brier_reward(args.confidence_tag, LABEL_COLUMN, lenient=args.lenient_parsing)],
            scale_rewards=args.confidence_scale_rewards,
            generation=self._generation["confidence"],
            max_new_tokens=args.max_confidence_length,
        )
        self._turn = follow_up_turn(
            self.processing_class,
            args.confidence_prompt,
            self.eos_token_ids,
            chat_template=self.chat_template,
            **self.chat_template_kwargs,
        )
        if self._turn.chat_template != self.chat_template:
            # As GRPOTrainer does for tool turns: both turns render with TRL's prefix-preserving training template.
            logger.info(
                "The chat template renders the last assistant turn differently once a user message follows; "
                "prompts are rendered with TRL's prefix-preserving training version of it."
            )
            self.chat_template = self._turn.chat_template
        self._answer_span = ([f"<{args.think_tag}>"], f"</{args.answer_tag}>")
        self._confidence_span = ([f"<{args.analysis_tag}>", f"<{args.confidence_tag}>"], f"</{args.confidence_tag}>")
        self._reference_skip = ConfidenceReferenceSkip(args.confidence_beta == 0.0 and self.beta != 0.0)
        self._share_prefix = args.share_prefix
        if args.share_prefix and (reason := tree_mask_unsupported(self.model.config)):
            logger.warning(f"share_prefix=True but {reason}: answer and confidence rows are scored one by one.")
            self._share_prefix = False

        # split_tensor_dict drops a remainder silently: the (1 + G_c) rows per answer row must split evenly.
        local_rows = (
            args.generation_batch_size // self.accelerator.num_processes * (1 + args.num_generations_confidence)
        )
        if local_rows % args.steps_per_generation != 0:
            raise ValueError(
                f"A generation batch gives {local_rows} rows per process, which do not split into "
                f"steps_per_generation={args.steps_per_generation} chunks; change per_device_train_batch_size, "
                "generation_batch_size or steps_per_generation."
            )

    @property
    def _confidence_temperature(self) -> float:
        """The confidence turn's sampling temperature, at which its rows are scored too."""
        temperature = self.args.confidence_temperature
        return self.temperature if temperature is None else temperature

    # -- seams of GRPOTrainer ----------------------------------------------------------------------------------------
    def _prepare_inputs(self, generation_batch):
        buffered = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self._share_prefix and self._buffered_inputs is not buffered and len(self._buffered_inputs) > 1:
            # A new generation batch was shuffled and split: keep each answer with its confidence rows, so that
            # the loss forward can share their prefix. Families stay in shuffled order.
            self._buffered_inputs = group_rows(self._buffered_inputs, FAMILY_KEY)
            inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
        return inputs

    def _compute_loss(self, model, inputs):
        # TRL's loss over the micro-batch's answer and confidence rows; only its forward and its KL coefficient
        # differ. The forward packs each family around its prompt, or scores each row kind on its own
        # (`_own_logps_and_entropies`).
        kinds = inputs.get(KIND_KEY)  # (B,)
        scoped = {"_forward_rows": ForwardRows(kinds, families=inputs.get(FAMILY_KEY) if self._share_prefix else None)}
        confidence_rows = None
        if kinds is not None and self.args.confidence_beta is not None and self.beta != 0.0:
            # The KL coefficient per row: `confidence_beta` on confidence rows, `beta` on answers
            confidence_rows = kinds == CONFIDENCE
            scoped["beta"] = RowBeta(self.beta, torch.where(confidence_rows, self.args.confidence_beta, self.beta))
        with scoped_call(self, **scoped), self._reference_skip.in_loss(inputs, confidence_rows) as inputs:
            return super()._compute_loss(model, inputs)

    def _own_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy):
        """Pack each family where `_forward_rows` names them (the loss, and the confidence turn's old and reference
        passes: see `_packed_logps_and_entropies`); otherwise the loss forward runs answer rows and confidence rows
        separately, each cut to its own padding (`RowKindForwards`).

        A shared micro-batch pads answer rows to the confidence prompts' width (which contain the answer) and
        confidence rows to the answers' completion length; trimmed, the forward processes only the columns some
        row of the type uses.

        In the loss, the confidence rows may take these log-probs as their reference (`ConfidenceReferenceSkip`).
        """
        families = self._forward_rows.families
        if families is not None and self._forward_rows.kinds is not None and self._temperatures_differ():
            # answers and confidences at different temperatures: the head scores a packed sequence at one, so each
            # kind is packed on its own (the confidence siblings still share their prompt)
            scored = self._packed_by_kind(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, families
            )
        elif families is not None:
            scored = self._packed_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, families
            )
        else:
            scored = super()._own_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
            )
        if scored is not None:  # None: the pass is left to TRL (no row kinds named), nothing to fill
            self._reference_skip.fill(scored[0])
        return scored

    def _packed_by_kind(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, families):
        """The loss forward packed by family, each row kind in passes of its own at its temperature. Every kind gets
        a pass on every process (a one-row stand-in where a process has none of it): passes are collectives."""
        kinds = self._forward_rows.kinds.to(input_ids.device)
        parts, order, stand_ins = [], [], []
        for kind in self.ROW_KINDS:
            rows = torch.nonzero(kinds == kind).flatten()
            if rows.numel() == 0:
                if self.accelerator.num_processes > 1:
                    stand_ins.append(self._stand_in_forward(model, input_ids))
                continue
            with self._fused_heads.at(self._kind_temperature(kind)):
                parts.append(
                    self._packed_logps_and_entropies(
                        model,
                        input_ids[rows],
                        attention_mask[rows],
                        logits_to_keep,
                        batch_size,
                        compute_entropy,
                        families[rows.to(families.device)],
                    )
                )
            order.append(rows)
        logps, entropies = merge_rows(parts, order, logits_to_keep)
        for zero in stand_ins:
            logps = logps + zero
        return logps, entropies

    def _packed_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, families
    ):
        """Score the rows packed by family, `batch_size` rows at a time in whole families (TRL's chunking)."""
        families = families.to(input_ids.device)
        attn_implementation = self.accelerator.unwrap_model(model).config._attn_implementation
        parts, order = [], []
        for rows in family_chunks(families, batch_size or input_ids.size(0)):
            rows = rows.to(input_ids.device)
            packed = pack_prefix_families(
                input_ids[rows], attention_mask[rows], logits_to_keep, families[rows], self._tokenizer.pad_token_id
            )
            with self.accelerator.autocast():
                # the fused LM head TRL adds scores `shift_labels` as given: one label per packed position
                outputs = model(
                    input_ids=packed.input_ids,
                    attention_mask=tree_attention_mask(packed.attend, attn_implementation),
                    position_ids=packed.position_ids,
                    shift_labels=packed.shift_labels,
                    fused_lm_head=True,
                )
            logps = packed.unpack(outputs.log_probs, rows.numel(), logits_to_keep)
            entropies = packed.unpack(outputs.entropy, rows.numel(), logits_to_keep) if compute_entropy else None
            parts.append((logps, entropies))
            order.append(rows)
        return merge_rows(parts, order, logits_to_keep)

    @contextmanager
    def _confidence_turn(self, turn2_prompt_ids, mode):
        """The confidence turn's call of `_generate_and_score_completions`, recorded: its settings
        (`self._confidence`), its prompt ids (built on tokens, not rendered from the prompts), the siblings' shared
        prompt (TRL's old/ref log-prob passes score them packed) and the reference skip. The metrics it appends
        (lengths, reward stats, IS ratios) move under `confidence/`."""
        siblings = (
            torch.arange(len(turn2_prompt_ids)) // self.args.num_generations_confidence if self._share_prefix else None
        )
        with (
            self._kind_call(
                self._confidence,
                mode,
                _tokenize_prompts=lambda prompts: (turn2_prompt_ids, None, {}),
                _forward_rows=ForwardRows(families=siblings),
                **self._reference_skip.turn_attributes(),
            ),
            self.recording() as record,
        ):
            yield record

    # -- held-out evaluation (trainers/seams/heldout.py) -------------------------------------------------------------------
    heldout_confidence_prompt_ids: list[list[int]] | None = None
    """The confidence-turn prompt ids (question, answer and confidence question, on tokens) of the last held-out
    evaluation's samples on this process, in the order of its records, its padding rows last: what the recipe's
    `--confidence_samples` samples again (records carry texts, and re-tokenising an answer need not give its ids)."""

    def _heldout_evaluation(self, dataset, metric_key_prefix):
        self.heldout_confidence_prompt_ids = []
        return super()._heldout_evaluation(dataset, metric_key_prefix)

    def _heldout_records(self, rows, num_samples):
        """Answer each question `num_samples` times, then one confidence turn on each fixed answer, built on tokens
        as in training (`FollowUpTurn.prompt_ids`). Per sample: correctness (accuracy reward; `None` without gold),
        whether an answer could be parsed, the stated confidence (`None`: unparsable), and both replies' texts."""
        args = self.args
        prompts = [row["prompt"] for row in rows]
        prompt_ids, answer_ids, _, rewards = self._heldout_samples(
            rows, prompts, num_samples, self._generation["answer"]
        )
        turn2 = [self._turn.prompt_ids(p, a, self.eos_token_ids) for p, a in zip(prompt_ids, answer_ids, strict=True)]
        confidence_ids = self._heldout_generate(turn2, 1, self._generation["confidence"], args.max_confidence_length)
        self.heldout_confidence_prompt_ids += turn2
        answers = self.processing_class.batch_decode(answer_ids, skip_special_tokens=True)
        confidences = self.processing_class.batch_decode(confidence_ids, skip_special_tokens=True)
        return [
            {
                "correct": nan_to_none(reward),
                "answer_parsed": bool(extract_answer(answer, args.answer_tag, args.lenient_parsing)),
                "confidence": extract_confidence(confidence, args.confidence_tag, args.lenient_parsing),
                "answer": answer,
                "confidence_text": confidence,
            }
            for reward, answer, confidence in zip(rewards[:, 0].tolist(), answers, confidences, strict=True)
        ]

    def _heldout_metrics(self, rows, records):
        metrics = calibration_metrics(
            [r["correct"] for r in records], [r["confidence"] for r in records], [r.get("group") for r in records]
        )
        metrics["answer/parse_fail_rate"] = 1.0 - sum(r["answer_parsed"] for r in records) / len(records)
        metrics["num_questions"] = float(len(rows))
        return metrics

    # -- the two-turn batch ------------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        # Shapes per process: B = len(inputs) answer rows (prompts x G_a, as TRL's sampler repeats them), B * G_c
        # confidence rows; T: each batch's padded completion length. TRL's reward tensors are gathered: (W * ., F).
        mode = "train" if self.model.training else "eval"
        args = self.args
        g_a = self.num_generations if mode == "train" else self.num_generations_eval
        g_c = args.num_generations_confidence

        # 1. Answer turn: TRL generates, scores by accuracy (+ extra reward functions) and normalises advantages
        #    within each prompt's G_a answers. The record keeps the ids and the gathered rewards (W * B, F).
        with self.recording() as answer_turn:
            answers = super()._generate_and_score_completions(inputs)
        if mode == "train" and args.answer_refill_rounds:
            answers, answer_turn = self._refill_equal_groups(inputs, answers, answer_turn, g_a)
        prompt_ids, answer_ids = answer_turn.prompt_ids, answer_turn.completion_ids
        rewards = answer_turn.rewards_per_func
        local = local_rows(self.accelerator, len(inputs))
        # Accuracy is reward function 0. NaN: the row had no gold answer, so its confidences get no label (no Brier).
        correct = [None if math.isnan(c) else c for c in rewards[local, 0].clamp(0, 1).round().tolist()]

        # 2. Confidence prompts, on tokens: prompt + answer (+ end of turn) + the template's confidence question.
        turn2_inputs, turn2_prompt_ids = [], []
        answer_texts = self.processing_class.batch_decode(answer_ids, skip_special_tokens=True)
        for row, p_ids, a_ids, answer_text, label in zip(
            inputs, prompt_ids, answer_ids, answer_texts, correct, strict=True
        ):
            ids = self._turn.prompt_ids(p_ids, a_ids, self.eos_token_ids)
            conversation = [
                *row["prompt"],
                {"role": "assistant", "content": answer_text},
                {"role": "user", "content": args.confidence_prompt},
            ]
            for _ in range(g_c):
                turn2_prompt_ids.append(ids)
                turn2_inputs.append({**row, "prompt": conversation, LABEL_COLUMN: label})
        # 3. Confidence turn: G_c confidences per answer in one call of TRL's method, Brier-scored against the
        #    answer's correctness, advantages normalised among each answer's G_c siblings.
        with self._confidence_turn(turn2_prompt_ids, mode) as confidence_turn:
            confidences = super()._generate_and_score_completions(turn2_inputs)
        confidence_ids = confidence_turn.completion_ids
        brier = confidence_turn.rewards_per_func[:, 0]  # (W * B * G_c,)
        self._reference_skip.mark(confidences, answers)

        # 4. Span masks (B, T) and (B * G_c, T): the loss reads only the answer and confidence spans (`tool_mask`).
        answer_mask, answer_closed = self._span_masks(answer_ids, self._answer_span, answers["completion_ids"])
        confidence_mask, _ = self._span_masks(confidence_ids, self._confidence_span, confidences["completion_ids"])
        restrict_loss(answers, answer_mask)
        restrict_loss(confidences, confidence_mask)

        # 5. Advantages: lambda-weighted; confidence rows optionally re-standardised over the prompt's G_a * G_c rows.
        answers["advantages"] = answers["advantages"] * args.lambda_ans  # (B,)
        conf_adv = confidences["advantages"]  # (B * G_c,)
        if args.confidence_normalization == "answer_then_prompt":
            # A prompt's G_a * G_c confidence rows may span processes: normalise over the gathered rows (every
            # process gathers the same number, B * G_c), then keep this process's slice.
            gathered = self.accelerator.gather(conf_adv).clone()
            gathered[torch.isnan(brier.to(gathered.device))] = math.nan  # unlabelled rows stay out, and at 0
            conf_adv = group_advantages(gathered, g_a * g_c)[local_rows(self.accelerator, len(turn2_inputs))]
        confidences["advantages"] = conf_adv * args.lambda_conf

        # 6. One batch: B answer rows, then B * G_c confidence rows, each tagged with its kind and family.
        device = answers["advantages"].device
        answers[FAMILY_KEY] = torch.arange(len(inputs), device=device)
        confidences[FAMILY_KEY] = torch.arange(len(inputs), device=device).repeat_interleave(g_c)
        batch = concat_row_kinds(
            {ANSWER: answers, CONFIDENCE: confidences}, self._tokenizer.pad_token_id, self.accelerator
        )

        self._log_turns(mode, rewards, brier, answer_texts, answer_closed, confidence_ids, g_c)
        return batch

    def _refill_equal_groups(self, inputs, answers, answer_turn, g_a):
        """DAPO-style refill (`answer_refill_rounds`): the prompts whose `G_a` answers all got the same accuracy are
        answered again by further calls of TRL's method on their rows, up to `answer_refill_rounds` rounds; a call's
        answers to a prompt replace its group when they are mixed: rows, log-probs, the advantages TRL computed within
        the new group, the rewards and the group's rows in the completions table. Returns the final answers' batch
        and record.

        Generation calls are collectives: `GroupRefill` plans each round from gathered rewards, the same on every
        process, and a process with fewer such prompts fills its call with copies of its own groups."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        metrics = self._metrics["train"]
        plan = GroupRefill(answer_turn.rewards_per_func[:, 0], world, g_a)  # accuracy is reward function 0
        batches, records, tables = [answers], [answer_turn], []
        for _ in range(self.args.answer_refill_rounds):
            slots = plan.next_round()
            if slots is None:
                break
            rows = [inputs[group * g_a + i] for group in slots[rank] for i in range(g_a)]
            # TRL's metrics of the call describe its fillers too: dropped. Its table rows are patched in below.
            table = self._empty_logs()
            throwaway = {"train": defaultdict(list), "eval": defaultdict(list)}
            with scoped_call(self, _metrics=throwaway, _logs=table), self.recording() as record:
                batches.append(super()._generate_and_score_completions(rows))
            plan.accept(record.rewards_per_func[:, 0])
            records.append(record)
            tables.append(table)

        local = plan.local_index(rank)
        joined = concat_row_batches(batches, self._tokenizer.pad_token_id)  # drops 0-dim `num_items_in_batch`
        index = torch.tensor(local, device=answers["advantages"].device)
        answers = {key: value[index] for key, value in joined.items()}
        loss_mask = answers["completion_mask"] * answers.get("tool_mask", 1)  # recounted as TRL counts it
        answers["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        prompt_ids = [ids for record in records for ids in record.prompt_ids]
        completion_ids = [ids for record in records for ids in record.completion_ids]
        rewards = torch.cat([record.rewards_per_func for record in records])[plan.gathered_index()]
        final = CallRecord([prompt_ids[i] for i in local], [completion_ids[i] for i in local], rewards)

        # The completions table: TRL's answer call wrote the last W * B rows of each column.
        logs, start = self._logs, len(self._logs["prompt"]) - rewards.size(0)
        for row, (round_, source) in enumerate(plan.gathered_sources()):
            if round_ == 0:
                continue
            table = tables[round_ - 1]
            for key in ("prompt", "completion", "advantages"):
                logs[key][start + row] = table[key][source]
            for group in ("rewards", "extra"):
                for name, values in table[group].items():
                    if name in logs[group]:
                        logs[group][name][start + row] = values[source]

        # TRL's frac_reward_zero_std of the first sampling becomes the trained batch's: the share of groups whose
        # weighted reward (all reward functions) is the same for every answer.
        total = (rewards * self.reward_weights.to(rewards.device)).nansum(dim=1)
        total[torch.isnan(rewards).all(dim=1)] = math.nan
        metrics["answer/frac_reward_zero_std_sampled"].append(metrics["frac_reward_zero_std"][-1])
        metrics["frac_reward_zero_std"][-1] = equal_reward_groups(total.cpu(), g_a).float().mean().item()
        metrics["answer/refilled_groups"].append(float(plan.replaced))
        metrics["answer/refill_rows"].append(float(sum(plan.round_sizes) * world * g_a))
        return answers, final

    def _log_histograms(self, mode, values):
        """Per-type distributions, on the loggers that take histograms; scalars go through TRL's metrics."""
        if mode != "train" or not self.accelerator.is_main_process:
            return
        for log in _histogram_sinks(self.callback_handler.callbacks):
            for name, tensor in values.items():
                if tensor.numel():
                    log(f"histograms/{name}", tensor.float(), self.state.global_step)

    def _span_masks(self, completion_ids, span, padded):
        start_tags, end_tag = span
        mask = torch.zeros_like(padded, dtype=torch.long)
        closed = []
        for row, ids in enumerate(completion_ids):
            row_mask, row_closed = span_token_mask(
                self.processing_class, ids, start_tags, end_tag, self.eos_token_ids, self.args.train_on_eos
            )
            mask[row, : len(row_mask)] = torch.tensor(row_mask, dtype=torch.long)
            closed.append(row_closed)
        return mask, closed

    def _log_turns(self, mode, answer_rewards, brier, answer_texts, answer_closed, confidence_ids, g_c):
        """The RLCR metrics (README, RLCRMultiTurnTrainer) over the gathered batch; the parsed confidence joins TRL's completions table."""
        device = self.accelerator.device
        args = self.args
        texts = self.processing_class.batch_decode(confidence_ids, skip_special_tokens=True)
        stated = [extract_confidence(t, args.confidence_tag, args.lenient_parsing) for t in texts]
        # float64: in float32, 0.8 becomes 0.80000001 and lands in the wrong ECE bin
        local_conf = torch.tensor([math.nan if c is None else c for c in stated], dtype=torch.float64, device=device)
        conf = self.accelerator.gather(local_conf).cpu()
        format_ok = self.accelerator.gather(torch.tensor(answer_closed, dtype=torch.float32, device=device)).cpu()
        tags = (args.confidence_tag, args.analysis_tag)
        leaks = [confidence_leak(text, tags) for text in answer_texts]
        leaked = self.accelerator.gather(torch.tensor(leaks, dtype=torch.float32, device=device)).cpu()

        # NaN rewards are "not applicable" (no gold answer): left out of every mean, as TRL's own reward metrics do.
        accuracy = answer_rewards[:, 0].cpu()
        scored = ~torch.isnan(answer_rewards).all(dim=1).cpu()
        answer_reward = (answer_rewards * self.reward_weights.to(answer_rewards.device)).nansum(dim=1).cpu()[scored]
        brier = brier.cpu()
        brier = brier[~torch.isnan(brier)]
        labels = accuracy.repeat_interleave(g_c)
        parsed = ~torch.isnan(conf)
        judged = parsed & ~torch.isnan(labels)

        m = self._metrics[mode]
        if (~torch.isnan(accuracy)).any():
            m["answer/accuracy"].append(accuracy.nanmean().item())
        if answer_reward.numel():
            m["answer/reward_mean"].append(answer_reward.mean().item())
            m["answer/reward_std"].append(answer_reward.std().item() if answer_reward.numel() > 1 else 0.0)
        m["answer/format_fail_rate"].append(1.0 - format_ok.mean().item())
        m["answer/confidence_leak_rate"].append(leaked.mean().item())
        if brier.numel():
            m["confidence/brier_reward_mean"].append(brier.mean().item())
            m["confidence/brier_reward_std"].append(brier.std().item() if brier.numel() > 1 else 0.0)
        m["confidence/parse_fail_rate"].append(1.0 - parsed.float().mean().item())
        if judged.any():
            report = calibration_report(conf[judged].tolist(), labels[judged].tolist())
            m["confidence/mean"].append(report.mean_confidence)
            m["calibration/ece"].append(report.ece)
            m["calibration/brier"].append(report.brier)
            if report.auroc is not None:  # undefined when all answers are right, or all wrong
                m["calibration/auroc"].append(report.auroc)
        # Collapse vs learning: no spread among siblings means no Brier difference to learn from; none across
        # answers means no discrimination; the correlation says whether confidence follows correctness.
        within, across = confidence_spread(conf, g_c)
        if within is not None:
            m["confidence/sibling_std"].append(within)
        if across is not None:
            m["confidence/answer_std"].append(across)
        if (correlation := confidence_correctness_correlation(conf, labels)) is not None:
            m["calibration/correlation"].append(correlation)

        self._log_histograms(
            mode,
            {
                "confidence/stated": conf[parsed],
                "answer/reward": answer_reward,
                "confidence/brier_reward": brier,
            },
        )

        # One value per answer row in TRL's completions table: the mean of its parsed confidences.
        per_answer = conf.view(-1, g_c)
        means = [row[~torch.isnan(row)].mean().item() if (~torch.isnan(row)).any() else None for row in per_answer]
        self._logs["extra"]["confidence"].extend(means)  # gathered, like TRL's prompt/completion columns


def _histogram_sinks(callbacks):
    """`log(name, values, step)` for each active logger that takes histograms (TensorBoard, W&B)."""
    from transformers.integrations import TensorBoardCallback, WandbCallback

    sinks = []
    for callback in callbacks:
        if isinstance(callback, TensorBoardCallback) and getattr(callback, "tb_writer", None) is not None:
            sinks.append(lambda name, values, step, w=callback.tb_writer: w.add_histogram(name, values, step))
        elif isinstance(callback, WandbCallback) and getattr(callback, "_wandb", None) is not None:
            wandb = callback._wandb
            if wandb.run is not None:
                sinks.append(
                    lambda name, values, step, w=wandb: w.log({name: w.Histogram(values.tolist())}, commit=False)
                )
    return sinks
