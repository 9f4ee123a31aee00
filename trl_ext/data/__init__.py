"""Built-in datasets: graded arithmetic questions (levels 1-5) in TRL's conversational format."""

from .graded_arithmetic import graded_arithmetic


__all__ = ["graded_arithmetic"]
