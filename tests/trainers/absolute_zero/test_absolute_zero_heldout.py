"""AbsoluteZeroTrainer's held-out evaluation (`trainer.evaluate()`, trainers/seams/heldout.py): the solver answers the
family's held-out questions at the configured steps; accuracy overall and per level, by hand."""

import pytest
from datasets import Dataset

from trl_ext.self_play import arithmetic_task
from trl_ext.self_play.arithmetic import heldout_questions
from trl_ext.testing import ScriptedGeneration, cpu_test_args, tiny_causal_lm
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


QUESTIONS = [
    *heldout_questions(6, 0),  # golds 15, 104, 40 (levels 1, 2, 3), then 32, -21, 94
    {"question": "What is 1 + 1?", "expression": "1 + 1", "solution": None, "level": 1},  # no gold
]
REPLIES = ["<answer>15</answer>", "<answer>104</answer>", "<answer>41</answer>", "no idea", "<answer>-21</answer>"]
REPLIES += ["<answer>0</answer>", "<answer>2</answer>"]  # scores 1, 1, 0, 0 (unparsable), 1, 0, None


def make_trainer(tmp_path, **kwargs):
    task = arithmetic_task()
    model, tokenizer = tiny_causal_lm()
    seeds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Seed {c}"}]} for c in "AB"])
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        num_questions_per_prompt=2,
        max_completion_length=16,
        max_question_length=16,
        reward_weights=[1.0, 0.5],
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=4,
    )
    return AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=seeds,
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
        **kwargs,
    )


def test_solver_accuracy_per_level_at_the_eval_step(tmp_path):
    trainer = make_trainer(tmp_path, heldout_questions=QUESTIONS)

    def script(prompt_text, k):
        if trainer.model.training:  # self-play: a question, then answers right on every other row
            return "<question>1 + 2</question>" if "Seed" in prompt_text else ("<answer>3</answer>" if k % 2 else "4")
        return next(reply for q, reply in zip(QUESTIONS, REPLIES) if q["expression"] in prompt_text)

    with ScriptedGeneration(trainer, script):
        trainer.train()
    (log,) = [log for log in trainer.state.log_history if "eval_accuracy" in log]
    assert log["step"] == 2
    assert log["eval_accuracy"] == 0.5  # 3 of the 6 scorable questions
    assert log["eval_accuracy/level_1"] == 0.5 and log["eval_num_samples/level_1"] == 3
    assert log["eval_accuracy/level_2"] == 1.0 and log["eval_accuracy/level_3"] == 0.0
    assert log["eval_num_unscored"] == 1 and log["eval_num_questions"] == 7
    assert log["eval_seconds"] >= 0
    assert not any(key.startswith("eval_proposer/") for key in log)  # no self-play in the evaluation


def test_the_family_gives_the_evaluation_set(tmp_path):
    trainer = make_trainer(tmp_path, heldout_questions=arithmetic_task().heldout_questions)
    assert trainer.eval_dataset == heldout_questions(None, 0)  # the family's default size, seeded with args.seed


def test_no_evaluation_set_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="eval_dataset"):
        make_trainer(tmp_path)
