"""A second format warm-up stage that distils the model's own sampling agreement into its stated confidence.

The format warm-up ([`~trl_ext.models.warmup`]) teaches the confidence turn with confidences drawn at random, so the
warmed-up model states numbers that say nothing about its answer. Yet how often the model gives an answer when it
samples (self-consistency) separates its right answers from its wrong ones. This stage uses the first stage's
warm-up rows, gold answers included; only the stated confidences come from the model's own samples: from the first
stage's checkpoint, `k` answers are sampled per warm-up row at temperature 1; every distinct parsed answer (at most
`max_answers_per_row` of them) gives a confidence-turn example whose stated confidence is the share of the `k`
samples equal to it, rounded to a tenth. The checkpoint is then fine-tuned on these examples plus the first stage's
answer turns (gold) with the same settings ([`~trl_ext.models.warmup.format_warmup`]).

The sampled examples are cached like the checkpoints ([`~trl_ext.models.cache.build_once`]): keyed by the first
stage's checkpoint, the rows, `k`, the seed and the parsing, sampled once in a child process outside the job's
distributed environment.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ..rewards.parsing import normalize_answer
from .warmup import cached_child_build, load_for_inference


# Bump when the sampling or the example builder changes, so cached examples are rebuilt instead of reused.
_BUILD_FORMAT = 1
EXAMPLES_FILE = "examples.json"
# About this many sampled rows (prompts times `k`) per generation call.
SAMPLED_ROWS_PER_CALL = 200


def tenths(count: int, k: int) -> float:
    """`count / k` rounded to a tenth, halves up (integer arithmetic: 2 of 8 is 0.3, not Python's 0.2)."""
    return ((20 * count + k) // (2 * k)) / 10


def agreement_confidence_examples(
    rows: Sequence[dict],
    sampled_answers: Sequence[Sequence[str | None]],
    confidence_prompt: str,
    *,
    seed: int = 0,
    answer_tag: str = "answer",
    confidence_tag: str = "confidence",
    max_answers_per_row: int = 2,
) -> list[dict]:
    """Confidence-turn SFT examples stating, for answers the model sampled, how often it sampled them.

    Row `i` (a conversational `prompt`) with its parsed samples `sampled_answers[i]` (`None`: unparsable) gives one
    example per distinct answer `a` (after `normalize_answer`; written as first sampled): the prompt, the assistant
    message `<answer>a</answer>`, the user's `confidence_prompt`, completed by `<confidence>s</confidence>` where `s`
    is the share of all the row's samples (unparsable ones included) equal to `a`, rounded to a tenth ([`tenths`]).

    With more than `max_answers_per_row` distinct answers, that many are drawn uniformly among them (seeded by
    `seed` and the row's index), not the most common ones: keeping the mode would teach mostly the shares of the
    answers the model gives most (the greedy one's), while RL, sampling at temperature 1, asks for a confidence after
    its minority answers too; a uniform draw covers both ends of the scale. The cap keeps the stage about as long as
    the first: with the answer turn trained beside them, at most 1 + `max_answers_per_row` examples per row, where the
    first has two per row.
    """
    if max_answers_per_row < 1:
        raise ValueError(f"max_answers_per_row must be at least 1 (got {max_answers_per_row}).")
    if len(rows) != len(sampled_answers):
        raise ValueError(f"{len(rows)} rows but {len(sampled_answers)} lists of sampled answers.")
    examples = []
    for i, (row, samples) in enumerate(zip(rows, sampled_answers)):
        counts, written = Counter(), {}
        for sample in samples:
            key = normalize_answer(sample) if sample is not None else ""
            if key:
                counts[key] += 1
                written.setdefault(key, sample.strip())
        chosen = list(counts)  # in order of first appearance
        if len(chosen) > max_answers_per_row:
            chosen = random.Random(f"{seed}:{i}").sample(chosen, max_answers_per_row)
        prompt = list(row["prompt"])
        for key in chosen:
            answer = {"role": "assistant", "content": f"<{answer_tag}>{written[key]}</{answer_tag}>"}
            stated = f"<{confidence_tag}>{tenths(counts[key], len(samples)):g}</{confidence_tag}>"
            examples.append(
                {
                    "prompt": [*prompt, answer, {"role": "user", "content": confidence_prompt}],
                    "completion": [{"role": "assistant", "content": stated}],
                }
            )
    return examples


def _stated(example: dict, confidence_tag: str) -> str:
    """The confidence an example's completion states, as written (`<confidence>0.3</confidence>` -> `"0.3"`)."""
    open_, close = f"<{confidence_tag}>", f"</{confidence_tag}>"
    return example["completion"][0]["content"][len(open_) : -len(close)]


def share_distribution(examples: Sequence[dict], confidence_tag: str = "confidence") -> dict[str, int]:
    """How many examples state each confidence (`{"0.1": 12, ...}`, in increasing order)."""
    counts = Counter(_stated(e, confidence_tag) for e in examples)
    return {value: counts[value] for value in sorted(counts, key=float)}


def balanced_by_share(examples: Sequence[dict], seed: int = 0, confidence_tag: str = "confidence") -> list[dict]:
    """`examples` resampled so that every stated confidence has as many examples: `len(examples)` divided by the
    number of distinct stated values (rounded), drawn without replacement from a value with more, every example of a
    value with fewer repeated as evenly as that count allows (seeded by `seed`).

    A 135M model rarely samples one answer twice, so most sampled answers have a share of 1/k: unbalanced, three
    quarters of the embedded default's examples state 0.1, and the warmed-up model states 0.1 for every answer.
    """
    by_value: dict[float, list[dict]] = {}
    for example in examples:
        by_value.setdefault(float(_stated(example, confidence_tag)), []).append(example)
    if not by_value:
        return []
    per_value = max(1, round(len(examples) / len(by_value)))
    rng = random.Random(f"{seed}:balance")
    balanced = []
    for value in sorted(by_value):
        group = by_value[value]
        repeats, extra = divmod(per_value, len(group))
        balanced += group * repeats + rng.sample(group, extra)
    return balanced


def sample_answers(
    checkpoint: str,
    prompts: Sequence[list[dict]],
    k: int,
    *,
    seed: int,
    max_new_tokens: int,
    answer_tag: str,
    lenient: bool,
    confidence_prompt: str,
    chat_template_kwargs: dict | None = None,
    use_cpu: bool = False,
) -> tuple[list[list[str | None]], int]:
    """`k` answers per conversational prompt sampled at temperature 1 from `checkpoint` (parsed with `answer_tag`,
    `None`: unparsable), rendered as the RLCR evaluation renders its answer turn, and the tokens generated."""

    from ..core.turns import follow_up_turn
    from ..evaluation.agreement import sampled_parses
    from ..rewards import extract_answer

    kwargs = chat_template_kwargs or {}
    model, tokenizer = load_for_inference(checkpoint, use_cpu)
    # The answer turn's prompt as the trainers and the evaluation render it (TRL's training template when needed).
    turn = follow_up_turn(tokenizer, confidence_prompt, [tokenizer.eos_token_id], **kwargs)
    ids = turn.first_turn_ids(tokenizer, prompts, **kwargs)
    return sampled_parses(
        model,
        tokenizer,
        ids,
        k,
        max_new_tokens,
        lambda text: extract_answer(text, answer_tag, lenient),
        rows_per_call=SAMPLED_ROWS_PER_CALL,
        seed=seed,
        progress="agreement warm-up sampling",
    )


def agreement_examples(
    stage1: str,
    rows: Sequence[dict],
    k: int,
    confidence_prompt: str,
    *,
    seed: int = 0,
    max_new_tokens: int = 16,
    answer_tag: str = "answer",
    confidence_tag: str = "confidence",
    lenient: bool = False,
    chat_template_kwargs: dict | None = None,
    max_answers_per_row: int = 2,
    use_cpu: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> dict:
    """The stage's examples from the `stage1` checkpoint, sampled once and cached: `{"examples": [...], "stats":
    {rows_sampled, samples_per_row, examples, unparsable_samples, generated_tokens, shares, sampling_seconds},
    "answers": [...]}` (`answers`: each row's parsed samples, `None` where unparsable).

    Keyed by `stage1` (its path and the fingerprint of its config and weights), the rows' prompts and every other
    argument. Called from every rank of a distributed job, one samples (in a child process without the job's
    distributed environment, on CUDA unless `use_cpu`) while the others wait on the lock.
    """
    if k < 1:
        raise ValueError(f"the agreement warm-up needs at least 1 sample per row (got {k}).")
    spec = {
        "stage1": str(stage1),
        "prompts": [list(row["prompt"]) for row in rows],
        "k": int(k),
        "confidence_prompt": confidence_prompt,
        "seed": int(seed),
        "max_new_tokens": int(max_new_tokens),
        "answer_tag": answer_tag,
        "confidence_tag": confidence_tag,
        "lenient": bool(lenient),
        "chat_template_kwargs": chat_template_kwargs or {},
        "max_answers_per_row": int(max_answers_per_row),
    }
    path = cached_child_build(
        "trl_ext.models.agreement_warmup",
        stage1,
        spec,
        {"format": _BUILD_FORMAT},
        {"use_cpu": bool(use_cpu)},  # where the samples are drawn does not make them other examples
        "warmup-agreement",
        f"trl-ext: sampling {k} answers per row of {len(rows)} from {stage1} for the agreement warm-up",
        cache_dir,
    )
    return json.loads((Path(path) / EXAMPLES_FILE).read_text())


def _build(spec: dict, out: Path) -> None:
    started = time.monotonic()
    answers, tokens = sample_answers(
        spec["stage1"],
        spec["prompts"],
        spec["k"],
        seed=spec["seed"],
        max_new_tokens=spec["max_new_tokens"],
        answer_tag=spec["answer_tag"],
        lenient=spec["lenient"],
        confidence_prompt=spec["confidence_prompt"],
        chat_template_kwargs=spec["chat_template_kwargs"],
        use_cpu=spec["use_cpu"],
    )
    examples = agreement_confidence_examples(
        [{"prompt": p} for p in spec["prompts"]],
        answers,
        spec["confidence_prompt"],
        seed=spec["seed"],
        answer_tag=spec["answer_tag"],
        confidence_tag=spec["confidence_tag"],
        max_answers_per_row=spec["max_answers_per_row"],
    )
    stats = {
        "rows_sampled": len(answers),
        "samples_per_row": spec["k"],
        "examples": len(examples),
        "unparsable_samples": sum(a is None for row in answers for a in row),
        "generated_tokens": tokens,
        "shares": share_distribution(examples, spec["confidence_tag"]),
        "sampling_seconds": round(time.monotonic() - started, 1),
    }
    (out / EXAMPLES_FILE).write_text(json.dumps({"examples": examples, "stats": stats, "answers": answers}))


if __name__ == "__main__":  # the child process of `cached_child_build`
    import sys

    _build(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
