"""DeepSpeed on CPU for the test scripts, without its compiled shared-memory all-reduce."""

import importlib


def without_shm_all_reduce() -> None:
    """DeepSpeed's CPU backend builds a C++ shared-memory all-reduce (`ShareMemCommBuilder`) the first time it starts,
    about a minute of compiling in each fresh environment. It only speeds up all-reduce; gloo's, which it falls back
    to, gives the same sums for the tests' tiny models. Call before the first trainer is built."""
    # the module itself: the attribute `deepspeed.comm.torch` is PyTorch, which deepspeed.comm imports by that name
    backend = importlib.import_module("deepspeed.comm.torch")
    backend.build_shm_op = lambda: None
