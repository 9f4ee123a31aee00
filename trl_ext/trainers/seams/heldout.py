"""Held-out evaluation during training, on the trainer's own generation path (docs/recipes.md#held-out-evaluation-during-training).

`HeldoutEvaluation` extends `Trainer.evaluate`, which transformers calls every `eval_steps` under
`eval_strategy="steps"` (and at the end of each epoch under `"epoch"`): besides TRL's evaluation loss and metrics over
`eval_dataset` (GRPOTrainer's contract: `eval_loss`, `eval_<name>_loss` for a dict of datasets), the trainer answers
the evaluation questions and adds the metrics its paper reports to the same log. `heldout_evaluate()` runs the
held-out evaluation alone. Each process
takes an equal share of the questions (the last ones padded with copies of a real question, whose results are
dropped), generates through `_generate_single_turn` (so vLLM server and colocate modes and transformers all work, and
every process makes the same calls with the same row counts), scores its rows with the trainer's reward functions
(`_calculate_rewards`, itself a collective), and the per-sample records are gathered (`gather_object`): the metrics
are computed over the whole set on every process, identically, by the pure functions of
`trl_ext.evaluation.heldout_metrics`.

Generation settings for the evaluation are applied for its calls only (`scoping.evaluation_generation`): greedy by
default, or `eval_num_samples` completions per question sampled at `eval_temperature`, seeded with `args.seed`.

Each record also carries its question (`prompt`) and group (`group`: the `heldout_group_column` of its row, the
level by default), and the main process writes them to `<output_dir>/heldout/<prefix>_step<N>.jsonl`.

A trainer implements `_heldout_records(rows, num_samples)` (one record per sample, `num_samples` per row in row order,
the same number of generation calls whatever the rows) and `_heldout_metrics(rows, records)`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NamedTuple

import torch
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from trl.data_utils import is_conversational

from ...evaluation.records import DEFAULT_GROUP_COLUMN, with_questions, write_jsonl
from ...evaluation.solver import reply_message
from .row_batches import process_share
from .scoping import TurnGeneration, evaluation_generation, scoped_call


logger = logging.getLogger(__name__)


class HeldoutSamples(NamedTuple):
    """A held-out batch's samples, `num_samples` per question in question order."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    completions: list
    """As reward functions get them (`_heldout_completions`)."""
    rewards: torch.Tensor
    """`(samples, reward functions)`, NaN where a reward function returned `None`."""


class HeldoutEvaluation:
    """Mixin for a `GRPOTrainer` subclass (listed before it): `evaluate()` adds the held-out evaluation to TRL's."""

    heldout_records: list[dict] | None = None
    """The per-sample records of the last split `evaluate()` (or `heldout_evaluate()`) ran (every process's samples, in question order,
    `eval_num_samples` per question; identical on every process), for reports and plots beyond the logged metrics."""
    heldout_step: int | None = None
    """The training step (`state.global_step`) at which those records were made."""
    heldout_group_column: str | None = DEFAULT_GROUP_COLUMN
    """The evaluation rows' column copied into each record as its `group` (the metrics within groups use it)."""
    _warned_tools = False

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """`GRPOTrainer.evaluate` (its loss and metrics over the evaluation set), with the trainer's held-out metrics
        added to the same log: the evaluation questions answered by the current model (`heldout_evaluate`).

        Args:
            eval_dataset: The questions (default: the trainer's `eval_dataset`); a dict of datasets (or a
                `DatasetDict`) evaluates each, its name joining the prefix (`eval_<name>_loss`,
                `eval_<name>_answer/accuracy`), as `Trainer.evaluate` does.
            ignore_keys: As `Trainer.evaluate`.
            metric_key_prefix: Prefix of the metric names (`eval`: `eval_loss`, `eval_answer/accuracy`, shown as
                `eval/answer/accuracy` by W&B and TensorBoard).

        Returns:
            The metrics, as logged in one entry of `trainer.state.log_history`. Where a metric of TRL's evaluation
            loop (its sampled rollouts) has the name of a held-out one, it is logged as `<prefix>_rollout/<name>`.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            metrics = {}
            for name, split in dataset.items():
                metrics.update(self.evaluate(split, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        if isinstance(dataset, str):  # a name of the trainer's dict of datasets (Trainer's own recursion)
            dataset = self.eval_dataset[dataset]
        if not self.args.eval_trl_loop:
            return self.heldout_evaluate(dataset, metric_key_prefix)
        if self.tools:  # the held-out evaluation runs single turns; TRL's loop runs the tool episodes
            if not self._warned_tools:
                logger.warning("With tools, evaluate() reports TRL's evaluation loss and metrics only.")
                self._warned_tools = True
            heldout = {}
        else:
            heldout = self._heldout_evaluation(dataset, metric_key_prefix)
        log = self.log

        def log_with_heldout(logs, *args, **kwargs):
            # TRL's log merges the evaluation loop's metrics (`_metrics["eval"]`, prefixed `eval_`) into `logs`
            loop = self._metrics["eval"]
            for key in [key for key in loop if f"eval_{key}" in heldout]:
                loop[f"rollout/{key}"] = loop.pop(key)
            logs.update(heldout)
            return log(logs, *args, **kwargs)

        was_training = self.model.training
        try:
            with scoped_call(self, log=log_with_heldout):
                return super().evaluate(dataset, ignore_keys, metric_key_prefix)
        finally:
            self.model.train(was_training)  # TRL's loop leaves the model in eval mode

    def heldout_evaluate(self, eval_dataset=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """The held-out evaluation alone (no evaluation loss), logged: the metrics `evaluate()` adds to TRL's."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            metrics = {}
            for name, split in dataset.items():
                metrics.update(self.heldout_evaluate(split, f"{metric_key_prefix}_{name}"))
            return metrics
        logs = self._heldout_evaluation(dataset, metric_key_prefix)
        was_training = self.model.training
        # GRPOTrainer.log reads the mode from the model: in eval mode it adds (and clears) only eval metrics, such as
        # the generation's `generation/prompts_over_context`, and leaves the training metrics for the next log.
        self.model.eval()
        try:
            with scoped_call(self, log_completions=False):  # TRL's table holds training completions
                self.log(dict(logs))
        finally:
            self.model.train(was_training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, logs)
        return logs

    def _heldout_evaluation(self, dataset, metric_key_prefix: str) -> dict[str, float]:
        """Answer the evaluation questions with the current model: the held-out metrics, prefixed, not logged.
        Identical on every process."""
        if dataset is None:
            raise ValueError("evaluate() needs evaluation questions: pass eval_dataset to the trainer or the call.")
        if self.tools:
            raise ValueError(
                "The held-out evaluation generates single turns; with tools or an environment_factory the solver's "
                "episodes need TRL's tool loop, which it does not run; evaluate() reports TRL's evaluation loss alone."
            )
        start = time.monotonic()
        rows = [dict(row) for row in dataset]
        if not rows:
            raise ValueError("the evaluation dataset is empty.")
        num_samples = self.args.eval_num_samples
        local, num_real = process_share(self.accelerator, rows)  # padded with copies of a real row
        share = len(local)
        records = []
        chunk = max(self.args.per_device_eval_batch_size, 1)
        was_training = self.model.training
        self.model.eval()
        try:
            with self._heldout_scope():
                batches = tqdm(
                    range(0, share, chunk),
                    desc="held-out evaluation",
                    disable=self.args.disable_tqdm or not self.is_local_process_zero(),
                    leave=False,
                )
                for begin in batches:
                    records += self._heldout_records(local[begin : begin + chunk], num_samples)
        finally:
            self.model.train(was_training)
        if len(records) != share * num_samples:
            raise RuntimeError(f"{len(records)} evaluation records for {share} rows of {num_samples} samples.")
        kept = records[: num_real * num_samples]  # padding rows come last
        gathered = gather_object([kept])
        records = [record for part in gathered for record in part]
        self.heldout_records = with_questions(records, rows, num_samples, self.heldout_group_column)
        self.heldout_step = self.state.global_step
        if self.accelerator.is_main_process:  # per-sample records beside the log, one file per evaluation
            name = f"{metric_key_prefix}_step{self.state.global_step}.jsonl"
            write_jsonl(Path(self.args.output_dir) / "heldout" / name, self.heldout_records)
        metrics = self._heldout_metrics(rows, self.heldout_records)
        metrics["seconds"] = time.monotonic() - start
        return {f"{metric_key_prefix}_{name}": value for name, value in metrics.items()}

    @contextmanager
    def _heldout_scope(self):
        """No reward-function metrics or extra columns leak into the next training log; sampled evaluation seeded."""
        seeded = nullcontext()
        if self.args.eval_temperature > 0 and not self.use_vllm:
            devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
            seeded = torch.random.fork_rng(devices=devices)
        with (
            scoped_call(self, _pending_metrics=defaultdict(list), _pending_extra_logs=defaultdict(list)),
            seeded,
        ):
            if self.args.eval_temperature > 0 and not self.use_vllm:
                torch.manual_seed(self.args.seed)
            yield

    # -- helpers for the trainers' `_heldout_records` ---------------------------------------------------------------
    def _heldout_samples(self, rows: list[dict], prompts: list, num_samples: int, turn: TurnGeneration):
        """`num_samples` completions of each of `prompts` (one per row of `rows`) with `turn`'s settings and the
        training turn's length, and their rewards from every reward function, as training computes them."""
        prompt_ids = self._heldout_prompt_ids(prompts)
        completion_ids = self._heldout_generate(prompt_ids, num_samples, turn, self.args.max_completion_length)
        sample_rows = [row for row in rows for _ in range(num_samples)]
        sample_prompts = [prompt for prompt in prompts for _ in range(num_samples)]
        sample_prompt_ids = [ids for ids in prompt_ids for _ in range(num_samples)]
        completions = self._heldout_completions(sample_prompts, sample_prompt_ids, completion_ids)
        rewards = self._heldout_rewards(sample_rows, sample_prompts, completions, completion_ids)
        return HeldoutSamples(sample_prompt_ids, completion_ids, completions, rewards)

    def _heldout_generate(
        self, prompt_ids: list[list[int]], num_samples: int, turn: TurnGeneration, max_new_tokens: int
    ) -> list[list[int]]:
        """`num_samples` completions per prompt (consecutive), through `_generate_single_turn` with `turn`'s settings
        turned into the evaluation's, and its length."""
        rows = [list(ids) for ids in prompt_ids for _ in range(num_samples)]
        settings = evaluation_generation(self, turn, self.args.eval_temperature, self.args.seed)
        with scoped_call(self, max_new_tokens=max_new_tokens, generation=settings):
            completion_ids, _ = self._generate_single_turn(rows, None, {}, num_samples)
        return [list(ids) for ids in completion_ids]

    def _heldout_prompt_ids(self, prompts: list) -> list[list[int]]:
        """Generation prompt ids of conversations, rendered as TRL renders its training prompts."""
        return [list(ids) for ids in self._tokenize_prompts(prompts)[0]]

    def _heldout_completions(self, prompts: list, prompt_ids: list[list[int]], completion_ids: list[list[int]]):
        """The completions as TRL's `_generate` passes them to reward functions: a one-message list per completion
        of a conversation (parsed by the tokenizer's response parser when it has one), else the decoded text."""
        if not is_conversational({"prompt": prompts[0]}):
            return self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return [[reply_message(self._tokenizer, c, p)] for p, c in zip(prompt_ids, completion_ids, strict=True)]

    def _heldout_rewards(self, rows, prompts, completions, completion_ids) -> torch.Tensor:
        """This process's rows' `(rows, reward functions)` rewards from `_calculate_rewards` (NaN: `None`), a
        collective called with the same row count everywhere. Columns missing from some rows are `None` there."""
        keys = sorted({key for row in rows for key in row})
        inputs = [{key: row.get(key) for key in keys} for row in rows]
        rewards = self._calculate_rewards(inputs, prompts, completions, completion_ids)
        start = self.accelerator.process_index * len(rows)
        return rewards[start : start + len(rows)].cpu()

    def _heldout_records(self, rows: list[dict], num_samples: int) -> list[dict]:
        raise NotImplementedError

    def _heldout_metrics(self, rows: list[dict], records: list[dict]) -> dict[str, float]:
        raise NotImplementedError


def nan_to_none(value: float) -> float | None:
    return None if math.isnan(value) else float(value)
