"""Held-out evaluation during training, on the trainer's own generation path (docs/recipes.md#held-out-evaluation-during-training).

`HeldoutEvaluation` overrides `Trainer.evaluate`, which transformers calls every `eval_steps` under
`eval_strategy="steps"` (and at the end of each epoch under `"epoch"`): instead of TRL's evaluation loss over
`eval_dataset`, the trainer answers the evaluation questions and reports the metrics its paper does. Each process
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

import math
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from trl.data_utils import is_conversational

from ..evaluation.records import DEFAULT_GROUP_COLUMN, with_questions, write_jsonl
from ..evaluation.solver import reply_message
from .scoping import TurnGeneration, evaluation_generation, scoped_call


class HeldoutEvaluation:
    """Mixin for a `GRPOTrainer` subclass (listed before it): `evaluate()` runs the held-out evaluation."""

    heldout_records: list[dict] | None = None
    """The per-sample records of the last split `evaluate()` ran (every process's samples, in question order,
    `eval_num_samples` per question; identical on every process), for reports and plots beyond the logged metrics."""
    heldout_step: int | None = None
    """The training step (`state.global_step`) at which those records were made."""
    heldout_group_column: str | None = DEFAULT_GROUP_COLUMN
    """The evaluation rows' column copied into each record as its `group` (the metrics within groups use it)."""

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Answer the evaluation questions with the current model and log the trainer's held-out metrics.

        Args:
            eval_dataset: The questions (default: the trainer's `eval_dataset`); a dict of datasets evaluates each,
                its name joining the prefix (`eval_<name>_...`), as `Trainer.evaluate` does.
            ignore_keys: Unused (no model outputs are gathered).
            metric_key_prefix: Prefix of the metric names (`eval`: `eval_answer/accuracy`, shown as
                `eval/answer/accuracy` by W&B and TensorBoard).

        Returns:
            The metrics, as logged (also in `trainer.state.log_history`). Identical on every process.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            metrics = {}
            for name, split in dataset.items():
                metrics.update(self.evaluate(split, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        if dataset is None:
            raise ValueError("evaluate() needs evaluation questions: pass eval_dataset to the trainer or the call.")
        if self.tools:
            raise ValueError(
                "The held-out evaluation generates single turns; with tools or an environment_factory the solver's "
                "episodes need TRL's tool loop, which it does not run. Set eval_strategy='no'."
            )
        start = time.monotonic()
        rows = [dict(row) for row in dataset]
        if not rows:
            raise ValueError("the evaluation dataset is empty.")
        num_samples = self.args.eval_num_samples
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        share = math.ceil(len(rows) / world)
        indices = list(range(rank * share, min((rank + 1) * share, len(rows))))
        padding = share - len(indices)
        local = [rows[i] for i in indices] + [rows[0]] * padding  # copies of a real row: the same calls everywhere
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
        kept = records[: len(indices) * num_samples]  # padding rows come last
        gathered = gather_object([kept])
        records = [record for part in gathered for record in part]
        self.heldout_records = with_questions(records, rows, num_samples, self.heldout_group_column)
        self.heldout_step = self.state.global_step
        if self.accelerator.is_main_process:  # per-sample records beside the log, one file per evaluation
            name = f"{metric_key_prefix}_step{self.state.global_step}.jsonl"
            write_jsonl(Path(self.args.output_dir) / "heldout" / name, self.heldout_records)
        metrics = self._heldout_metrics(rows, self.heldout_records)
        metrics["seconds"] = time.monotonic() - start
        logs = {f"{metric_key_prefix}_{name}": value for name, value in metrics.items()}
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
