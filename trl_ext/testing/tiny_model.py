"""A tiny random-weight causal LM with a real chat-template tokenizer, built at run time (no Hub access).

The tokenizer is SmolLM2's (byte-level BPE, ChatML template), taken from the embedded default checkpoint, so span
masks, chat templates and special tokens behave as with a real model while a forward pass costs milliseconds.
"""

from __future__ import annotations

import os

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ..default_model import default_model_path


def tiny_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer with its chat template; pad token = `<|im_end|>` (also the end-of-turn token)."""
    return AutoTokenizer.from_pretrained(default_model_path())


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


def tiny_checkpoint(directory: str | os.PathLike, seed: int = 0, **kwargs) -> str:
    """Save [`tiny_causal_lm`] (model + tokenizer) to `directory` and return it, for code that takes a model path."""
    model, tokenizer = tiny_causal_lm(seed=seed, **kwargs)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)
