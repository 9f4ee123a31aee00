"""RLCR benchmarks on the embedded default (SmolLM2-135M-Instruct), on CPU (calibration: on a GPU where there is one).

    python benchmarks/rlcr_bench.py overhead      # step time vs plain GRPOTrainer on the same generated tokens
    python benchmarks/rlcr_bench.py calibration   # ECE/Brier per step: multi-turn RLCR vs single-turn RLCR
    python benchmarks/rlcr_bench.py calibration --split report --parallel 3   # the published run, 3 seeds at once
    # tuning the single-turn baseline on the tune split (GRPOConfig fields after `--`), each setting against the
    # multi-turn generated tokens per step measured by the tune run above:
    python benchmarks/rlcr_bench.py calibration --methods single_turn --parallel 3 \
        --match-tokens-from benchmarks/results/rlcr_calibration_tune.json --tag st_lr1e-4 -- --learning_rate 1e-4
    # seeds run apart (separate calls or machines, each with its own TRL_EXT_BENCH_RESULTS), then one result:
    python benchmarks/rlcr_bench.py calibration --merge run1/rlcr_calibration.json run2/rlcr_calibration.json

Results: benchmarks/results/rlcr_<part>.json and .png (calibration on the tune split: rlcr_calibration_tune.*), each
JSON with its provenance (commit, packages, device, command line, seeds); calibration's final evaluations' per-sample
records (method, seed, question, level, answer, correct, stated confidence, sampling agreement, sampled
confidences and their mean) in the .jsonl beside.

overhead: both trainers get scripted completions of fixed lengths (generation cost is identical by construction and
excluded), so the ratio measures what RLCR adds per step: the second scoring pass, turn-2 prompts (longer: they
contain the answer), span masks, metrics. RLCR runs twice: with the packed loss forward (`share_prefix=True`, the
default) and with rows scored one by one. GRPO runs twice too: as TRL ships it (on CPU its fused LM head scores
every prompt position, in 4096-token tiles) and on the trainers' CPU log-prob path (labelled positions only, in
`cpu_logprob_tile_tokens` tiles): the ratio to the first is what a user sees, to the second what RLCR's algorithm
costs. The four trainers are built once and run one step each in turn (A B C D A B C D ...), so load on a shared
machine lands on all of them alike; per trainer the min, median and spread of `step_time` after one warm-up step, and
the ratios of the medians and of the mins to each GRPO.

calibration: multi-turn RLCR (the recipe's embedded-default run: G_a answers, then G_c confidences per answer)
against single-turn RLCR (answer and confidence in one completion, reward accuracy + Brier, on GRPOTrainer), both
from one format warm-up that teaches both formats (so that the single-turn baseline states confidences at all), with
the recipe's learning rate, temperature and step count. The warm-up is the recipe's (`--warmup_confidences`), built
per seed with a single-turn example beside each multi-turn one: the first stage's gold answers with drawn
confidences, and in the two-stage default each confidence the second stage teaches also as one single-turn reply (the
model's answer, then that confidence: `single_turn_twins`). The baseline gets what multi-turn's default gets: its KL
term (`beta`) where multi-turn has it (`single_turn_trainer`: every token with the default's `confidence_beta` =
`beta`, GRPOTrainer; the answer tokens only, through `</answer>`, with `confidence_beta 0`, AnswerKLGRPOTrainer in
single_turn_rlcr.py); its advantages on the batch's reward scale (`scale_rewards batch`, as
multi-turn's confidence rows: see `single_turn_settings`); as many generated tokens per step, measured (its replies
per step matched, per seed, to multi-turn's measured tokens per step at the mean length of replies the warm-up model
samples; both runs' generated tokens from TRL's logged lengths, per seed in `generated_tokens`); and settings tuned
on the tune split as multi-turn's were (GRPOConfig fields after `--`, `--methods single_turn`; the result records
them under `single_turn`). Both are evaluated greedily on the recipe's held-out questions before training and every
`--evaluate-every` steps, once per seed in `--seeds` (a seed is the whole pipeline: the warm-up is built per seed, as
the recipe's `--seed` builds it; `--parallel N` runs N seeds at once, one process each, and merges them); curves
against cumulative generated tokens, mean and min-max over seeds; the summary's `verdict` says in which seeds
multi-turn's AUROC within levels is at least single-turn's. The held-out questions are the built-in data's
`--split` (`tune` by default: choose settings there; `report` only for the published numbers). Beside accuracy, ECE,
Brier and AUROC: the Brier skill against the best constant and, within difficulty levels, the AUROC and the skill
against each level's accuracy (a confidence that only reads the level scores 0.5 and 0), with bootstrap 95%
intervals at the final evaluation, and the untrained reference: the sampling agreement of `--agreement-samples`
answers at temperature 1 with the greedy answer, and its cost in generated tokens. Multi-turn's final evaluation also
scores a second confidence column, the mean of `--confidence-samples` stated confidences sampled at temperature 1 on
each greedy answer's confidence turn (`stated_confidence_mean_of_k`, with its cost); single-turn states its
confidence inside the answer's completion, so it has no such column.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from common import (
    GRPO_BASELINES,
    device_args,
    device_name,
    fixed_length,
    interleaved_step_times,
    load_model,
    machine_load,
    on_cuda,
    plot_step_times,
    results_dir,
    rlcr_cpu_run,
    scratch_dir,
    summarize,
    write_result,
)
from single_turn_rlcr import AnswerKLGRPOTrainer, single_turn_rlcr_reward, single_turn_twins
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from trl_ext import default_model_path
from trl_ext.data import graded_arithmetic
from trl_ext.evaluation.agreement import sampled_completions, sampling_agreement
from trl_ext.evaluation.greedy import greedy_completions
from trl_ext.evaluation.records import prompt_text
from trl_ext.evaluation.rlcr import MEAN_OF_K, calibration_evaluation, evaluate_calibration
from trl_ext.models.warmup import rlcr_format_examples
from trl_ext.recipe.rlcr import SECOND_STAGES
from trl_ext.rewards import extract_answer, extract_confidence, make_accuracy_reward, verify_answer
from trl_ext.testing import ScriptedGeneration, cpu_test_args
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


RESULTS = results_dir()
CONFIDENCE_PROMPT = (
    "How likely is it that your answer above is correct? Reply with a probability between 0 and 1 inside "
    "<confidence></confidence>, for example <confidence>0.7</confidence>."
)


# -- overhead -----------------------------------------------------------------------------------------------------
def overhead(steps: int, model_path: str | None = None) -> dict:
    answer_len, confidence_len, g_a, g_c = 32, 16, 4, 2
    model_path = model_path or default_model_path()
    tok = AutoTokenizer.from_pretrained(model_path)  # each trainer below loads its own model
    answer = fixed_length(tok, "<think>adding</think><answer>7</answer>", answer_len)
    confidence = fixed_length(tok, "<confidence>0.7</confidence>", confidence_len)
    data = graded_arithmetic(64, seed=0)
    common = dict(
        max_steps=steps + 1,
        learning_rate=1e-6,
        activation_checkpointing=False,
        shuffle_dataset=False,
        max_completion_length=answer_len,
        **device_args(),
    )
    runs = {}

    # Plain GRPO on the same generated tokens: one prompt's 4 rows of answer length, two prompts' 8 rows of
    # confidence length (12 rows, 4*32 + 8*16 tokens), with accuracy as the reward; as TRL ships it, and on the
    # trainers' CPU log-prob path (labelled positions only, small tiles): the ratio to the second measures RLCR's
    # algorithm, to the first what a user sees.
    for name, (trainer_cls, config_cls) in GRPO_BASELINES.items():
        model, tok = load_model(model_path)
        args = cpu_test_args(
            scratch_dir(), config_cls, per_device_train_batch_size=g_a * (1 + g_c), num_generations=g_a, **common
        )
        grpo = trainer_cls(
            model=model, reward_funcs=make_accuracy_reward(), args=args, train_dataset=data, processing_class=tok
        )
        calls = []

        def grpo_script(prompt_text, k, calls=calls):
            calls.append(prompt_text)
            return answer if (len(calls) - 1) % 12 < g_a else confidence

        runs[name] = (grpo, ScriptedGeneration(grpo, grpo_script))

    # RLCR with the packed loss forward (default) and with rows scored one by one.
    for name, share_prefix in (("rlcr", True), ("rlcr_unpacked", False)):
        model, tok = load_model(model_path)
        args = cpu_test_args(
            scratch_dir(),
            RLCRMultiTurnConfig,
            per_device_train_batch_size=g_a,
            num_generations=g_a,
            num_generations_confidence=g_c,
            max_confidence_length=confidence_len,
            confidence_prompt=CONFIDENCE_PROMPT,
            share_prefix=share_prefix,
            **common,
        )
        rlcr = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
        runs[name] = (rlcr, ScriptedGeneration(rlcr, lambda p, k: confidence if CONFIDENCE_PROMPT in p else answer))

    load_before = machine_load()
    times = interleaved_step_times(runs)
    return {
        "model": "SmolLM2-135M-Instruct (embedded default), "
        + ("bfloat16, SDPA, " if on_cuda() else "float32, ")
        + device_name(),
        "rows_per_step": g_a * (1 + g_c),
        "generated_tokens_per_step": g_a * answer_len + g_a * g_c * confidence_len,
        "measured_steps": steps,
        "order": "interleaved: one step of each configuration in turn (grpo, grpo_cpu_tiles, rlcr, rlcr_unpacked), "
        "warm-up dropped",
        "machine_load_before": load_before,
        "machine_load_after": machine_load(),
        "step_times": summarize(times),
    }


# -- calibration curves ---------------------------------------------------------------------------------------------
SINGLE_TURN_SUFFIX = " Then state your confidence that it is correct (0 to 1) inside <confidence></confidence>."
# Set by the benchmark itself: the seed and step count are the pair's, the rows per step come from the token matching
# (`--single-turn-rows` to fix them), and the generated-token count reads one log per step.
SINGLE_TURN_FIXED = (
    "output_dir",
    "seed",
    "max_steps",
    "logging_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "generation_batch_size",
    "steps_per_generation",
)


def single_turn_overrides(flags: list[str]) -> dict:
    """The single-turn run's `--<GRPOConfig field> <value>` pairs (the arguments after `--`); values read as JSON
    where they parse (`1e-5`, `0.1`, `true`), else as strings (`batch`)."""
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    if len(flags) % 2:
        raise SystemExit(f"after `--`: pairs of `--<GRPOConfig field> <value>` expected (got {flags})")
    overrides = {}
    for flag, text in zip(flags[::2], flags[1::2]):
        name = flag.removeprefix("--")
        if not flag.startswith("--") or name not in names:
            raise SystemExit(
                f"after `--`: {flag!r} is not a GRPOConfig field; pass the single-turn run's settings as "
                "`--<field> <value>`, e.g. `-- --learning_rate 1e-5 --beta 0.1`"
            )
        if name in SINGLE_TURN_FIXED:
            raise SystemExit(
                f"after `--`: {flag} is set by the benchmark (rows per step: --single-turn-rows; steps: --steps; "
                "seeds: --seeds)"
            )
        try:
            overrides[name] = json.loads(text)
        except ValueError:
            overrides[name] = text
    return overrides


def single_turn_settings(base_args, overrides: dict) -> dict:
    """The single-turn run's GRPOConfig settings: multi-turn's where both have them, then `overrides`."""
    return {
        "num_generations": 4,
        # room for an answer and a confidence, each of multi-turn's length
        "max_completion_length": base_args.max_completion_length + base_args.max_confidence_length,
        "temperature": base_args.temperature,
        "learning_rate": base_args.learning_rate,
        "lr_scheduler_type": base_args.lr_scheduler_type,
        "beta": base_args.beta,  # on the answer tokens only: AnswerKLGRPOTrainer
        # Multi-turn divides its confidence rows' advantages by the batch's Brier std (`confidence_scale_rewards
        # batch`; the YAML says why: standardised per prompt, the stated confidence drifted to the training batches'
        # majority outcome). Its answer rows keep TRL's per-prompt std, which at 2 answers per prompt and a 0/1
        # reward gives every right/wrong pair the same +-0.71 (an all-equal pair 0) whichever the scaling. A
        # single-turn reward sums accuracy and Brier, so one scaling applies to both parts: per prompt, a group whose
        # replies are all right (or all wrong) differs only in its tiny Brier terms, which the group std inflates to
        # full advantages (the drift); the batch std keeps each at its size, as multi-turn's confidence rows are
        # kept, and scales the accuracy differences alike for every prompt.
        "scale_rewards": "batch",
        **overrides,
    }


def matched_rows(tokens_per_step: float, reply_tokens: float, num_generations: int) -> int:
    """Single-turn replies per step to generate `tokens_per_step` tokens at `reply_tokens` per reply: a whole number
    of groups of `num_generations`, at least one."""
    return max(1, round(tokens_per_step / (reply_tokens * num_generations))) * num_generations


def tokens_per_step(log_history: list[dict], row_counts: dict[str, int]) -> list[float]:
    """Generated tokens of each training step, from its log (`logging_steps=1`): mean completion length x rows, per
    logged length key (multi-turn: answers and confidences)."""
    return [sum(log[key] * rows for key, rows in row_counts.items()) for log in log_history if "step_time" in log]


def single_turn_prompt_ids(tokenizer, dataset) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
        for p in dataset["prompt"]
    ]


def mean_reply_tokens(model, tokenizer, dataset, settings: dict, seed: int) -> float:
    """Mean generated tokens (EOS included, as TRL's `completions/mean_length` counts them) of single-turn replies
    sampled as training samples them: `num_generations` per question at its temperature and length limit."""
    samples = sampled_completions(
        model,
        tokenizer,
        single_turn_prompt_ids(tokenizer, dataset),
        settings["num_generations"],
        settings["max_completion_length"],
        temperature=settings["temperature"],
        seed=seed,
    )
    return statistics.mean(len(reply) for group in samples for reply in group)


@torch.no_grad()
def evaluate_single_turn(model, tokenizer, dataset, max_new_tokens: int, agreement_samples: int = 0, seed: int = 0):
    """Greedy single-turn replies, the answer and the confidence read from the same completion, scored as the
    multi-turn evaluation scores (accuracy over every row, calibration over the parsed confidences; a
    `CalibrationEvaluation`), with the sampling agreement of `agreement_samples` replies when asked for."""
    was_training = model.training
    model.eval()
    rows, sampled_tokens = [], 0
    for start in range(0, len(dataset), 16):
        batch = dataset[start : start + 16]
        prompts = single_turn_prompt_ids(tokenizer, batch)
        texts = [
            tokenizer.decode(ids, skip_special_tokens=True)
            for ids in greedy_completions(model, tokenizer, prompts, max_new_tokens)
        ]
        agreements = [None] * len(texts)
        if agreement_samples:
            agreements, tokens = sampling_agreement(
                model, tokenizer, prompts, texts, agreement_samples, max_new_tokens, seed=seed + start
            )
            sampled_tokens += tokens
        for prompt, level, gold, text, agreement in zip(
            batch["prompt"], batch["level"], batch["solution"], texts, agreements
        ):
            answer = extract_answer(text, "answer")
            rows.append(
                {
                    "prompt": prompt_text(prompt),
                    "group": level,
                    "gold": gold,
                    "answer": text,
                    "correct": int(bool(answer) and verify_answer(gold, answer)),
                    "confidence": extract_confidence(text, "confidence"),
                    **({"agreement": agreement} if agreement_samples else {}),
                }
            )
    model.train(was_training)
    cost = {"samples_per_question": agreement_samples, "generated_tokens": sampled_tokens}
    return calibration_evaluation(rows, seed=seed, agreement_cost=cost if agreement_samples else None)


class EvaluateEvery(TrainerCallback):
    """Evaluate the model on held-out questions before training and every `every` steps, with the generated tokens
    so far (from TRL's logged mean completion lengths). `evaluate(final)` returns a `CalibrationEvaluation`; the
    final one (at `max_steps`) also gives the sampling agreement, and its per-sample rows are kept (`records`)."""

    def __init__(self, evaluate, every: int, row_counts: dict[str, int]):
        self.evaluate, self.every, self.row_counts, self.points, self.records = evaluate, every, row_counts, [], []

    def _point(self, state):
        tokens = sum(tokens_per_step(state.log_history, self.row_counts))
        final = state.global_step >= state.max_steps
        result = self.evaluate(final)
        self.points.append({"step": state.global_step, "generated_tokens": tokens, **_evaluation_point(result, final)})
        if final:
            self.records = result.rows

    def on_train_begin(self, args, state, control, **kwargs):
        self._point(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # after the step's log, so its generated tokens are counted
        if "step_time" in (logs or {}) and state.global_step % self.every == 0:
            self._point(state)


def single_turn_trainer(base_args):
    """The baseline's trainer with multi-turn's KL placement: on the answer tokens only (`AnswerKLGRPOTrainer`) when
    multi-turn's confidence rows have none (`confidence_beta 0`), on every token (GRPOTrainer) when they have the
    answers' `beta`. A single-turn reply has one KL coefficient, so other settings have no counterpart."""
    confidence_beta = base_args.beta if base_args.confidence_beta is None else base_args.confidence_beta
    if confidence_beta == 0:
        return AnswerKLGRPOTrainer
    if confidence_beta == base_args.beta:
        return GRPOTrainer
    raise SystemExit(
        f"confidence_beta {confidence_beta} differs from beta {base_args.beta} and from 0: the single-turn baseline "
        "has one KL coefficient for its whole reply. Use --confidence_beta 0 or the value of --beta."
    )


def calibration(
    steps: int | None,
    seeds: list[int],
    every: int,
    split: str,
    agreement_samples: int,
    overrides: dict | None = None,
    methods: tuple[str, ...] = ("multi_turn", "single_turn"),
    single_rows: int | None = None,
    match_tokens: dict | None = None,
    confidence_samples: int = 0,
) -> tuple[dict, list[dict]]:
    """Multi-turn RLCR (the recipe's embedded-default run) against single-turn RLCR on GRPOTrainer with its KL on the
    answer tokens only (`AnswerKLGRPOTrainer`), both from one format warm-up (per seed) that teaches both formats, one
    pair of runs per seed, evaluated on the built-in data's `split` (`tune` to choose, `report` to publish).

    Equal generated tokens, measured: single-turn gets as many replies per step as match multi-turn's measured
    generated tokens per step (its own run's, or `match_tokens[seed]` from an earlier result when only single-turn
    runs) at the mean length of replies the warm-up model samples for training questions; both runs' generated
    tokens (TRL's logged lengths x rows) are reported per seed. `overrides`: the single-turn run's GRPOConfig
    settings (its tuning); `single_rows` fixes its replies per step instead of matching. `confidence_samples`:
    multi-turn's final evaluation also scores the mean of that many sampled stated confidences per answer."""
    from copy import deepcopy

    overrides = overrides or {}
    flags = ("--eval_split", split, *(("--use_cpu", "false") if on_cuda() else ()))
    script_args, base_args, train, evaluation = rlcr_cpu_run(flags)
    # the recipe's split of its training rows: the warm-up's first, RL's (and the second stage's) after them
    n = script_args.warmup_samples
    warmup_rows, train = train.select(range(n)), train.select(range(n, len(train)))
    steps = steps or base_args.max_steps
    single_turn_prompt = script_args.system_prompt + SINGLE_TURN_SUFFIX
    # chosen once, before the warm-ups: a KL the baseline cannot place fails before half an hour of building
    single_turn_class = single_turn_trainer(base_args)

    second = script_args.warmup_confidences
    if second == "agreement":
        raise SystemExit("--warmup_confidences agreement: the calibration benchmark has no single-turn twin of it")

    def warm_up(seed: int) -> str:
        # A seed is the whole pipeline, as the recipe's --seed is: the warm-up's confidence draw and SFT run too.
        seeded = deepcopy(base_args)
        seeded.seed = seed
        examples = rlcr_format_examples(
            warmup_rows,
            base_args.confidence_prompt,
            seed=seed,
            single_turn_system_prompt=single_turn_prompt,
            confidence_draw="weighted" if second in SECOND_STAGES else second,
        )
        stage1 = script_args.build_warmup(default_model_path(), examples, seeded)[0]  # the recipe's build and cache
        if second not in SECOND_STAGES:
            return stage1
        # The recipe's second stage, each confidence it teaches taught in the single-turn format too (the model's
        # answer and that confidence in one reply); its answer turns are the first stage's multi-turn ones.
        answer_turns = [
            e
            for e in examples
            if all(m["role"] != "assistant" for m in e["prompt"]) and e["prompt"][0]["content"] != single_turn_prompt
        ]
        stage = SECOND_STAGES[second](
            stage1,
            train,
            answer_turns,
            script_args,
            seeded,
            twins=lambda turns: single_turn_twins(turns, single_turn_prompt),
        )
        return stage["model"]

    warmups, tokens = {}, {}
    single_train, single_eval = (with_system_prompt(d, single_turn_prompt) for d in (train, evaluation))
    g_c = base_args.num_generations_confidence
    answers = base_args.per_device_train_batch_size * base_args.gradient_accumulation_steps  # per step
    multi_counts = {"completions/mean_length": answers, "confidence/completions/mean_length": answers * g_c}
    settings = single_turn_settings(base_args, overrides)
    runs = {method: [] for method in methods}
    records = []  # the final evaluations' per-sample rows, per method and seed
    for seed in seeds:
        model_path = warmups[seed] = warm_up(seed)
        seed_tokens = tokens[str(seed)] = {}
        if "multi_turn" in methods:
            # float32 weights (with bf16 autocast where the recipe's `bf16` asks for it): in bfloat16 weights Adam's
            # steps of about the learning rate (5e-5) fall below their precision, on a GPU too
            model, tokenizer = load_model(model_path, torch.float32)
            args = deepcopy(base_args)
            args.__dict__.update(
                output_dir=scratch_dir(),
                seed=seed,
                max_steps=steps,
                save_strategy="no",
                eval_strategy="no",  # evaluated by the callback below, as the single-turn run is
                disable_tqdm=True,
            )
            trainer = RLCRMultiTurnTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
            callback = EvaluateEvery(
                lambda final, t=trainer: evaluate_calibration(
                    t.model,
                    t.processing_class,
                    evaluation,
                    t.args,
                    batch_size=t.args.per_device_eval_batch_size,
                    progress=False,
                    agreement_samples=agreement_samples if final else 0,
                    confidence_samples=confidence_samples if final else 0,
                ),
                every,
                multi_counts,
            )
            trainer.add_callback(callback)
            trainer.train()
            runs["multi_turn"].append({"seed": seed, "points": callback.points})
            records += [{"method": "multi_turn", "seed": seed, **row} for row in callback.records]
            per_step = tokens_per_step(trainer.state.log_history, multi_counts)
            seed_tokens["multi_turn_rows_per_step"] = answers * (1 + g_c)
            seed_tokens["multi_turn_per_step"] = statistics.mean(per_step)
            seed_tokens["multi_turn_total"] = sum(per_step)
        if "single_turn" not in methods:
            continue
        model, tokenizer = load_model(model_path, torch.float32)
        if on_cuda():
            model.to("cuda")  # where the trainer would put it: the probe below samples there
        target = seed_tokens.get("multi_turn_per_step") or (match_tokens or {}).get(str(seed))
        if single_rows is None and target is None:
            raise SystemExit(f"seed {seed}: no multi-turn tokens per step to match (--match-tokens-from lacks it)")
        reply_tokens = mean_reply_tokens(model, tokenizer, single_train.select(range(16)), settings, seed)
        rows = single_rows or matched_rows(target, reply_tokens, settings["num_generations"])
        fixed = dict(seed=seed, max_steps=steps, per_device_train_batch_size=rows, logging_steps=1)
        machine = {"bf16": base_args.bf16, "activation_checkpointing": False, **device_args()}
        args = cpu_test_args(scratch_dir(), GRPOConfig, **{**machine, **settings, **fixed})
        trainer = single_turn_class(
            model=model,
            reward_funcs=single_turn_rlcr_reward(),
            args=args,
            train_dataset=single_train,
            processing_class=tokenizer,
        )
        callback = EvaluateEvery(
            lambda final, t=trainer, seed=seed: evaluate_single_turn(
                t.model,
                t.processing_class,
                single_eval,
                settings["max_completion_length"],
                agreement_samples if final else 0,
                seed,
            ),
            every,
            {"completions/mean_length": rows},
        )
        trainer.add_callback(callback)
        trainer.train()
        runs["single_turn"].append({"seed": seed, "points": callback.points})
        records += [{"method": "single_turn", "seed": seed, **row} for row in callback.records]
        per_step = tokens_per_step(trainer.state.log_history, {"completions/mean_length": rows})
        seed_tokens.update(
            single_turn_target_per_step=target,
            single_turn_probe_reply_tokens=reply_tokens,
            single_turn_rows_per_step=rows,
            single_turn_per_step=statistics.mean(per_step),
            single_turn_total=sum(per_step),
        )
        if target:
            seed_tokens["single_over_multi"] = seed_tokens["single_turn_per_step"] / target
    autocast = ", bf16 autocast" if base_args.bf16 else ""
    device = f"float32 weights{autocast}, {device_name() if on_cuda() else 'CPU'}"
    return {
        "model": f"format warm-up (both formats) of SmolLM2-135M-Instruct, {device}",
        "warmup_models": warmups,
        "steps": steps,
        "seeds": seeds,
        "evaluate_every": every,
        "evaluation": f"{len(evaluation)} held-out questions of the {split} split, greedy",
        "split": split,
        "agreement_samples": agreement_samples,
        "confidence_samples": confidence_samples,
        "single_turn": {
            "trainer": single_turn_class.__name__,
            "settings": settings,
            "overrides": overrides,
            "rows_per_step": single_rows or "matched to multi-turn's measured generated tokens per step",
        },
        "generated_tokens": tokens,
        "summary": calibration_summary(runs, tokens),
        "runs": runs,
    }, records


POINT_METRICS = ("ece", "brier", "auroc", "brier_skill", "auroc_within_groups", "brier_skill_groups")


def _evaluation_point(result, final: bool) -> dict:
    """An evaluation's metrics (the final one's with their bootstrap 95% intervals, and the sampling agreement's)."""
    point = {
        "accuracy": result.accuracy,
        **{key: getattr(result.report, key) for key in POINT_METRICS},
        "parse_fail_rate": result.confidence_parse_fail_rate,
    }
    if final:
        point["intervals"] = {**result.report.intervals, "accuracy": result.accuracy_interval}
        if result.agreement_report is not None:
            point["sampling_agreement"] = {**result.agreement_report.to_dict(), **result.agreement_cost}
            point["sampling_agreement"].pop("bins")
        if result.mean_report is not None:
            point[MEAN_OF_K] = result.to_dict()[MEAN_OF_K]
            point[MEAN_OF_K].pop("bins")
    return point


def with_system_prompt(dataset, system_prompt):
    return dataset.map(
        lambda row: {
            "prompt": [
                {"role": "system", "content": system_prompt},
                *(m for m in row["prompt"] if m["role"] != "system"),
            ]
        }
    )


def _spread(values: list) -> dict | None:
    """The mean, min and max of `values` without the missing ones (`None`, NaN); `None` when none is left."""
    values = [v for v in values if v is not None and v == v]
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values)} if values else None


def calibration_summary(runs: dict, tokens: dict) -> dict:
    """Final held-out figures per method (mean, min, max over seeds), the generated tokens per method and seed, and,
    when both methods ran, the per-seed differences and whether multi-turn's AUROC within levels is at least
    single-turn's in each seed (the issue's bar)."""
    summary = {}
    for name, seeded in runs.items():
        for key in ("accuracy", "parse_fail_rate", *POINT_METRICS):
            summary.setdefault(name, {})[key] = _spread([run["points"][-1][key] for run in seeded])
        summary[name]["generated_tokens"] = {str(run["seed"]): run["points"][-1]["generated_tokens"] for run in seeded}
        means = [run["points"][-1][MEAN_OF_K] for run in seeded if MEAN_OF_K in run["points"][-1]]
        if means:
            summary[name][MEAN_OF_K] = {
                key: _spread([m[key] for m in means]) for key in ("auroc", "auroc_within_groups", "brier_skill")
            }
    if set(runs) != {"multi_turn", "single_turn"}:
        return summary
    pairs = list(zip(runs["multi_turn"], runs["single_turn"]))
    assert all(m["seed"] == s["seed"] for m, s in pairs)
    summary["seeds"] = [m["seed"] for m, _ in pairs]
    for key in ("accuracy", *POINT_METRICS):
        values = [(m["points"][-1][key], s["points"][-1][key]) for m, s in pairs]
        summary[f"multi_minus_single_{key}"] = [None if a is None or b is None else a - b for a, b in values]
    # None: undefined in a seed (one method's answers all right or all wrong within every level)
    at_least = [None if d is None else d >= 0 for d in summary["multi_minus_single_auroc_within_groups"]]
    summary["multi_within_level_auroc_at_least_single"] = at_least
    holds = sum(v is True for v in at_least)
    ratios = [tokens.get(str(m["seed"]), {}).get("single_over_multi") for m, _ in pairs]
    per_seed = ", ".join(f"seed {seed}: {v}" for seed, v in zip(summary["seeds"], at_least))
    ratio_text = ", ".join("?" if r is None else f"{r:.2f}" for r in ratios)
    summary["verdict"] = (
        f"multi-turn's within-level AUROC >= single-turn's in {holds} of {len(pairs)} seeds ({per_seed}); "
        f"single-turn generated {ratio_text} x multi-turn's tokens per step"
    )
    return summary


def merge_calibration(parts: list[dict]) -> dict:
    """Calibration results of the same settings run apart (one process per seed, `--parallel`) as one result: their
    seeds, warm-ups, generated tokens and runs joined, the summary recomputed, and each part's seeds and provenance
    kept (`merged_from`)."""
    first = parts[0]
    for part in parts[1:]:
        for key in ("steps", "split", "evaluate_every", "agreement_samples", "confidence_samples", "single_turn"):
            if part.get(key) != first.get(key):  # results written before confidence_samples existed lack it
                raise ValueError(f"results to merge differ in {key!r}: {first.get(key)!r} vs {part.get(key)!r}")
    merged = {key: value for key, value in first.items() if key not in ("provenance", "records_file")}
    merged["seeds"] = [seed for part in parts for seed in part["seeds"]]
    for key in ("warmup_models", "generated_tokens"):
        merged[key] = {k: v for part in parts for k, v in part[key].items()}
    merged["runs"] = {method: [run for part in parts for run in part["runs"][method]] for method in first["runs"]}
    merged["summary"] = calibration_summary(merged["runs"], merged["generated_tokens"])
    merged["merged_from"] = [{"seeds": part["seeds"], "provenance": part.get("provenance")} for part in parts]
    return merged


def plot_calibration(result: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = [
        ("ece", "held-out ECE"),
        ("brier_skill", "held-out Brier skill (0: the best constant)"),
        ("auroc", "held-out AUROC"),
        ("auroc_within_groups", "held-out AUROC within levels"),
        ("parse_fail_rate", "confidence parse failures"),
        ("accuracy", "held-out accuracy"),
    ]
    fig = Figure(figsize=(23, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (key, title) in zip(fig.subplots(1, len(keys)), keys):
        for color, (name, seeded) in zip(("C0", "C1"), result["runs"].items()):
            tokens = [
                statistics.mean(p["generated_tokens"] for p in points)
                for points in zip(*(run["points"] for run in seeded))
            ]
            values = [[p[key] if p[key] is not None else float("nan") for p in run["points"]] for run in seeded]
            columns = list(zip(*values))
            ax.fill_between(tokens, [min(c) for c in columns], [max(c) for c in columns], color=color, alpha=0.2)
            ax.plot(
                tokens,
                [statistics.mean(c) for c in columns],
                color=color,
                marker="o",
                markersize=3,
                label=f"{name.replace('_', '-')} (mean of {len(seeded)} seeds; band: min-max)",
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("generated tokens (cumulative)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7)
    verdict = result["summary"].get("verdict")
    answer_only = result["single_turn"]["trainer"].startswith("AnswerKLGRPOTrainer")
    kl = "KL on its answer tokens" if answer_only else "KL on every token"
    fig.suptitle(
        f"RLCR, {result['model']}, one per seed: multi-turn vs single-turn ({kl}, batch reward "
        f"scaling, replies per step matched to multi-turn's measured tokens), greedy evaluation on "
        f"{result['evaluation']}" + (f"\n{verdict}" if verdict else ""),
        fontsize=10,
    )
    fig.savefig(path, dpi=110)


def plot_overhead(result: dict, path: Path) -> None:
    load = [result[k]["load_average_1_5_15_min"][0] for k in ("machine_load_before", "machine_load_after")]
    plot_step_times(
        {f"same generated tokens (1-min load {load[0]:.1f} -> {load[1]:.1f})": result["step_times"]},
        path,
        "RLCR vs GRPOTrainer, interleaved steps",
    )


def result_name(args) -> str:
    """`rlcr_calibration` (report split), `rlcr_calibration_tune` (tune split), then `_<tag>` when tagged."""
    name = "rlcr_calibration" + ("" if args.split == "report" else f"_{args.split}")
    return name + (f"_{args.tag}" if args.tag else "")


def calibration_parallel(args, extra: list[str]) -> tuple[dict, list[dict]]:
    """One process per seed, `args.parallel` at a time, each with its share of the CPU cores, then one merged
    result. A failed seed names its log."""
    from concurrent.futures import ThreadPoolExecutor

    from trl_ext.evaluation.records import read_jsonl

    tmp = Path(tempfile.mkdtemp(prefix="rlcr_calibration_"))  # small (logs, JSON): kept for a failed seed's log
    flags = ["--split", args.split, "--evaluate-every", str(args.evaluate_every)]
    flags += ["--agreement-samples", str(args.agreement_samples), "--methods", *args.methods]
    flags += ["--confidence-samples", str(args.confidence_samples)]
    for flag, value in (
        ("--steps", args.steps),
        ("--single-turn-rows", args.single_turn_rows),
        ("--match-tokens-from", args.match_tokens_from and Path(args.match_tokens_from).resolve()),
        ("--tag", args.tag),
    ):
        flags += [] if value is None else [flag, str(value)]
    threads = str(max(1, (os.cpu_count() or 1) // args.parallel))

    def run(seed: int):
        out, log = tmp / str(seed), tmp / f"{seed}.log"
        env = {**os.environ, "TRL_EXT_BENCH_RESULTS": str(out), "OMP_NUM_THREADS": threads}
        command = [sys.executable, __file__, "calibration", "--seeds", str(seed), *flags, "--", *extra]
        with log.open("w") as stream:
            code = subprocess.run(command, env=env, stdout=stream, stderr=subprocess.STDOUT).returncode
        if code:
            raise RuntimeError(f"seed {seed} failed (exit {code}); its log: {log}")
        path = out / f"{result_name(args)}.json"
        return json.loads(path.read_text()), read_jsonl(path.with_suffix(".jsonl"))

    with ThreadPoolExecutor(args.parallel) as pool:
        parts = list(pool.map(run, args.seeds))
    return merge_calibration([result for result, _ in parts]), [row for _, rows in parts for row in rows]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["overhead", "calibration"])
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per trainer (overhead: 4 measured steps; calibration: the recipe's max_steps)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="calibration: one pair per seed")
    parser.add_argument("--evaluate-every", type=int, default=4, help="calibration: steps between evaluations")
    parser.add_argument(
        "--split",
        choices=["tune", "report"],
        default="tune",
        help="calibration: held-out questions from the tune split (choosing settings) or the report split (the "
        "published numbers: rlcr_calibration.json; tune: rlcr_calibration_tune.json)",
    )
    parser.add_argument(
        "--agreement-samples",
        type=int,
        default=8,
        help="calibration: answers sampled per question at temperature 1 for the sampling-agreement reference "
        "(final evaluation; 0: off)",
    )
    parser.add_argument(
        "--confidence-samples",
        type=int,
        default=8,
        help="calibration: stated confidences sampled per multi-turn answer at temperature 1 on its confidence turn, "
        "scored by their mean beside the greedy one (final evaluation; 0: off)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=["multi_turn", "single_turn"],
        default=["multi_turn", "single_turn"],
        help="calibration: which runs (single_turn alone: tuning the baseline, with --match-tokens-from)",
    )
    parser.add_argument(
        "--single-turn-rows",
        type=int,
        help="calibration: single-turn replies per step (default: matched to multi-turn's measured generated tokens)",
    )
    parser.add_argument(
        "--match-tokens-from",
        help="calibration: a result JSON whose multi-turn generated tokens per step (per seed) single-turn matches "
        "when multi-turn does not run",
    )
    parser.add_argument(
        "--tag",
        help="calibration: results file suffix (needed with one method, or single-turn settings on the tune split)",
    )
    parser.add_argument(
        "--parallel", type=int, default=1, help="calibration: seeds run at once, one process each (then merged)"
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="calibration: merge these results of the same settings (other seeds, e.g. run in separate calls) into "
        "one, instead of running",
    )
    parser.add_argument("--model", help="overhead: a checkpoint directory instead of the embedded default")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = build_parser()
    args = parser.parse_args(own)
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.part == "overhead":
        result = overhead(args.steps or 4, args.model)
        name = "overhead_cuda" if on_cuda() else "overhead"  # CPU and GPU figures side by side
        name += "" if args.model is None else "_tiny"
        # before the plot, which may fail; every trainer has cpu_test_args' seed
        write_result(RESULTS / f"rlcr_{name}.json", result, seeds=[0])
        plot_overhead(result, RESULTS / f"rlcr_{name}.png")
    elif args.merge:
        from trl_ext.evaluation.records import read_jsonl

        paths = [Path(path) for path in args.merge]
        parts = [json.loads(path.read_text()) for path in paths]
        result = merge_calibration(parts)
        records = [row for path, part in zip(paths, parts) for row in read_jsonl(path.parent / part["records_file"])]
        args.split = result["split"]  # names the merged file
    else:
        overrides = single_turn_overrides(extra)
        if (len(args.methods) < 2 or (overrides and args.split == "tune")) and not args.tag:
            parser.error(
                "--tag is needed with one method, or with single-turn settings after `--` on the tune split: a "
                "sweep's results must not replace the benchmark's"
            )
        match_tokens = None
        if args.match_tokens_from:
            earlier = json.loads(Path(args.match_tokens_from).read_text())["generated_tokens"]
            match_tokens = {
                seed: t["multi_turn_per_step"] for seed, t in earlier.items() if "multi_turn_per_step" in t
            }
        if "multi_turn" not in args.methods and match_tokens is None and args.single_turn_rows is None:
            parser.error("single_turn alone needs --match-tokens-from (or --single-turn-rows)")
        if args.parallel > 1:
            result, records = calibration_parallel(args, extra)
        else:
            result, records = calibration(
                args.steps,
                args.seeds,
                args.evaluate_every,
                args.split,
                args.agreement_samples,
                overrides,
                tuple(args.methods),
                args.single_turn_rows,
                match_tokens,
                args.confidence_samples,
            )
    if args.part == "calibration":
        name = result_name(args)
        write_result(RESULTS / f"{name}.json", result, seeds=result["seeds"], records=records)
        plot_calibration(result, RESULTS / f"{name}.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("curves", "runs")}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
