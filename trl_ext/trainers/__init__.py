from .replay_config import ReplayGRPOConfig
from .replay_trainer import ReplayGRPOTrainer
from .rlcr_config import RLCRMultiTurnConfig
from .rlcr_trainer import RLCRMultiTurnTrainer


__all__ = ["RLCRMultiTurnConfig", "RLCRMultiTurnTrainer", "ReplayGRPOConfig", "ReplayGRPOTrainer"]
