"""A scripted task world for ReplayGRPOTrainer tests: tasks whose rollouts succeed on a fixed schedule.

Completions depend only on (global step, task, how many rows of that task this process generated in the step), so a
resumed run and an uninterrupted one script the same rollouts.
"""

from collections import Counter

from datasets import Dataset

from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import ReplayGRPOConfig, ReplayGRPOTrainer


SOLUTIONS = {"A": "7", "B": "8", "C": "9", "D": "10", "E": "11", "F": "12"}
RIGHT = {  # per task: which of the rows of a step answer correctly (cycled, shifted by the step)
    "A": [1, 0, 1, 0],
    "B": [0, 0, 0, 0],
    "C": [1, 0, 0, 0],
    "D": [1, 1, 1, 1],
    "E": [1, 1, 0, 0],
    "F": [0, 1, 0, 0],
}


def task_of(prompt_text):
    return next(t for t in SOLUTIONS if f"Task {t}:" in prompt_text)


def exact(completions, solution, **kwargs):
    return [1.0 if c[0]["content"].strip() == s else 0.0 for c, s in zip(completions, solution, strict=True)]


def dataset(tasks="ABCD"):
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Task {t}: what is it?"}], "solution": SOLUTIONS[t]} for t in tasks]
    )


def make_script(trainer):
    counts = Counter()

    def script(prompt_text, k):
        task, step = task_of(prompt_text), trainer.state.global_step
        j = counts[(step, task)]
        counts[(step, task)] += 1
        right = RIGHT[task][(j + step) % 4]
        return SOLUTIONS[task] if right else f"not {SOLUTIONS[task]}" + " x" * (j % 3)

    return script


def make_trainer(output_dir, tasks="ABCD", model=None, **overrides):
    if model is None:
        model, tokenizer = tiny_causal_lm()
    else:
        from trl_ext.testing import tiny_tokenizer

        tokenizer = tiny_tokenizer()
    settings = dict(
        max_steps=4,
        replay_start_ratio=0.0,
        shuffle_dataset=False,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
    )
    args = cpu_test_args(output_dir, ReplayGRPOConfig, **{**settings, **overrides})
    return ReplayGRPOTrainer(
        model=model, reward_funcs=exact, args=args, train_dataset=dataset(tasks), processing_class=tokenizer
    )


class PlanRecorder:
    """Records every ReplayPlan the trainer makes."""

    def __init__(self, trainer):
        self.trainer, self.plans = trainer, []

    def __enter__(self):
        original = self.trainer._plan_batch

        def record(inputs):
            plan = original(inputs)
            self.plans.append(plan)
            return plan

        self.trainer._plan_batch = record
        return self

    def __exit__(self, *exc):
        del self.trainer._plan_batch


def scripted(trainer):
    return ScriptedGeneration(trainer, make_script(trainer))
