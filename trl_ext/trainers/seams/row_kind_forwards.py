"""Trainers whose batch holds two row kinds (RLCR: answers and confidence turns; Absolute Zero: solver and proposer
rows): each kind's turn settings, the call of TRL's batch code that builds the second kind's rows, and the loss
forward of a micro-batch that mixes the kinds, one forward per kind (the kinds pad differently)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model

from ...core.batch import scatter_rows, trim_padding
from ...models.logprob_tiles import FusedHeadTemperatures
from .scoping import TurnGeneration, scoped_call, turn_generations, use_turn_generation


@dataclass(frozen=True)
class ForwardRows:
    """What a forward pass is told about the rows it scores, scoped by the trainer around the passes it shapes.

    `kinds`: each row's kind, set for the loss forward, which scores each kind on its own (`None`: TRL's forward).
    `scored`: which rows carry loss (`None`: all); the others get log-probs 0 without a forward.
    `families`: each row's family, whose rows are then packed around their shared prefix (RLCR)."""

    kinds: torch.Tensor | None = None
    scored: torch.Tensor | None = None
    families: torch.Tensor | None = None


@dataclass(frozen=True)
class KindCall:
    """What differs when `GRPOTrainer._generate_and_score_completions` builds the second row kind's rows (RLCR's
    confidences, Absolute Zero's proposals) rather than the main kind's: set once at init, passed to
    `RowKindForwards._kind_call`."""

    prefix: str
    """The metrics TRL logs in the call move under `<prefix>/`, so its own names keep describing the main kind."""
    group_size: int
    reward_func_names: list[str]
    temperature: float
    """The kind's sampling temperature, at which its old and reference log-probs are computed too."""
    reward_funcs: list | None = None
    """`None`: TRL's rewards are not computed but replayed by the caller (under the names above)."""
    scale_rewards: str | None = None
    """`None`: the trainer's."""
    generation: TurnGeneration | None = None
    """`None`: nothing is generated in the call (the caller replays recorded rows)."""
    max_new_tokens: int | None = None


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
    _forward_rows = ForwardRows()  # scoped by the trainer around the passes it shapes (the loss forward by kind)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._kind_temperatures: dict[int, float] = {}
        # The heads TRL patched at init: the policy's (under PEFT, its base model's) and the reference model's.
        heads = [(self.model.get_base_model() if is_peft_model(self.model) else self.model, ("log_probs", "entropy"))]
        if self.ref_model is not None:
            heads.append((self.accelerator.unwrap_model(self.ref_model), ("log_probs",)))
        self._fused_heads = FusedHeadTemperatures(heads, self.temperature, self.args.cast_lm_head_to_fp32)

    def _set_turns(self, main: str, second: str, second_kind: int, second_kwargs: dict | None, temperature: float):
        """Each turn's generation settings in `_generation` (the main turn's from `generation_kwargs` and the
        structured-outputs regex, the second's from `second_kwargs` at `temperature`), the main turn's made standing
        (TRL's own calls generate with them), and the second kind's rows scored at `temperature`.

        TRL's auxiliary-loss forward (MoE router loss) scores a micro-batch in one pass, so kinds at different
        temperatures are refused there."""
        args = self.args
        self._generation = turn_generations(
            self,
            {main: (args.generation_kwargs, args.vllm_structured_outputs_regex), second: (second_kwargs, None)},
            {second: temperature},
        )
        use_turn_generation(self, self._generation[main])
        self._kind_temperatures = {second_kind: float(temperature)}
        if self._temperatures_differ() and self.aux_loss_enabled:
            raise ValueError(
                "Row kinds sampled at different temperatures need a forward per kind, but this model's router "
                "auxiliary loss is computed over the whole micro-batch in TRL's forward; set router_aux_loss_coef=0 "
                "or give every turn the same temperature."
            )

    @contextmanager
    def _kind_call(self, call: KindCall, mode: str, **attributes):
        """Scope `call` (and the trainer's own `attributes`) around one call of TRL's
        `_generate_and_score_completions` that builds the second kind's rows; old and reference log-probs at the
        kind's temperature.

        TRL reads these settings from the trainer's attributes and takes no parameter for them: the scoped swap
        (`scoped_call`, which restores exactly what it shadowed) is the only seam, and this is the one place that
        makes it."""
        num_rewards = len(call.reward_func_names)
        trl = dict(
            num_generations=call.group_size,
            num_generations_eval=call.group_size,
            reward_func_names=list(call.reward_func_names),
            reward_weights=torch.ones(num_rewards),
            # "sum_then_normalize" is the path that honours `scale_rewards` (the other always divides by std)
            multi_objective_aggregation="sum_then_normalize",
            # TRL's completions table stays about the main kind (its columns must have equal lengths)
            _logs=self._empty_logs(),
        )
        if call.reward_funcs is not None:
            trl.update(reward_funcs=list(call.reward_funcs), reward_processing_classes=[None] * num_rewards)
        if call.scale_rewards is not None:
            trl["scale_rewards"] = call.scale_rewards
        with (
            scoped_call(
                self,
                mode=mode,
                prefix=call.prefix,
                max_new_tokens=call.max_new_tokens,
                generation=call.generation,
                **trl,
                **attributes,
            ),
            self._fused_heads.at(call.temperature),
        ):
            yield

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
        (`_forward_rows.kinds` set); old and reference log-probs and the evaluation are TRL's. Trainers extend it."""
        rows = self._forward_rows
        if rows.kinds is None:
            return None
        return self._forward_by_kind(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, rows.kinds, rows.scored
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
