"""The loss forward of a micro-batch that mixes row kinds, one forward per kind, for the trainers whose kinds pad
differently (RLCR: answers and confidence turns; Absolute Zero: solver and proposer rows)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model

from ...core.batch import scatter_rows, trim_padding
from ...models.logprob_tiles import FusedHeadTemperatures


@dataclass(frozen=True)
class KindRows:
    """What the loss forward is told about its micro-batch: each row's kind (`None`: all of the first of
    `ROW_KINDS`) and which rows carry loss (`None`: all)."""

    kinds: torch.Tensor | None
    scored: torch.Tensor | None = None


class RowKindForwards:
    """Score each row kind of a loss micro-batch in a forward of its own, cut to the columns its rows use.

    A shared micro-batch pads every row to the longest prompt and completion of any kind; trimmed, a kind's forward
    processes only its own. The model sees positions 0..L-1 whatever the padding (as in TRL's batches), so with rotary
    embeddings a row's log-probs do not depend on how much padding precedes it.

    Each forward (and its backward) is a collective under DDP (buffer broadcast), ZeRO-3 and FSDP (parameter gathers),
    so the number of forwards may not depend on which rows a process holds
    (docs/design.md#multi-process-invariants): with several processes every kind in `ROW_KINDS` gets a forward, a
    one-row stand-in where this process has no row of it. One process scores only the kinds it holds.

    Each kind is scored at the temperature its rows were sampled at (`_kind_temperatures`, set by the trainer; a kind
    not named there: TRL's `temperature`), as are the old and reference log-probs of its turn (`_fused_heads.at`), so
    the importance-sampling ratio of a row is 1 when nothing but the temperature differs between turns.
    """

    ROW_KINDS: tuple[int, ...] = ()
    _kind_rows: KindRows | None = None  # scoped by the trainer's `_compute_loss` for the loss forward only

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._kind_temperatures: dict[int, float] = {}
        # The heads TRL patched at init: the policy's (under PEFT, its base model's) and the reference model's.
        heads = [(self.model.get_base_model() if is_peft_model(self.model) else self.model, ("log_probs", "entropy"))]
        if self.ref_model is not None:
            heads.append((self.accelerator.unwrap_model(self.ref_model), ("log_probs",)))
        self._fused_heads = FusedHeadTemperatures(heads, self.temperature, self.args.cast_lm_head_to_fp32)

    def _set_kind_temperatures(self, temperatures: dict[int, float]) -> None:
        """Score each kind's rows at its sampling temperature. TRL's auxiliary-loss forward (MoE router loss) scores a
        micro-batch in one pass, so kinds at different temperatures are refused there."""
        self._kind_temperatures = {kind: float(t) for kind, t in temperatures.items()}
        if self._temperatures_differ() and self.aux_loss_enabled:
            raise ValueError(
                "Row kinds sampled at different temperatures need a forward per kind, but this model's router "
                "auxiliary loss is computed over the whole micro-batch in TRL's forward; set router_aux_loss_coef=0 "
                "or give every turn the same temperature."
            )

    def _kind_temperature(self, kind: int) -> float:
        return self._kind_temperatures.get(kind, self.temperature)

    def _temperatures_differ(self) -> bool:
        return len({self._kind_temperature(kind) for kind in self.ROW_KINDS}) > 1

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **kwargs,
    ):
        """Text-only passes the trainer scores itself (`_own_logps_and_entropies`); every other pass (auxiliary
        losses, multimodal rows, and whatever the trainer leaves to TRL) is TRL's."""
        multimodal = any(value is not None for value in kwargs.values())
        if not compute_aux_loss and not multimodal:
            own = self._own_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
            )
            if own is not None:
                return (*own, None)
        return super()._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size,
            compute_entropy,
            compute_aux_loss,
            **kwargs,
        )

    def _own_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy):
        """`(log-probs, entropies or None)` of a text-only pass, or `None` to leave it to TRL: the loss forward by kind
        (`_kind_rows` set); old and reference log-probs and the evaluation are TRL's. Trainers extend it."""
        rows = self._kind_rows
        if rows is None:
            return None
        kinds = rows.kinds if rows.kinds is not None else torch.full((input_ids.size(0),), self.ROW_KINDS[0])
        return self._forward_by_kind(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, kinds, rows.scored
        )

    def _forward_by_kind(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, kinds, scored=None
    ):
        """`(per-token log-probs, entropies or None)` of every row, each kind scored in its own forward; rows where
        `scored` is False get 0 without a forward (their loss is 0 either way)."""
        num_rows, device = input_ids.size(0), input_ids.device
        kinds = kinds.to(device)
        scored = torch.ones(num_rows, dtype=torch.bool, device=device) if scored is None else scored.to(device)
        held = kinds[scored].unique().tolist()
        parts, stand_ins = [], []
        for kind in self.ROW_KINDS if self.accelerator.num_processes > 1 else held:
            index = torch.nonzero(scored & (kinds == kind)).flatten()
            if index.numel() == 0:
                stand_ins.append(self._stand_in_forward(model, input_ids))
                continue
            ids, mask, keep = trim_padding(input_ids[index], attention_mask[index], logits_to_keep)
            with self._fused_heads.at(self._kind_temperature(kind)):
                logps, entropies, _ = super()._get_per_token_logps_and_entropies(
                    model, ids, mask, keep, batch_size, compute_entropy
                )
            parts.append((index, logps, entropies))
        if not parts and not stand_ins:  # nothing scored: the loss still needs a graph to run its backward
            stand_ins.append(self._stand_in_forward(model, input_ids))
        logps = scatter_rows([(index, lp) for index, lp, _ in parts], num_rows, logits_to_keep, device)
        entropies = None
        if compute_entropy:
            entropies = scatter_rows([(index, e) for index, _, e in parts], num_rows, logits_to_keep, device)
        for zero in stand_ins:
            logps = logps + zero  # exactly 0: the stand-in joins the graph, so its backward runs too
        return logps, entropies

    def _stand_in_forward(self, model, input_ids):
        """Forward one short row for a kind this process lacks; returns a zero joined to its graph."""
        ids = input_ids[:1, -2:]
        logps, _, _ = super()._get_per_token_logps_and_entropies(model, ids, torch.ones_like(ids), 1)
        return (logps.sum() * 0.0).nan_to_num(0.0)
