"""Test harnesses shared by every trainer's tests, importable by users who test their own extensions.

- `config`: `cpu_test_args`, trainer arguments for a few fast CPU steps.
- `tiny_model`: a tiny random-weight causal LM with the real SmolLM2 chat-template tokenizer, built at run time.
- `scripted`: replace generation by a function of the prompt ids, and record the batches a trainer builds.
- `multiprocess`: run a script under `torchrun --nproc_per_node N` (gloo on CPU) and collect each rank's results.
- `vllm_server`: a loopback OpenAI-compatible server, and TRL's real vLLM server-mode client pointed at it.
"""

from .config import cpu_test_args
from .multiprocess import RankResults, run_torchrun, weights_digest, write_rank_result
from .scripted import BatchRecorder, GenerationCall, ScriptedGeneration, tool_call_text
from .tiny_model import tiny_causal_lm, tiny_checkpoint, tiny_tokenizer
from .vllm_server import LoopbackVLLMServer, vllm_server_mode
from .weights import changed_parameters, snapshot_parameters


__all__ = [
    "BatchRecorder",
    "GenerationCall",
    "LoopbackVLLMServer",
    "RankResults",
    "ScriptedGeneration",
    "changed_parameters",
    "cpu_test_args",
    "run_torchrun",
    "snapshot_parameters",
    "tiny_causal_lm",
    "tiny_checkpoint",
    "tiny_tokenizer",
    "tool_call_text",
    "vllm_server_mode",
    "weights_digest",
    "write_rank_result",
]
