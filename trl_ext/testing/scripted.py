"""Scripted generation and batch recording, to assert the exact batch a trainer builds.

`ScriptedGeneration` replaces a trainer's `_generate_single_turn` (the seam every generation path of
`GRPOTrainer` and of trl-ext's trainers goes through) with a script: a function of the decoded prompt and of the
sample's index inside its group. Everything around generation (tokenisation, rewards, advantages, masks, loss) is the
trainer's own code.

    with ScriptedGeneration(trainer, lambda prompt, k: "A" if k % 2 else "B") as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    gen.calls[0].num_generations, rec.batches[0]["advantages"]

`ScriptedModelGenerate(model, tokenizer, script)` does the same for code that calls `model.generate` itself (the
held-out solver evaluation).

With tools or an `environment_factory`, a script returns `tool_call_text(...)` to call a tool, and TRL's own tool loop
runs the call and generates again (one row at a time, `num_generations=1`) from the episode so far: the script sees
the tool results (`<tool_response>` blocks) in the decoded prompt and decides from them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class GenerationCall:
    """One call of `_generate_single_turn` as this process saw it."""

    prompt_ids: list[list[int]]
    """Prompt token ids, one row per completion (each prompt repeated `num_generations` times)."""
    num_generations: int
    completion_ids: list[list[int]]
    """What the script returned, as token ids."""


Script = Callable[[str, int], "str | list[int] | None"]


def tool_call_text(name: str, **arguments) -> str:
    """A completion calling tool `name` with `arguments`, in the format of `trl_ext.use_tool_chat_template`."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedGeneration:
    """Context manager replacing `trainer._generate_single_turn` with `script(prompt_text, sample_index)`.

    `prompt_text` is the prompt decoded with special tokens kept (the chat template is visible); `sample_index` is the
    row's index inside its group of `num_generations` in the gathered (all-process) batch, so multi-process runs script
    the same group the same way. A returned string is tokenised and gets the end-of-sequence token appended (a
    finished completion); a returned list of token ids is used verbatim (e.g. a truncated completion without EOS);
    `None` (for every row of a call) lets the model sample that call, e.g. to script one turn and learn the other.
    Completions come back without sampling log-probs, like TRL's transformers generation path.
    """

    def __init__(self, trainer, script: Script):
        self.trainer = trainer
        self.script = script
        self.calls: list[GenerationCall] = []

    @property
    def tokenizer(self):
        return self.trainer._tokenizer

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        offset = self.trainer.accelerator.process_index * len(prompt_ids)  # rows of lower ranks come first
        outputs = [
            self.script(self.tokenizer.decode(ids), (offset + i) % num_generations) for i, ids in enumerate(prompt_ids)
        ]
        if outputs and all(out is None for out in outputs):
            # the script hands this call to the model: the trainer's own generation path samples it
            return type(self.trainer)._generate_single_turn(
                self.trainer, prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if any(out is None for out in outputs):
            raise ValueError("A script returns None for every row of a generation call or for none of them.")
        completion_ids = []
        for out in outputs:
            if isinstance(out, str):
                out = self.tokenizer.encode(out, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            completion_ids.append([int(t) for t in out])
        # A copy: TRL's tool loop extends the returned lists in place with tool output and the next turn.
        self.calls.append(
            GenerationCall([list(map(int, p)) for p in prompt_ids], num_generations, [list(c) for c in completion_ids])
        )
        return completion_ids, None

    def __enter__(self) -> ScriptedGeneration:
        # An instance attribute shadows the class method; deleting it restores the trainer's own.
        self.trainer._generate_single_turn = self._generate_single_turn
        return self

    def __exit__(self, *exc) -> None:
        del self.trainer._generate_single_turn


class ScriptedModelGenerate:
    """Context manager replacing `model.generate` with `script(prompt_text) -> str`, for code that generates with the
    model directly rather than through a trainer.

    Each row's prompt (its left padding dropped, by the attention mask) is decoded with special tokens kept; the reply
    is tokenised with the end-of-sequence token appended and cut at `max_new_tokens`, as generation would cut it.
    Returns the prompts followed by the replies, right-padded with `pad_token_id`, like `generate`. `prompt_ids`
    records every row's prompt.
    """

    def __init__(self, model, tokenizer, script: Callable[[str], str]):
        self.model, self.tokenizer, self.script = model, tokenizer, script
        self.prompt_ids: list[list[int]] = []

    def _generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **kwargs):
        replies = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            prompt = [token for token, keep in zip(ids, mask, strict=True) if keep]
            self.prompt_ids.append(prompt)
            reply = self.tokenizer.encode(self.script(self.tokenizer.decode(prompt)), add_special_tokens=False)
            replies.append((reply + [self.tokenizer.eos_token_id])[:max_new_tokens])
        width = max(len(reply) for reply in replies)
        padded = torch.tensor([reply + [pad_token_id] * (width - len(reply)) for reply in replies])
        return torch.cat([input_ids, padded.to(input_ids.device)], dim=1)

    def __enter__(self) -> ScriptedModelGenerate:
        self.model.generate = self._generate  # an instance attribute shadows the model's method
        return self

    def __exit__(self, *exc) -> None:
        del self.model.generate


class BatchRecorder:
    """Context manager recording every dict `trainer._generate_and_score_completions` returns (before shuffling).

    Tensors are detached and copied to CPU; other values are kept as they are.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.batches: list[dict] = []

    def _record(self, inputs):
        output = self._original(inputs)
        self.batches.append(
            {k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in output.items()}
        )
        return output

    def __enter__(self) -> BatchRecorder:
        self._original = self.trainer._generate_and_score_completions
        self.trainer._generate_and_score_completions = self._record
        return self

    def __exit__(self, *exc) -> None:
        del self.trainer._generate_and_score_completions
