"""Test harnesses shared by every trainer's tests, importable by users who test their own extensions.

- `config`: `cpu_test_args`, trainer arguments for a few fast CPU steps.
- `tiny_model`: tiny random-weight causal LMs with real chat-template tokenizers (SmolLM2's; Qwen3-family templates
  on a tiny Qwen3), built at run time.
- `scripted`: replace generation (a trainer's, or `model.generate`) by a function of the prompt, and record the
  batches a trainer builds.
- `multiprocess`: run a script under `torchrun --nproc_per_node N` (gloo on CPU) and collect each rank's
  results, or load it in-process (`load_script`); `gloo_sharded_training` lets DeepSpeed and FSDP run across those
  processes.
- `environments`: `Counter`, a tool environment (increment a counter to the row's target).
- `fake_executor`: a stand-in for the sandbox's `execute_many` that answers from hand-written functions.
- `vllm_server`: a loopback OpenAI-compatible server, and TRL's real vLLM server-mode client pointed at it.
"""

from .config import cpu_test_args
from .environments import Counter, logged_counter
from .fake_executor import FakeExecutor
from .multiprocess import (
    RankResults,
    gloo_sharded_training,
    load_script,
    run_torchrun,
    weights_digest,
    write_rank_result,
)
from .scripted import BatchRecorder, GenerationCall, ScriptedGeneration, ScriptedModelGenerate, tool_call_text
from .tiny_model import (
    QWEN3_CHAT_TEMPLATES,
    tiny_causal_lm,
    tiny_checkpoint,
    tiny_qwen3_lm,
    tiny_tokenizer,
    trl_chat_template,
)
from .vllm_server import LoopbackVLLMServer, vllm_server_mode
from .weights import changed_parameters, snapshot_parameters


__all__ = [
    "QWEN3_CHAT_TEMPLATES",
    "BatchRecorder",
    "Counter",
    "FakeExecutor",
    "GenerationCall",
    "LoopbackVLLMServer",
    "RankResults",
    "ScriptedGeneration",
    "ScriptedModelGenerate",
    "changed_parameters",
    "cpu_test_args",
    "gloo_sharded_training",
    "load_script",
    "logged_counter",
    "run_torchrun",
    "snapshot_parameters",
    "tiny_causal_lm",
    "tiny_checkpoint",
    "tiny_qwen3_lm",
    "tiny_tokenizer",
    "tool_call_text",
    "trl_chat_template",
    "vllm_server_mode",
    "weights_digest",
    "write_rank_result",
]
