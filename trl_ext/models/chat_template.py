"""A chat template TRL's tool-call loop can run with, for ChatML models that ship none (SmolLM2, the tiny test models).

TRL parses tool calls only for chat templates it recognises (`trl.chat_template_utils.add_response_schema`). SmolLM2's
own template renders no tools. It uses the same ChatML special tokens as Qwen2.5 (`<|im_start|>`, `<|im_end|>`), so
TRL's Qwen2.5 template renders SmolLM2 conversations with the same turn markers, adds the tool schema to the system
turn, writes tool calls as `<tool_call>{"name": ..., "arguments": ...}</tool_call>` and tool results as
`<tool_response>` blocks in a user turn, and TRL knows how to parse it. The tags are plain text for SmolLM2 (several
tokens each): a model learns to write them like any other text.
"""

from __future__ import annotations

from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template


def use_tool_chat_template(processing_class):
    """Give a ChatML tokenizer (or processor) TRL's Qwen2.5 chat template and response parser, in place; returns it.

    Conversations should start with a system message: without one the template writes Qwen's default system prompt.
    Raises `ValueError` if the tokenizer lacks the ChatML turn tokens.
    """
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    vocab = tokenizer.get_vocab()
    missing = [token for token in ("<|im_start|>", "<|im_end|>") if token not in vocab]
    if missing:
        raise ValueError(
            f"use_tool_chat_template needs a ChatML tokenizer; {type(tokenizer).__name__} has no {missing} token(s). "
            "Give the tokenizer a tool-capable chat template of its own model family instead."
        )
    processing_class.chat_template = qwen2_5_chat_template
    return add_response_schema(processing_class)
