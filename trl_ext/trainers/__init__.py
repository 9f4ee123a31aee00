from .rlcr_config import RLCRMultiTurnConfig
from .rlcr_trainer import RLCRMultiTurnTrainer


__all__ = ["RLCRMultiTurnConfig", "RLCRMultiTurnTrainer"]
