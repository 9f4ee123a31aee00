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
        ([{"prompt": "plain text", "solution": "1"}], "conversational"),
        ([{"question": "q", "solution": "1"}], "'prompt'"),
    ],
)
def test_dataset_problems_fail_at_init(tmp_path, rows, match):
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(ValueError, match=match):
        RLCRMultiTurnTrainer(model=model, args=config(tmp_path), train_dataset=Dataset.from_list(rows * 4),
                             processing_class=tokenizer)


def test_unsupported_trainer_arguments(tmp_path):
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(ValueError, match="tools"):
        RLCRMultiTurnTrainer(model=model, args=config(tmp_path), processing_class=tokenizer, tools=[print])
    with pytest.raises(TypeError, match="RLCRMultiTurnConfig"):
        from trl import GRPOConfig

        RLCRMultiTurnTrainer(model=model, args=cpu_test_args(tmp_path, GRPOConfig), processing_class=tokenizer)
