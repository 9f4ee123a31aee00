from .arithmetic import graded_arithmetic


__all__ = ["graded_arithmetic"]
