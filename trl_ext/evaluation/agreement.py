"""The untrained reference point beside a stated confidence: the model's own sampling agreement.

Sample `k` answers to a question at temperature 1 and take the share that agree with the model's greedy answer as a
confidence in that answer (self-consistency). It needs no training, only `k` more generations per question: its cost
is reported in generated tokens, so that a stated confidence (one short second turn) can be weighed against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..models.shared_prefill import shared_prefill_generate
from ..rewards import extract_answer
from ..rewards.parsing import normalize_answer
from .greedy import left_padded


def agreement_share(reference: str | None, samples: Sequence[str | None]) -> float:
    """The share of `samples` (parsed answers, `None`: unparsable) equal to `reference` after `normalize_answer`;
    0 when the reference answer is missing (nothing to agree with) or there are no samples."""
    if not samples or reference is None or not normalize_answer(reference):
        return 0.0
    target = normalize_answer(reference)
    return sum(sample is not None and normalize_answer(sample) == target for sample in samples) / len(samples)


@torch.no_grad()
def sampled_completions(
    model, tokenizer, prompts: list[list[int]], k: int, max_new_tokens: int, temperature: float = 1.0, seed: int = 0
) -> list[list[list[int]]]:
    """`k` completions per prompt sampled at `temperature` (seeded: the same for the same model and seed, whatever
    the global RNG), each cut after EOS. Prompts are left-padded into one batch of `len(prompts) * k` rows."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids, attention_mask, width = left_padded([p for p in prompts for _ in range(k)], pad, model.device)
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        out = shared_prefill_generate(
            model,
            model.generate,
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
    completions = []
    for row in out[:, width:].tolist():
        completions.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    return [completions[i * k : (i + 1) * k] for i in range(len(prompts))]


def sampled_parses(
    model,
    tokenizer,
    prompts: list[list[int]],
    k: int,
    max_new_tokens: int,
    parse: Callable[[str], Any],
    rows_per_call: int = 128,
    seed: int = 0,
    progress: str | None = None,
) -> tuple[list[list[Any]], int]:
    """Per prompt (token ids), `parse` applied to each of `k` completions sampled at temperature 1 (decoded without
    special tokens), and the number of tokens the completions generated. Each generate call samples about
    `rows_per_call` rows (`rows_per_call // k` prompts, at least one: 200 prompts x 8 in one call held 13.6 GB of a
    GPU for a 135M model), seeded with `seed` plus its first prompt's index, in eval mode; `progress` names a
    progress bar if given."""
    batch_size = max(1, rows_per_call // k)
    starts = range(0, len(prompts), batch_size)
    if progress is not None:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=progress)
    was_training = model.training
    model.eval()
    parsed, tokens = [], 0
    try:
        for start in starts:
            batch = prompts[start : start + batch_size]
            for completions in sampled_completions(model, tokenizer, batch, k, max_new_tokens, seed=seed + start):
                tokens += sum(len(c) for c in completions)
                parsed.append([parse(tokenizer.decode(c, skip_special_tokens=True)) for c in completions])
    finally:
        model.train(was_training)
    return parsed, tokens


def sampling_agreement(
    model,
    tokenizer,
    prompts: list[list[int]],
    greedy_answers: list[str],
    k: int,
    max_new_tokens: int,
    answer_tag: str = "answer",
    lenient: bool = False,
    rows_per_call: int = 128,
    seed: int = 0,
) -> tuple[list[float], int]:
    """Per prompt (token ids, rendered as for the greedy answer), the share of `k` answers sampled at temperature 1
    that agree with its greedy reply `greedy_answers[i]` (text; answers parsed with `answer_tag`/`lenient`), and
    the number of tokens the samples generated (their cost)."""
    parsed, tokens = sampled_parses(
        model,
        tokenizer,
        prompts,
        k,
        max_new_tokens,
        lambda text: extract_answer(text, answer_tag, lenient),
        rows_per_call=rows_per_call,
        seed=seed,
    )
    shares = [
        agreement_share(extract_answer(greedy, answer_tag, lenient), samples)
        for greedy, samples in zip(greedy_answers, parsed)
    ]
    return shares, tokens
