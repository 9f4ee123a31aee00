"""Run a script under `torchrun --nproc_per_node N` on CPU (gloo) and collect what each rank reports.

`accelerate launch` with a MULTI_CPU config does not spawn processes without MPI; `torchrun` does, and accelerate
picks up its environment (RANK, WORLD_SIZE, ...) and the gloo backend on its own.

In the script:   write_rank_result({"weights_sha": ..., "metrics": ...})
In the test:     results = run_torchrun("tests/scripts/train_two_steps.py", nproc=2)
In-process:      scenario = load_script("tests/scripts/train_two_steps.py")  # share its setup with other tests

DeepSpeed and FSDP across CPU processes need [`gloo_sharded_training`] in the script (test-only).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType


RESULTS_ENV = "TRL_EXT_RANK_RESULTS_DIR"
RankResults = list[dict]


def _kill_tree(pid: int) -> None:
    """Kill a process and all its descendants. torchrun starts each rank in a session of its own, so killing
    torchrun or its process group would leave deadlocked ranks running."""
    import psutil

    try:
        parent = psutil.Process(pid)
        processes = parent.children(recursive=True) + [parent]  # collected before any is killed and reparented
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)


def write_rank_result(result: dict) -> None:
    """Write this rank's JSON-serialisable `result` where [`run_torchrun`] collects it."""
    directory = os.environ.get(RESULTS_ENV)
    if directory is None:
        raise RuntimeError(f"write_rank_result() must run under run_torchrun(), which sets ${RESULTS_ENV}.")
    rank = int(os.environ.get("RANK", "0"))
    path = Path(directory) / f"rank{rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


def load_script(path: str | os.PathLike) -> ModuleType:
    """The script at `path` (outside any package) imported as a module named after its file, without running its
    `if __name__ == "__main__"` part, so that in-process tests share its setup with its torchrun runs."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses defined in it look their module up
    spec.loader.exec_module(module)
    return module


def run_torchrun(
    script: str | os.PathLike,
    nproc: int = 2,
    args: list[str] | tuple[str, ...] = (),
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> RankResults:
    """Run `script` with `torchrun --standalone --nproc_per_node nproc` and return each rank's result, by rank.

    CUDA is hidden and each rank gets one thread, so the run is CPU-only and does not oversubscribe small machines.
    The ranks' temporary files (`$TMPDIR`: output dirs, checkpoints) go to a folder removed with the results.
    A timeout (deadlock) or a non-zero exit raises `RuntimeError` carrying the end of the combined output.
    """
    with tempfile.TemporaryDirectory(prefix="trl_ext_torchrun_") as results_dir:
        scratch = Path(results_dir) / "tmp"
        scratch.mkdir()
        run_env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            RESULTS_ENV: results_dir,
            "TMPDIR": str(scratch),
            **(env or {}),
        }
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd += [str(script), *args]
        proc = subprocess.Popen(cmd, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            stdout, _ = proc.communicate()
            raise RuntimeError(f"torchrun did not finish in {timeout}s (deadlock?):\n{stdout[-6000:]}") from None
        output = stdout[-12000:]
        if proc.returncode != 0:
            raise RuntimeError(f"torchrun exited with {proc.returncode}:\n{output}")
        results = []
        for rank in range(nproc):
            path = Path(results_dir) / f"rank{rank}.json"
            if not path.is_file():
                raise RuntimeError(f"rank {rank} wrote no result (call write_rank_result):\n{output}")
            results.append(json.loads(path.read_text()))
        return results


@contextmanager
def gloo_sharded_training():
    """Test-only: let DeepSpeed and FSDP run across the CPU processes of `torchrun`, over gloo.

    Without CUDA, accelerate gives a run that is not `use_cpu` no backend: it counts one process (DeepSpeed then fails
    its `train_batch_size` check) and never switches to FSDP ("Using fsdp only works in distributed training"). Inside
    this context, such a run under torchrun gets the gloo backend and the distributed type of a multi-GPU run (which
    DeepSpeed and FSDP replace) on the CPU device. Enter it before building the `TrainingArguments`.
    """
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    original = PartialState._prepare_backend

    def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        if int(os.environ.get("LOCAL_RANK", -1)) != -1 and not cpu and not torch.cuda.is_available():
            return "gloo", DistributedType.MULTI_GPU
        return original(self, cpu, sagemaker_dp, backend)

    device = os.environ.get("ACCELERATE_TORCH_DEVICE")
    PartialState._prepare_backend = prepare_backend
    os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"
    try:
        yield
    finally:
        PartialState._prepare_backend = original
        if device is None:
            os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
        else:
            os.environ["ACCELERATE_TORCH_DEVICE"] = device


def weights_digest(model) -> str:
    """SHA-256 of every named parameter (sorted by name, as float32 bytes): equal on two ranks iff equal weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()
