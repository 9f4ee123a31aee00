"""The three trainers (GRPOTrainer subclasses), their configs, and the seams and state they share."""

from .absolute_zero_config import AbsoluteZeroConfig
from .absolute_zero_trainer import AbsoluteZeroTrainer
from .replay_config import ReplayGRPOConfig
from .replay_trainer import ReplayGRPOTrainer
from .rlcr_config import RLCRMultiTurnConfig
from .rlcr_trainer import RLCRMultiTurnTrainer
from .seams.tool_rounds import CollectiveToolRounds


__all__ = [
    "AbsoluteZeroConfig",
    "AbsoluteZeroTrainer",
    "CollectiveToolRounds",
    "RLCRMultiTurnConfig",
    "RLCRMultiTurnTrainer",
    "ReplayGRPOConfig",
    "ReplayGRPOTrainer",
]
