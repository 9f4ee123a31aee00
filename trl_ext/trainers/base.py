"""The base the three trainers and their configs share: `TrlExtGRPOConfig` and `TrlExtGRPOTrainer`.

`TrlExtGRPOConfig` is `GRPOConfig` with the fields every trainer reads (held-out evaluation, CPU log-prob tiles) and
activation checkpointing under its transformers 5 name. TRL 1.16 gives `gradient_checkpointing` a default (`True`), and
transformers 5 deprecated that name in favour of `activation_checkpointing`: every `GRPOConfig` then warns, whether or
not the user set anything. Here neither name has a default; when both are unset, activation checkpointing takes TRL's
default (on), so only a user who writes the old name sees the deprecation warning (and gets the value written).

`TrlExtGRPOTrainer` is `GRPOTrainer` with the seams (`seams/`) that every trainer mixes in; each algorithm subclasses
it and adds the seams of its own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from trl import GRPOConfig, GRPOTrainer

from ..models.logprob_tiles import CPULogprobTiles
from .seams.generation_backends import GenerationBackends
from .seams.heldout import HeldoutEvaluation
from .seams.model_card import ModelCardMixin
from .seams.trainer_state import CheckpointStateMixin


@dataclass
class TrlExtGRPOConfig(GRPOConfig):
    r"""
    [`~trl.GRPOConfig`] with TRL's activation-checkpointing default under the name transformers 5 uses.

    Parameters:
        activation_checkpointing (`bool`, *optional*, defaults to `True`):
            Recompute activations in the backward pass to save memory, at the cost of extra forward compute in each
            backward pass. TRL's default for GRPO.
        gradient_checkpointing (`bool`, *optional*):
            Deprecated alias of `activation_checkpointing` (transformers 5); used only when that is unset.

        cpu_logprob_tile_tokens (`int`, *optional*, defaults to `256`):
            Tokens per tile of TRL's fused log-prob computation on CPU, where the trainers also score only the
            labelled (completion) positions, as TRL does with Triton, instead of every prompt and padding position.
            TRL's 4096 makes its CPU backward hold about 4 GB of float32 temporaries at once; smaller tiles give the
            same values with less memory. No effect on CUDA. `None` keeps TRL's size (see
            `trl_ext/models/logprob_tiles.py`).
        shared_prefill (`bool`, *optional*, defaults to `True`):
            Without vLLM, prefill the prompt positions that a generation call's rows share once: the prefix common to
            every row (chat template, system prompt) and each prompt repeated in a group, then copy their key/value
            cache to the rows (`trl_ext/models/shared_prefill.py`). The same completions up to floating-point
            rounding, in less time where prefill dominates (CPU). Off under FSDP and under ZeRO-3 without
            `ds3_gather_for_generation`, where every forward is a collective. vLLM caches prefixes itself.

        > Parameters of the held-out evaluation (`trainer.evaluate()`, run every `eval_steps` with
        > `eval_strategy="steps"` on `eval_dataset`; see docs/recipes.md#held-out-evaluation-during-training)

        eval_temperature (`float`, *optional*, defaults to `0.0`):
            Sampling temperature of the evaluation's generation. `0.0` is greedy decoding. The turn's other generation
            settings (`generation_kwargs`, ...) are kept; its length is the training turn's.
        eval_num_samples (`int`, *optional*, defaults to `1`):
            Completions sampled per evaluation question (k, for mean@k and pass@k). Above 1 it needs
            `eval_temperature > 0` (greedy samples would all be the same). Sampling is seeded with `seed`. TRL's
            `num_generations_eval`, the group size of TRL's own evaluation loop (which `evaluate()` runs too, for
            its loss), defaults to it, so TRL's eval batch-size check reads this count.
        eval_trl_loop (`bool`, *optional*, defaults to `True`):
            Whether `evaluate()` also runs `GRPOTrainer`'s evaluation loop (`eval_loss` and its rollout metrics, from
            a sampled generation over the whole evaluation set, every row kind included) beside the held-out metrics.
            `False` reports the held-out metrics alone (`heldout_evaluate()`), at a fraction of the cost: RLCR's loop
            samples `num_generations * num_generations_confidence` rows per question. Keep `True` for
            `metric_for_best_model="eval_loss"` or `load_best_model_at_end`.
    """

    activation_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute activations in the backward pass to save memory (default: True, as in TRL)."},
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of `activation_checkpointing`."}
    )

    cpu_logprob_tile_tokens: int | None = field(
        default=256,
        metadata={"help": "Tokens per tile of TRL's log-prob computation without Triton (CPU); None: TRL's 4096."},
    )

    shared_prefill: bool = field(
        default=True,
        metadata={"help": "Without vLLM, prefill the prompt positions a generation call's rows share only once."},
    )

    eval_temperature: float = field(
        default=0.0,
        metadata={"help": "Sampling temperature of the held-out evaluation's generation; 0 is greedy decoding."},
    )
    eval_num_samples: int = field(
        default=1,
        metadata={"help": "Completions per evaluation question (k of mean@k); above 1 needs eval_temperature > 0."},
    )

    eval_trl_loop: bool = field(
        default=True,
        metadata={
            "help": "evaluate() also runs GRPOTrainer's evaluation loop (eval_loss); False: held-out metrics only."
        },
    )

    def __post_init__(self):
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        if self.cpu_logprob_tile_tokens is not None and self.cpu_logprob_tile_tokens < 1:
            raise ValueError(
                f"cpu_logprob_tile_tokens must be a positive number of tokens or None, got {self.cpu_logprob_tile_tokens}."
            )
        if not self.eval_temperature >= 0:
            raise ValueError(f"eval_temperature must be >= 0 (0 is greedy decoding), got {self.eval_temperature}.")
        if self.eval_num_samples < 1:
            raise ValueError(f"eval_num_samples must be at least 1, got {self.eval_num_samples}.")
        if self.eval_num_samples > 1 and self.eval_temperature == 0:
            raise ValueError(
                f"eval_num_samples={self.eval_num_samples} with eval_temperature=0: greedy decoding gives the same "
                "completion every time; set eval_temperature > 0 to sample them, or eval_num_samples=1."
            )
        if self.num_generations_eval is None:
            self.num_generations_eval = self.eval_num_samples
        super().__post_init__()

    def check_turns(self, kwargs_field: str, length_field: str, temperature_field: str, rows: str) -> None:
        """Refuse bad settings of a trainer's two turns: the second turn's length (`length_field`), each turn's
        generation kwargs (`generation_kwargs`, `kwargs_field`) and the second turn's temperature, at which its
        `rows`' log-probs are computed."""
        if getattr(self, length_field) < 1:
            raise ValueError(f"{length_field} must be positive (got {getattr(self, length_field)}).")
        self.check_generation_kwargs("generation_kwargs", "max_completion_length", temperature_field="temperature")
        self.check_generation_kwargs(kwargs_field, length_field, temperature_field=temperature_field)
        self.check_turn_temperature(temperature_field, rows)

    def check_turn_temperature(self, field_name: str, rows: str) -> None:
        """Refuse a turn's own temperature (`field_name`, `None`: the main turn's) unless positive and finite: the
        log-probs of that turn's `rows` are computed at it."""
        value = getattr(self, field_name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(
                f"{field_name} must be a positive, finite sampling temperature or None (got {value}): the {rows}' "
                "log-probs are computed at it."
            )

    def check_generation_kwargs(
        self,
        name: str,
        length_field: str | None,
        one_per_request: bool = False,
        temperature_field: str | None = None,
    ) -> None:
        """Refuse, naming `name`, generation kwargs that would override a setting of their turn or defeat a group.

        `length_field`: the setting that owns the turn's length (then `max_tokens`/`max_new_tokens` are refused).
        `one_per_request`: some rows of a group are sent one per request (`n=1`), where a fixed `seed` makes them
        identical; vLLM's colocate mode always does so.
        `temperature_field`: the setting that owns the turn's temperature (then `temperature` is refused: the turn's
        log-probs are computed at that setting, so a temperature given here would make training off-policy).
        """
        kwargs = getattr(self, name)
        if kwargs is None:
            return
        if not isinstance(kwargs, dict):
            raise ValueError(f"{name} must be a dict (or a JSON object string), got {type(kwargs).__name__}.")
        if "n" in kwargs:
            raise ValueError(
                f"{name}['n'] would replace the number of samples per prompt that the trainer requests (its group "
                "size); remove it and set the group size field (num_generations, ...) instead."
            )
        for key in ("max_tokens", "max_new_tokens"):
            if length_field is not None and key in kwargs:
                raise ValueError(
                    f"{name}[{key!r}] would override {length_field}, the length this turn is generated with; remove "
                    f"it and set {length_field} instead."
                )
        if temperature_field is not None and "temperature" in kwargs:
            raise ValueError(
                f"{name}['temperature'] would sample this turn at a temperature its log-probs are not computed at "
                f"(training would be off-policy); remove it and set {temperature_field} instead."
            )
        if "seed" in kwargs and (one_per_request or (self.use_vllm and self.vllm_mode == "colocate")):
            raise ValueError(
                f"{name}['seed'] gives every request the same seed, and here the rows of a group are sampled one per "
                "request (vLLM colocate mode, replayed groups' fresh rows), so they would all be identical; remove "
                "it (TrainingArguments.seed still seeds the run)."
            )


class TrlExtGRPOTrainer(
    CheckpointStateMixin,
    ModelCardMixin,
    CPULogprobTiles,
    HeldoutEvaluation,
    GenerationBackends,
    GRPOTrainer,
):
    """[`~trl.GRPOTrainer`] with the seams the three trl-ext trainers share; not meant to be used on its own.

    Overrides from `GRPOTrainer`, each through a mixin of `seams/` (listed in MRO order):
    - `train`, `_save_checkpoint`, `_load_optimizer_and_scheduler` (`CheckpointStateMixin`): the subclass's
      `checkpoint_state()` is saved in every checkpoint and restored on resume.
    - `create_model_card` (`ModelCardMixin`): TRL's card with the resolved base model, the data and the results.
    - `training_step`, `evaluate` (`CPULogprobTiles`): smaller log-prob tiles on CPU.
    - `evaluate` (`HeldoutEvaluation`): TRL's evaluation loss plus the held-out metrics, which the subclass defines
      in `_heldout_records` and `_heldout_metrics`.
    - `_generate_single_turn`, `_prepare_inputs` (`GenerationBackends`): colocated vLLM in sleep mode stays awake for
      a whole batch.

    Inherits everything else from `GRPOTrainer` unchanged: the generation backends, old/reference log-probs, reward
    gathering, advantages, the loss of every `loss_type`, logging and the completions table.
    """

    @staticmethod
    def _empty_logs() -> dict:
        """A fresh `GRPOTrainer._logs` (the completions table's columns). Scoped as `_logs` around a call of
        `_generate_and_score_completions` for a second row kind, it keeps TRL's table about the main kind: the table's
        columns must have equal lengths."""
        return {
            "images": [],
            "prompt": [],
            "completion": [],
            "rewards": defaultdict(list),
            "advantages": [],
            "extra": defaultdict(list),
        }
