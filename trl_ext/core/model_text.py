"""Model-written text placed into another turn's prompt, with its special-token strings made plain text.

A proposer's question in the solver's prompt, a buffer program in the next proposer's prompt, a file or an email a
proposer wrote in a tool result, a completion in a judge's request: the chat template puts the text in verbatim, and
the tokenizer then reads a `<|im_end|>` in it as the real end-of-turn token (Hugging Face tokenizers match special
tokens inside text by default). A model could so close its turn early and write a system message of its own.
`neutralize_special_tokens` breaks every such string with a zero-width space after its first character, so it is
tokenized as the plain characters it shows. `neutralize_prompt` does so for a whole prompt (a conversation's every
message): for prompts built by a user's function from model-written fields, where which parts came from the model is
not known (and a token could be joined from two fields).

The strings covered are those of the common chat formats: anything shaped `<|...|>` (ChatML as in Qwen and SmolLM,
Llama 3, Phi, Granite, Command R) or `<｜...｜>` (DeepSeek), Gemma's `<start_of_turn>`/`<end_of_turn>`, Llama 2's
and Mistral's `<s>`, `</s>`, `[INST]`, `[/INST]`, `<<SYS>>`, `<</SYS>>` and `[SYSTEM_PROMPT]`, `[TOOL_CALLS]` and
their kin, GLM's `[gMASK]`, `<sop>`, `<eop>`, and `<bos>`, `<eos>`, `<pad>`, `<unk>`; pass a tokenizer's own
(`tokenizer.all_special_tokens`) as `extra` for any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


ZERO_WIDTH_SPACE = "\u200b"
_SPECIAL = re.compile(
    r"<\|[^<>|\s]{0,64}\|>"
    r"|<｜[^<>｜\s]{0,64}｜>"
    r"|<(?:start|end)_of_turn>|</?s>|<</?SYS>>|<(?:bos|eos|pad|unk|sop|eop)>|\[gMASK\]"
    r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS|TOOL_CONTENT)\]",
    re.IGNORECASE,
)


def neutralize_special_tokens(text: str, extra: Iterable[str] = ()) -> str:
    """`text` with each special-token string (see the module docstring, and any of `extra`) broken by a zero-width
    space after its first character. Non-strings are returned unchanged."""
    if not isinstance(text, str):
        return text
    text = _SPECIAL.sub(lambda match: match.group()[0] + ZERO_WIDTH_SPACE + match.group()[1:], text)
    for token in sorted({t for t in extra if isinstance(t, str) and len(t) > 1}, key=len, reverse=True):
        text = text.replace(token, token[0] + ZERO_WIDTH_SPACE + token[1:])
    return text


def neutralize_prompt(prompt: Any, extra: Iterable[str] = ()) -> Any:
    """`prompt` (plain text, or a conversation: a list of message dicts) with every string in it neutralised as by
    `neutralize_special_tokens`: each message's `content`, its text parts and any other string value (not dict keys). A chat template writes the real special tokens around the messages, so none belongs in
    their text, the prompt author's own included. A new object is returned; other values are returned unchanged."""
    if isinstance(prompt, str):
        return neutralize_special_tokens(prompt, extra)
    if isinstance(prompt, list):
        return [neutralize_prompt(item, extra) for item in prompt]
    if isinstance(prompt, dict):
        return {key: neutralize_prompt(value, extra) for key, value in prompt.items()}
    return prompt
