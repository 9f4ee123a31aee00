"""RLCRMultiTurnConfig validation: clear errors naming the field."""

import pytest
from datasets import Dataset

from trl_ext.testing import cpu_test_args, tiny_causal_lm
from trl_ext.trainers import RLCRMultiTurnConfig, RLCRMultiTurnTrainer


def config(tmp_path, **overrides):
    return cpu_test_args(tmp_path, RLCRMultiTurnConfig, per_device_train_batch_size=4, num_generations=2, **overrides)


def test_defaults(tmp_path):
    args = config(tmp_path)
    assert args.num_generations_confidence == 4 and args.lambda_ans == 1.0 and args.lambda_conf == 1.0
    assert args.max_confidence_length == 256 and args.confidence_scale_rewards == "none"
    assert args.confidence_normalization == "answer" and args.train_on_eos and args.solution_column == "solution"


def test_num_generations_answer_is_an_alias(tmp_path):
    args = config(tmp_path, num_generations_answer=4)
    assert args.num_generations == 4 and args.num_generations_answer == 4


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"num_generations_confidence": 1}, "num_generations_confidence"),
        ({"max_confidence_length": 0}, "max_confidence_length"),
        ({"lambda_ans": -1.0}, "lambda_ans"),
        ({"lambda_conf": float("nan")}, "lambda_conf"),
        ({"confidence_normalization": "prompt"}, "confidence_normalization"),
        ({"confidence_scale_rewards": "sometimes"}, "confidence_scale_rewards"),
        ({"answer_tag": "<answer>"}, "answer_tag"),
        ({"confidence_tag": "answer"}, "must differ"),
        ({"confidence_prompt": "  "}, "confidence_prompt"),
        ({"num_generations_answer": 3}, "num_generations"),  # 4 rows per device do not hold groups of 3
    ],
)
def test_bad_values_name_the_field(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=field):
        config(tmp_path, **overrides)


def test_scale_rewards_booleans_map_like_trl(tmp_path):
    assert config(tmp_path, confidence_scale_rewards=True).confidence_scale_rewards == "group"


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"prompt": [{"role": "user", "content": "q"}], "answer": "1"}], "'solution'"),
        ([{"prompt": ["not", "messages"], "solution": "1"}], "conversational"),
        ([{"question": "q", "solution": "1"}], "'prompt'"),
    ],
)
def test_dataset_problems_fail_at_init(tmp_path, rows, match):
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(ValueError, match=match):
        RLCRMultiTurnTrainer(
            model=model, args=config(tmp_path), train_dataset=Dataset.from_list(rows * 4), processing_class=tokenizer
        )


def test_plain_text_prompts_are_user_messages(tmp_path):
    model, tokenizer = tiny_causal_lm()
    rows = Dataset.from_list([{"prompt": "What is 1+1?", "solution": "2"}] * 4)
    trainer = RLCRMultiTurnTrainer(
        model=model, args=config(tmp_path), train_dataset=rows, eval_dataset=rows, processing_class=tokenizer
    )
    for split in (trainer.train_dataset, trainer.eval_dataset):
        assert split[0] == {"prompt": [{"role": "user", "content": "What is 1+1?"}], "solution": "2"}


def test_unsupported_trainer_arguments(tmp_path):
    model, tokenizer = tiny_causal_lm()
    for key, value in (("tools", [print]), ("environment_factory", object)):
        with pytest.raises(ValueError, match=f"`{key}`: the confidence turn.*ReplayGRPOTrainer or AbsoluteZero"):
            RLCRMultiTurnTrainer(model=model, args=config(tmp_path), processing_class=tokenizer, **{key: value})
    with pytest.raises(ValueError, match="rollout_func.*two-turn rollout"):
        RLCRMultiTurnTrainer(model=model, args=config(tmp_path), processing_class=tokenizer, rollout_func=print)
    with pytest.raises(TypeError, match="RLCRMultiTurnConfig"):
        from trl import GRPOConfig

        RLCRMultiTurnTrainer(model=model, args=cpu_test_args(tmp_path, GRPOConfig), processing_class=tokenizer)


def brevity(completions, **kwargs):
    return [0.0 for _ in completions]


def test_reward_weights_count_the_reward_functions_passed(tmp_path):
    model, tokenizer = tiny_causal_lm()
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "q"}], "solution": "1"}] * 4)
    args = config(tmp_path, reward_weights=[0.5], accuracy_weight=2.0)
    trainer = RLCRMultiTurnTrainer(
        model=model, reward_funcs=[brevity], args=args, train_dataset=data, processing_class=tokenizer
    )
    assert trainer.reward_func_names[1] == "brevity"
    assert trainer.reward_weights.tolist() == [2.0, 0.5]  # accuracy first
    assert args.reward_weights == [0.5]  # the config is left as given (reusable for another trainer)
    assert RLCRMultiTurnTrainer(
        model=model, args=config(tmp_path), train_dataset=data, processing_class=tokenizer
    ).reward_weights.tolist() == [1.0]


def test_reward_weights_counting_accuracy_is_a_clear_error(tmp_path):
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(
        ValueError,
        match=r"reward_weights has 2 weights for 1 reward functions passed to the trainer"
        r".*accuracy reward's weight is accuracy_weight",
    ):
        RLCRMultiTurnTrainer(
            model=model,
            reward_funcs=[brevity],
            args=config(tmp_path, reward_weights=[1.0, 0.5]),
            processing_class=tokenizer,
        )


def test_accuracy_weight_must_be_finite(tmp_path):
    with pytest.raises(ValueError, match="accuracy_weight must be finite"):
        config(tmp_path, accuracy_weight=float("nan"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"beta": 0.0, "confidence_beta": 0.1}, "needs beta > 0"),
        ({"beta": 0.1, "confidence_beta": -1.0}, "confidence_beta must be finite"),
    ],
)
def test_confidence_beta_is_checked(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        cpu_test_args(tmp_path, RLCRMultiTurnConfig, **overrides)
