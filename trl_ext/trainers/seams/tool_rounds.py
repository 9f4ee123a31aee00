"""Collective tool rounds: TRL's tool-call loop made safe when processes have different amounts of tool work.

`GRPOTrainer._tool_call_loop` runs per process: `while idxs_with_tool:` it executes this process's tool calls and
generates the next turn of the rows that called a tool, through `_generate_single_turn(rows, num_generations=1)`.
Where that generation is a collective (vLLM server mode gathers every process's prompts, generates on the main
process and hands each process the slice `process_index * len(rows)`; DeepSpeed ZeRO-3 gathers parameters), two
processes with different tool work break it:

- different numbers of rows in the same round: a process's slice holds another process's completions (a completion
  paired with another rollout's context), silently;
- different numbers of rounds: a process that left the loop meets the next collective of `_generate` while another
  still generates, and the run deadlocks or fails.

`CollectiveToolRounds` makes every tool round a collective decision: before each round's generation the processes
agree on the largest row count, and a process with fewer rows (or none left, once its own loop ended) adds padding rows
whose completions are dropped, until no process has a tool row left. Only `_tool_call_loop` (wrapped, not copied) and
`_generate_single_turn` (inside the loop only) are touched.

It also makes every tool result safe to tokenize. A tool call is model output: a JSON escape such as `"\\udcff"`
decodes to a lone surrogate, which TRL copies into the tool message (the tool name of an unknown tool, or a tool's
result echoing an argument), and the tokenizer raises `TypeError` on text that does not encode as UTF-8. TRL
tokenizes tool messages in one place, `_get_tool_suffix_ids`; there each message's name and text have their lone
surrogates replaced by U+FFFD, in place, so the episode's messages (rewards, logs, replay) hold the text that was
tokenized. The number of tool results changed is logged as `tools/unsafe_results` (all processes, per generation).
"""

from __future__ import annotations

import re

import torch

from .scoping import scoped_call


_SURROGATE = re.compile("[\ud800-\udfff]")  # the only code points that do not encode as UTF-8


def utf8_safe(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (`text` itself when it already encodes as UTF-8)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


class CollectiveToolRounds:
    """Mixin for a `GRPOTrainer` subclass (listed before it): TRL's tool loop in step across processes."""

    _in_tool_loop = False
    _unsafe_tool_results = 0  # tool messages made safe in this `_tool_call_loop` (this process)

    def _tool_call_loop(self, *args, **kwargs):
        with scoped_call(self, _in_tool_loop=True, _unsafe_tool_results=0):
            result = super()._tool_call_loop(*args, **kwargs)
            # This process's episodes are over; others may still be generating tool rounds: join them with padding.
            while rows := self._tool_round_rows(0):
                self._padded_generation([], None, {}, rows, False)
            unsafe = self.accelerator.gather(torch.tensor([self._unsafe_tool_results], device=self.accelerator.device))
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["tools/unsafe_results"].append(float(unsafe.sum().item()))
        return result

    def _get_tool_suffix_ids(self, tool_messages):
        """TRL's tokenization of tool messages, after making their names and text safe to tokenize (in place)."""
        for message in tool_messages:
            safe = {key: _utf8_safe_content(message[key]) for key in ("name", "content") if key in message}
            if safe != {key: message[key] for key in safe}:
                message.update(safe)
                self._unsafe_tool_results += 1
        return super()._get_tool_suffix_ids(tool_messages)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self._in_tool_loop or self.accelerator.num_processes == 1:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        rows = self._tool_round_rows(len(prompt_ids))
        return self._padded_generation(prompt_ids, images, multimodal_fields, rows, has_tool_images)

    def _tool_round_rows(self, rows: int) -> int:
        """The largest number of rows any process generates in this tool round (a collective)."""
        if self.accelerator.num_processes == 1:
            return rows
        counts = self.accelerator.gather(torch.tensor([rows], device=self.accelerator.device))
        return int(counts.max().item())

    def _padded_generation(self, prompt_ids, images, multimodal_fields, rows: int, has_tool_images: bool):
        """Generate `prompt_ids` plus padding up to `rows` (TRL's generation, one sample each); drop the padding."""
        real = len(prompt_ids)
        if rows > real and (images is not None or multimodal_fields):
            raise ValueError("Tool rounds with images cannot be padded across processes; use text-only tools.")
        # A padding row is a one-token prompt: its completion is generated with the others and dropped.
        padded = list(prompt_ids) + [[self._tokenizer.eos_token_id]] * (rows - real)
        completion_ids, logprobs = super()._generate_single_turn(padded, images, multimodal_fields, 1, has_tool_images)
        return completion_ids[:real], None if logprobs is None else logprobs[:real]


def _utf8_safe_content(value):
    """A tool message's name or content made safe: text, or the text fields of multimodal content blocks."""
    if isinstance(value, str):
        return utf8_safe(value)
    if isinstance(value, list):
        return [
            {k: utf8_safe(v) if isinstance(v, str) else v for k, v in part.items()} if isinstance(part, dict) else part
            for part in value
        ]
    return value
