"""What TRL generated and scored in one call of `GRPOTrainer._generate_and_score_completions`.

That method returns padded tensors and advantages; the token ids of each row and the per-function rewards (gathered
over processes) stay inside it. A trainer that needs them afterwards (RLCR builds the confidence turn on the answer
ids and labels it with the accuracy reward; Replay judges and stores the fresh rollouts) holds a `CallRecord` while
the call runs, and `RecordsCalls` fills it from the two seams that see them.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .scoping import scoped_call


class GenerateOutput(NamedTuple):
    """What `GRPOTrainer._generate` returns, by name (TRL returns a plain tuple in this order, checked by
    tests/trainers/test_trl_seams.py)."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    tool_mask: list[list[int]] | None
    completions: list
    logprobs: list[list[float]] | None
    extra_fields: dict
    images: list | None
    tool_images: list


@dataclass
class CallRecord:
    """One call's generation (this process's rows) and rewards (every process's rows, as TRL gathers them)."""

    prompt_ids: list[list[int]] | None = None
    completion_ids: list[list[int]] | None = None
    rewards_per_func: torch.Tensor | None = None


class RecordsCalls:
    """Mixin for a `GRPOTrainer` subclass (listed before it): while `_record` holds a `CallRecord`, `_generate` and
    `_calculate_rewards` write what they return into it."""

    _record: CallRecord | None = None

    @contextmanager
    def recording(self, record: CallRecord | None = None):
        """Record the calls of TRL's seams made inside the block into `record` (a new `CallRecord` by default)."""
        record = CallRecord() if record is None else record
        with scoped_call(self, _record=record):
            yield record

    def _generate(self, prompts):
        output = super()._generate(prompts)
        if self._record is not None:
            generated = GenerateOutput(*output)
            self._record.prompt_ids, self._record.completion_ids = generated.prompt_ids, generated.completion_ids
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._record is not None:
            self._record.rewards_per_func = rewards
        return rewards
