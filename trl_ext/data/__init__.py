"""Built-in datasets: graded arithmetic questions (levels 1-5) in TRL's conversational format, in three disjoint
splits (train, tune, report) decided by a hash of each question's normalised text."""

from .graded_arithmetic import SPLITS, graded_arithmetic, normalise_question, question_split


__all__ = ["SPLITS", "graded_arithmetic", "normalise_question", "question_split"]
