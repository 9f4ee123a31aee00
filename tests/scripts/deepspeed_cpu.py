"""DeepSpeed on CPU for the test scripts, without its compiled shared-memory all-reduce."""


def without_shm_all_reduce() -> None:
    """DeepSpeed's CPU backend builds a C++ shared-memory all-reduce (`ShareMemCommBuilder`) the first time it starts,
    about a minute of compiling in each fresh environment. It only speeds up all-reduce; gloo's, which it falls back
    to, gives the same sums for the tests' tiny models. Call before the first trainer is built."""
    import deepspeed.comm.torch

    deepspeed.comm.torch.build_shm_op = lambda: None
