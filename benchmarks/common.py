"""What the benchmark scripts share: the embedded default model, step times, fixed-length scripted completions."""

from __future__ import annotations

from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_ext import default_model_path


def load_model():
    """The embedded default (SmolLM2-135M-Instruct), float32, with its tokenizer."""
    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(path, dtype="float32"), AutoTokenizer.from_pretrained(path)


def step_times(trainer) -> list[float]:
    return [log["step_time"] for log in trainer.state.log_history if "step_time" in log]


def fixed_length(tokenizer, text: str, n: int) -> list[int]:
    """`text` as token ids, filled with " ok" or cut to `n - 1` tokens, then EOS: a finished completion of n tokens."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    filler = tokenizer.encode(" ok", add_special_tokens=False)
    return (ids + filler * n)[: n - 1] + [tokenizer.eos_token_id]
