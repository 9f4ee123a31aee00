"""Greedy generation for evaluations: batched `model.generate` on prompt token ids, completions cut after EOS."""

from __future__ import annotations

import torch

from ..models.shared_prefill import shared_prefill_generate


def left_padded(prompts: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`prompts` left-padded with `pad` into one batch on `device`: input ids, attention mask, and the width (where
    the completions start)."""
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return input_ids, attention_mask, width


@torch.no_grad()
def greedy_completions(model, tokenizer, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Each prompt's greedy completion as token ids, ending with the EOS token when the model wrote it within
    `max_new_tokens`. Prompts are left-padded into one batch."""
    pad = tokenizer.pad_token_id
    input_ids, attention_mask, width = left_padded(prompts, pad, model.device)
    out = shared_prefill_generate(
        model,
        model.generate,
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
    )
    completions = []
    for row in out[:, width:].tolist():
        completions.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    return completions


@torch.no_grad()
def completion_probabilities(model, tokenizer, prompts: list[list[int]], completions: list[list[int]]) -> list[float]:
    """Per prompt, the probability the model gives its completion's tokens, as the geometric mean over the tokens
    (`exp` of their mean log-prob: a length-free number in [0, 1]); 0.0 for an empty completion. One teacher-forced
    forward of the left-padded batch (rotary positions: the padding shifts a row's positions alike, which leaves its
    attention unchanged)."""
    rows = [p + c for p, c in zip(prompts, completions)]
    input_ids, attention_mask, width = left_padded(rows, tokenizer.pad_token_id, model.device)
    logprobs = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention_mask).logits.float(), dim=-1)
    out = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        begin = width - len(rows[i]) + len(prompt)  # the completion's first position in the padded row
        picked = [logprobs[i, begin + j - 1, t].item() for j, t in enumerate(completion)]
        out.append(float(torch.tensor(picked).mean().exp()) if picked else 0.0)
    return out
