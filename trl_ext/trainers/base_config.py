"""`GRPOConfig` as the trl-ext configs inherit it: activation checkpointing under its transformers 5 name.

TRL 1.16 gives `gradient_checkpointing` a default (`True`), and transformers 5 deprecated that name in favour of
`activation_checkpointing`: every `GRPOConfig` then warns, whether or not the user set anything. Here neither name has
a default; when both are unset, activation checkpointing takes TRL's default (on), so only a user who writes the old
name sees the deprecation warning (and gets the value written).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig


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
    """

    activation_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute activations in the backward pass to save memory (default: True, as in TRL)."},
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of `activation_checkpointing`."}
    )

    def __post_init__(self):
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        super().__post_init__()
