"""Runs under torchrun: each trainer's held-out evaluation (`trainer.heldout_evaluate()`), scripted and real, then
`trainer.evaluate()` (TRL's loss with the held-out metrics added); reports per rank the metrics and the generation calls
this rank made.

Usage: heldout_ranks.py TRAINER [TRAINER ...], each `rlcr`, `replay` or `absolute_zero` (the arithmetic family's
solver on five of its held-out questions, one without gold, scored per level). Five questions: with two processes each
answers an equal share of three, rank 1's last one a padding copy whose results are dropped; with
`per_device_eval_batch_size=2` a share is answered in two chunks. The scripted answers depend on the question and the
sample index only, so one process and two must report the same metrics. The real evaluation (the tiny model's greedy
answers, transformers generation) must not hang and must report the same metrics on every process.
"""

import sys
import tempfile

from datasets import Dataset

from trl_ext.self_play import arithmetic_task
from trl_ext.self_play.arithmetic import heldout_questions
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm, write_rank_result
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)


CONFIDENCE_PROMPT = "Confidence? Reply <confidence>p</confidence>."
QUESTIONS = [("1+2", "3"), ("4+4", "8"), ("2*3", "6"), ("9-5", "4"), ("7+1", None)]  # the last one has no gold
RIGHT = {"1+2": True, "4+4": False, "2*3": True, "9-5": False, "7+1": True}
CONFIDENCE = {"1+2": "0.9", "4+4": "0.7", "2*3": "x", "9-5": "0.1", "7+1": "0.5"}  # 2*3: unparsable


def question_of(prompt_text):
    return next(q for q, _ in QUESTIONS if f"What is {q}?" in prompt_text)


def answer(question, k):
    gold = dict(QUESTIONS)[question] or "0"
    return gold if RIGHT[question] != bool(k % 2) else f"{gold}1"  # sample 1 flips right and wrong


def rlcr_script(prompt_text, k):
    question = question_of(prompt_text)
    if CONFIDENCE_PROMPT in prompt_text:
        return f"<confidence>{CONFIDENCE[question]}</confidence>"
    return "no answer" if question == "9-5" else f"<answer>{answer(question, k)}</answer>"


def replay_script(prompt_text, k):
    return answer(question_of(prompt_text), k)


def exact(completions, solution, **kwargs):
    return [
        None if s is None else float(c[0]["content"].strip() == s) for c, s in zip(completions, solution, strict=True)
    ]


def rows():
    return [{"prompt": [{"role": "user", "content": f"What is {q}?"}], "solution": s} for q, s in QUESTIONS]


def rlcr_trainer(**overrides):
    args = cpu_test_args(
        tempfile.mkdtemp(),
        RLCRMultiTurnConfig,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        max_completion_length=12,
        max_confidence_length=16,  # the scripted confidences whole (ScriptedGeneration does not cut them)
        per_device_eval_batch_size=2,
        **overrides,
    )
    model, tokenizer = tiny_causal_lm()
    data = Dataset.from_list(rows())
    trainer = RLCRMultiTurnTrainer(
        model=model, args=args, train_dataset=data, eval_dataset=data, processing_class=tokenizer
    )
    return trainer, rlcr_script


def replay_trainer(**overrides):
    args = cpu_test_args(
        tempfile.mkdtemp(),
        ReplayGRPOConfig,
        num_generations=2,
        max_completion_length=8,
        eval_temperature=1.0,
        eval_num_samples=2,
        per_device_eval_batch_size=2,
        **overrides,
    )
    model, tokenizer = tiny_causal_lm()
    data = Dataset.from_list(rows())
    trainer = ReplayGRPOTrainer(
        model=model,
        reward_funcs=exact,
        args=args,
        train_dataset=data,
        eval_dataset=data,
        processing_class=tokenizer,
    )
    return trainer, replay_script


# golds 15, 104, 40, 32 (levels 1, 2, 3, 1), then one without gold
SOLVER_QUESTIONS = [
    *heldout_questions(4, 0),
    {"question": "What is 1 + 1?", "expression": "1 + 1", "solution": None, "level": 2},
]
SOLVER_REPLIES = {"15": "<answer>15</answer>", "104": "<answer>100</answer>", "40": "<answer>40</answer>"}


def solver_script(prompt_text, k):
    question = next(q for q in SOLVER_QUESTIONS if q["expression"] in prompt_text)
    return SOLVER_REPLIES.get(question["solution"], "no idea")


def absolute_zero_trainer(**overrides):
    task = arithmetic_task()
    args = cpu_test_args(
        tempfile.mkdtemp(),
        AbsoluteZeroConfig,
        num_generations=2,
        max_completion_length=12,
        per_device_eval_batch_size=2,
        reward_weights=[1.0, 0.5],
        **overrides,
    )
    model, tokenizer = tiny_causal_lm()
    seeds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in "AB"])
    trainer = AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=seeds,
        heldout_questions=SOLVER_QUESTIONS,
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )
    return trainer, solver_script


def numbers(metrics):
    return {key: value for key, value in metrics.items() if key != "eval_seconds"}


def run(name):
    trainer, script = {"rlcr": rlcr_trainer, "replay": replay_trainer, "absolute_zero": absolute_zero_trainer}[name]()
    with ScriptedGeneration(trainer, script) as generation:
        scripted = trainer.heldout_evaluate()
    real = trainer.heldout_evaluate()  # the tiny model's own answers (sampled for replay, seeded)
    logged = numbers(trainer.state.log_history[-1])
    contract = trainer.evaluate()  # TRL's evaluation loss and metrics, the held-out ones added
    return {
        "world_size": trainer.accelerator.num_processes,
        "scripted": numbers(scripted),
        "real": numbers(real),
        "calls": [[len(call.prompt_ids), call.num_generations] for call in generation.calls],
        "logged": logged,
        "evaluate": {"keys": sorted(contract), "loss": contract["eval_loss"]},
    }


def main():
    write_rank_result({name: run(name) for name in sys.argv[1:]})


if __name__ == "__main__":
    main()
