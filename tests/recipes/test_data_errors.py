"""Bad data through the recipes' loaders and through the trainers: missing gold answers are never scored as wrong,
empty datasets and malformed files fail with clear errors, plain-text prompts keep the system prompt."""

import functools
import json
import logging
import math
from pathlib import Path

import datasets
import pytest
import torch
from datasets import Dataset

from trl_ext.recipe import RecipeScriptArguments, load_recipe_dataset, run_recipe
from trl_ext.recipe import data as recipe_data
from trl_ext.recipe.replay import ReplayScriptArguments
from trl_ext.recipe.replay import main as replay_main
from trl_ext.rewards import make_accuracy_reward
from trl_ext.rewards.user_calls import UserCallGuard
from trl_ext.self_play import arithmetic_task
from trl_ext.testing import BatchRecorder, ScriptedGeneration, cpu_test_args, tiny_causal_lm, tiny_checkpoint
from trl_ext.trainers import (
    AbsoluteZeroConfig,
    AbsoluteZeroTrainer,
    ReplayGRPOConfig,
    ReplayGRPOTrainer,
    RLCRMultiTurnConfig,
    RLCRMultiTurnTrainer,
)


ROOT = Path(__file__).parents[2]


def conversation(text):
    return [{"role": "user", "content": text}]


# -- recipe loaders ----------------------------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_missing_gold_answers_stay_none_and_are_counted(tmp_path, caplog):
    rows = [
        {"q": "a", "a": None},
        {"q": "b", "a": "2"},
        {"q": "c", "a": "  "},
        {"q": "d", "a": "x #### "},
        {"q": None, "a": "5"},
        {"q": "f", "a": "6"},
    ]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    args = RecipeScriptArguments(
        dataset_path=path, question_column="q", answer_column="a", answer_delimiter="####", num_eval_samples=0
    )
    train, evaluation = load_recipe_dataset(args, "S")
    # never the text 'None' (which a model answering "None" would match), never '' or a blank
    assert train["solution"] == [None, "2", None, None, "6"] and evaluation is None
    assert [p[-1]["content"] for p in train["prompt"]] == ["a", "b", "c", "d", "f"]  # no question: left out
    assert "3 of 5 training rows have no gold answer" in caplog.text
    assert "1 of 6 training rows have no question ('q')" in caplog.text


def test_blank_csv_cells_are_missing_not_text(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("question,answer\na,\nb,seven\nc,nan\n")
    train, _ = load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path), num_eval_samples=0), None)
    assert train["solution"] == [None, "seven", None]


def test_plain_text_prompt_column_keeps_the_system_prompt(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"prompt": "What is 1+1?", "solution": "2"}] * 2)
    train, _ = load_recipe_dataset(RecipeScriptArguments(dataset_path=path, num_eval_samples=0), "Be brief.")
    assert train[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1+1?"},
    ]


def test_malformed_json_names_the_file_and_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": 2\n{"question": "c"}\n')
    with pytest.raises(ValueError, match=r"data\.jsonl: line 3: not valid JSON"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path)), None)
    path.write_text('{"question": "a", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 2: expected a JSON object per line"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path)), None)
    document = tmp_path / "data.json"
    document.write_text('[\n  {"question": "a", "answer": "1"},\n  {"question": "b" "answer": "2"}\n]\n')
    with pytest.raises(ValueError, match=r"data\.json: line 3: not valid JSON"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(document)), None)


def test_unreadable_csv_names_the_file_and_line(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("question,answer\na,1\nb,2,3\n")
    with pytest.raises(
        ValueError,
        match=r"data\.csv: cannot be read as CSV \(ParserError: .*Expected 2 fields in "
        r"line 3, saw 3\)",
    ):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path)), None)
    path.write_bytes(b"question,answer\n\xff\xfe,1\n")
    with pytest.raises(ValueError, match=r"data\.csv: cannot be read as CSV \(UnicodeDecodeError: 'utf-8' codec"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(path)), None)


def test_jsonl_column_whose_type_changes_across_lines(tmp_path, monkeypatch):
    """datasets with the `Json` feature loads it (the gold answer becomes text); one without it refuses the file,
    which then fails naming the file and the column."""
    path = write_jsonl(tmp_path / "data.jsonl", [{"question": "a", "answer": 1}, {"question": "b", "answer": "x"}])
    train, _ = load_recipe_dataset(RecipeScriptArguments(dataset_path=path, num_eval_samples=0), None)
    assert train["solution"] == ["1", "x"]

    monkeypatch.setattr(recipe_data, "load_dataset", functools.partial(datasets.load_dataset, on_mixed_types=None))
    with pytest.raises(
        ValueError,
        match=r"data\.jsonl: cannot be read as JSON \(ArrowInvalid: .*Column\(/answer\) "
        r"changed from number to string",
    ):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=path, num_eval_samples=0), None)


def test_empty_datasets_fail_clearly(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="empty.jsonl: the file is empty"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=str(empty)), None)
    path = write_jsonl(tmp_path / "data.jsonl", [{"question": "a", "answer": "1"}] * 3)
    with pytest.raises(ValueError, match="--num_train_samples must be at least 1"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=path, num_train_samples=0), None)
    with pytest.raises(ValueError, match="--num_train_samples must be at least 1"):
        load_recipe_dataset(RecipeScriptArguments(num_train_samples=0), None)  # the built-in data too
    no_questions = write_jsonl(tmp_path / "none.jsonl", [{"question": None, "answer": "1"}] * 3)
    with pytest.raises(ValueError, match="has no training rows"):
        load_recipe_dataset(RecipeScriptArguments(dataset_path=no_questions), None)


def test_replay_recipe_on_an_empty_file_fails_and_saves_no_model(tmp_path):
    """It used to train on nothing, exit 0 and save the untrained model. Driven in-process, with flags that would
    keep a run short if it were to train anyway."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out"
    argv = [
        "--model_name_or_path",
        tiny_checkpoint(tmp_path / "tiny"),
        "--dataset_path",
        str(empty),
        "--output_dir",
        str(out),
        "--use_cpu",
        "true",
        "--bf16",
        "false",
        "--report_to",
        "none",
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "2",
        "--max_completion_length",
        "4",
        "--save_strategy",
        "no",
    ]
    with pytest.raises(ValueError, match=r"--dataset_path .*empty\.jsonl: the file is empty"):
        run_recipe(
            replay_main,
            ReplayScriptArguments,
            ReplayGRPOConfig,
            ROOT / "recipes/configs/replay_grpo_smollm2_cpu.yaml",
            argv=argv,
        )
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) if out.exists() else []
    assert written == []  # no weights, config, metrics or card


@pytest.mark.parametrize("trainer", ["rlcr", "replay", "absolute_zero"])
def test_trainers_reject_an_empty_dataset(tmp_path, trainer):
    model, tokenizer = tiny_causal_lm()
    empty = Dataset.from_list([{"prompt": conversation("x"), "solution": "1"}]).select([])
    with pytest.raises(ValueError, match="train_dataset is empty"):
        if trainer == "rlcr":
            RLCRMultiTurnTrainer(
                model,
                args=cpu_test_args(tmp_path, RLCRMultiTurnConfig, num_generations_confidence=2),
                train_dataset=empty,
                processing_class=tokenizer,
            )
        elif trainer == "replay":
            ReplayGRPOTrainer(
                model,
                make_accuracy_reward(),
                args=cpu_test_args(tmp_path, ReplayGRPOConfig),
                train_dataset=empty,
                processing_class=tokenizer,
            )
        else:
            task = arithmetic_task()
            AbsoluteZeroTrainer(
                model,
                task.reward_funcs,
                args=cpu_test_args(tmp_path, AbsoluteZeroConfig),
                train_dataset=empty,
                processing_class=tokenizer,
            )


# -- trainers: a row without a gold answer is not applicable ------------------------------------------------------

CONFIDENCE_PROMPT = "How confident are you? Reply <confidence>p</confidence>."
RLCR_ANSWERS = {
    "2+3": ["<answer>5</answer>", "<answer>6</answer>"],
    "7*6": ["<answer>42</answer>", "<answer>None</answer>"],
}
RLCR_CONFIDENCES = {
    "<answer>5</answer>": ["<confidence>0.9</confidence>", "<confidence>0.6</confidence>"],
    "<answer>6</answer>": ["<confidence>0.8</confidence>", "<confidence>abc</confidence>"],
    "<answer>42</answer>": ["<confidence>1</confidence>", "<confidence>0.5</confidence>"],
    "<answer>None</answer>": ["<confidence>1</confidence>", "<confidence>0</confidence>"],
}


def rlcr_script(prompt_text, k):
    if CONFIDENCE_PROMPT in prompt_text:
        return next(replies[k] for answer, replies in RLCR_CONFIDENCES.items() if answer in prompt_text)
    return RLCR_ANSWERS["2+3" if "2+3" in prompt_text else "7*6"][k]


@pytest.mark.parametrize("normalization", ["answer", "answer_then_prompt"])
def test_rlcr_question_without_gold_trains_nothing_and_scores_nothing(tmp_path, normalization):
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [
            {"prompt": conversation("What is 2+3?"), "solution": "5"},
            {"prompt": conversation("What is 7*6?"), "solution": None},
        ]
    )
    args = cpu_test_args(
        tmp_path,
        RLCRMultiTurnConfig,
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        num_generations_confidence=2,
        confidence_prompt=CONFIDENCE_PROMPT,
        shuffle_dataset=False,
        max_completion_length=16,
        max_confidence_length=16,
        confidence_normalization=normalization,
    )
    trainer = RLCRMultiTurnTrainer(model, args=args, train_dataset=dataset, processing_class=tokenizer)
    with ScriptedGeneration(trainer, rlcr_script), BatchRecorder(trainer) as rec:
        trainer.train()
    batch, log = rec.batches[0], trainer.state.log_history[0]

    a = 0.5 / (0.5**0.5 + 1e-4)
    # Answers to 7*6 (no gold) are neither right nor wrong, and their confidences, even "1" on "None", get no Brier
    # reward: all at advantage 0. Confidences of 2+3: Brier .99/.84 (answer right), .36/0 (answer wrong), mean-centred.
    confidence = torch.tensor([0.075, -0.075, 0.18, -0.18])
    if normalization == "answer_then_prompt":
        confidence = confidence / (confidence.std() + 1e-4)
    expected = torch.cat([torch.tensor([a, -a, 0.0, 0.0]), confidence, torch.zeros(4)])
    torch.testing.assert_close(batch["advantages"], expected, rtol=0, atol=1e-5)
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            assert torch.isfinite(value).all(), key
    assert log["accuracy/missing_gold_rate"] == 0.5
    assert log["answer/accuracy"] == 0.5  # 1 of the 2 judged answers
    assert log["confidence/brier_reward_mean"] == pytest.approx((0.99 + 0.84 + 0.36 + 0.0) / 4)
    assert log["calibration/brier"] == pytest.approx((0.01 + 0.16 + 0.64) / 3)  # (.9, 1) (.6, 1) (.8, 0)
    assert math.isfinite(log["loss"])


def test_replay_task_without_gold_is_neither_solved_nor_failed(tmp_path):
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [{"prompt": conversation("Task A"), "solution": None}, {"prompt": conversation("Task E"), "solution": "11"}]
    )
    args = cpu_test_args(
        tmp_path,
        ReplayGRPOConfig,
        max_steps=2,
        replay_start_ratio=0.0,
        shuffle_dataset=False,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
    )
    trainer = ReplayGRPOTrainer(
        model, make_accuracy_reward(), args=args, train_dataset=dataset, processing_class=tokenizer
    )

    def script(prompt_text, k):
        return "<answer>11</answer>" if k % 2 == 0 else "<answer>None</answer>"

    with ScriptedGeneration(trainer, script), BatchRecorder(trainer) as rec:
        trainer.train()
    first = trainer.state.log_history[0]
    assert first["replay/solve_rate"] == 0.5  # E: 2 of 4; A's rows are not judged
    assert first["accuracy/missing_gold_rate"] == 0.5
    tasks = {trainer.experience.task_examples[t]["prompt"][0]["content"] for t in trainer.experience.task2trajectories}
    assert tasks == {"Task E"}
    # A is in no bucket and not retired (0 successes of 0 judged rollouts is not "solved every time").
    assert len(trainer.experience.task2bucket) == 1 and not trainer.experience.retired
    for batch in rec.batches:
        assert torch.isfinite(batch["advantages"]).all()
        assert batch["advantages"][:4].abs().sum() == 0  # A's group: no signal


# -- user code that raises, templates that name missing fields -------------------------------------------------------

AZR_ANSWERS = {"1+1": ["<answer>2</answer>", "<answer>3</answer>"], "3*3": ["<answer>9</answer>", "no idea"]}


def azr_script(proposals):
    def script(text, k):
        if "Seed" in text:
            return proposals[k]
        question = next((q for q in AZR_ANSWERS if q in text), None)
        return "no idea" if question is None else AZR_ANSWERS[question][k]

    return script


def azr_trainer(tmp_path, max_steps=1, **kwargs):
    task = arithmetic_task()
    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list([{"prompt": conversation(f"Seed {c}")} for c in "AB"])
    overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in ("solver_prompt_template",)}
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        max_steps=max_steps,
        per_device_train_batch_size=4,
        num_generations=2,
        num_questions_per_prompt=2,
        shuffle_dataset=False,
        max_completion_length=16,
        max_question_length=16,
        max_repropose_attempts=0,
        **overrides,
    )
    kwargs.setdefault("parse_question", task.parse_question)
    kwargs.setdefault("solver_prompt_fn", task.solver_prompt_fn)
    return AbsoluteZeroTrainer(
        model, task.reward_funcs, args=args, train_dataset=dataset, processing_class=tokenizer, **kwargs
    )


def test_parse_question_that_raises_is_logged_once_counted_and_invalid(tmp_path, caplog):
    parse = arithmetic_task().parse_question

    def fragile(text):
        if "3*3" in text:
            raise KeyError("boom")
        return parse(text)

    trainer = azr_trainer(tmp_path, max_steps=2, parse_question=fragile)
    with (
        caplog.at_level(logging.ERROR, logger="trl_ext.rewards.user_calls"),
        ScriptedGeneration(trainer, azr_script(["<question>1+1</question>", "<question>3*3</question>"])),
    ):
        trainer.train()
    logs = [log for log in trainer.state.log_history if "proposer/invalid_rate" in log]
    assert [log["errors/parse_question"] for log in logs] == [2.0, 2.0]  # one per seed prompt, each step
    assert [log["proposer/invalid_rate"] for log in logs] == [0.5, 0.5]
    raised = [
        r
        for r in caplog.records
        if r.getMessage().startswith(f"parse_question ({fragile.__module__}.{fragile.__qualname__}) raised")
    ]
    assert len(raised) == 1 and "KeyError: 'boom'" in caplog.text


def test_user_callables_are_logged_by_their_own_name(caplog):
    class Parser:
        def __call__(self, text):
            raise KeyError(text)

    def parse(text, strict):
        raise KeyError(text)

    for func, name in [(Parser(), Parser.__qualname__), (functools.partial(parse, strict=True), parse.__qualname__)]:
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="trl_ext.rewards.user_calls"):
            assert UserCallGuard("parse_question", "the proposal counts as invalid")(func, "1+") == (None, False)
        assert caplog.messages[0].startswith(f"parse_question ({__name__}.{name}) raised: the proposal counts as")


def test_solver_prompt_fn_that_raises_makes_the_question_invalid(tmp_path, caplog):
    prompt = arithmetic_task().solver_prompt_fn

    def fragile(question, row):
        if "3*3" in question["question"]:
            raise ValueError("bad template")
        return prompt(question, row)

    trainer = azr_trainer(tmp_path, solver_prompt_fn=fragile)
    with (
        caplog.at_level(logging.ERROR, logger="trl_ext.rewards.user_calls"),
        ScriptedGeneration(trainer, azr_script(["<question>1+1</question>", "<question>3*3</question>"])) as gen,
    ):
        trainer.train()
    log = trainer.state.log_history[0]
    assert log["errors/solver_prompt_fn"] == 2.0 and log["proposer/invalid_rate"] == 0.5
    assert len(gen.calls[1].prompt_ids) == 4  # only 1+1 (one per seed) is solved, twice
    assert f"solver_prompt_fn ({fragile.__module__}.{fragile.__qualname__}) raised" in caplog.text
    assert "ValueError: bad template" in caplog.text


def test_template_field_the_question_lacks_warns_once_and_is_counted(tmp_path, caplog):
    from trl_ext.self_play.base import tagged_question_parser

    trainer = azr_trainer(
        tmp_path,
        max_steps=2,
        solver_prompt_template="Solve: {qestion}",
        parse_question=tagged_question_parser(),
        solver_prompt_fn=None,
    )
    with (
        caplog.at_level(logging.WARNING, logger="trl_ext.trainers.absolute_zero_trainer"),
        ScriptedGeneration(trainer, azr_script(["<question>1+1</question>", "<question>3*3</question>"])) as gen,
    ):
        trainer.train()
    logs = [log for log in trainer.state.log_history if "proposer/invalid_rate" in log]
    assert [log["warnings/solver_prompt_missing_fields"] for log in logs] == [4.0, 4.0]  # every valid question
    warnings = [r.getMessage() for r in caplog.records if "solver_prompt_template names {qestion}" in r.getMessage()]
    assert len(warnings) == 1 and "['question']" in warnings[0]
    assert "Solve: <|im_end|>" in trainer.processing_class.decode(gen.calls[1].prompt_ids[0])  # rendered empty


def test_template_field_the_parser_never_produces_fails_at_init(tmp_path):
    with pytest.raises(ValueError, match=r"solver_prompt_template names \['qestion'\].*parse_question never"):
        azr_trainer(tmp_path, solver_prompt_template="{qestion}", solver_prompt_fn=None)
    azr_trainer(tmp_path, solver_prompt_template="Compute {expression}.", solver_prompt_fn=None)  # a real field


def test_template_fields():
    from trl_ext.self_play.base import template_fields

    assert template_fields("{question} ({hint.text}) {items[0]} {{literal}}") == {"question", "hint", "items"}
    with pytest.raises(ValueError, match="not a valid format string"):
        template_fields("{question")
    with pytest.raises(ValueError, match="positional field"):
        template_fields("{} {question}")


def test_rlcr_evaluation_skips_rows_without_gold(tmp_path):
    from trl_ext.evaluation.rlcr import evaluate_calibration

    model, tokenizer = tiny_causal_lm()
    dataset = Dataset.from_list(
        [{"prompt": conversation(q), "solution": s} for q, s in [("1+1?", "2"), ("2+2?", None), ("3+3?", "  ")]]
    )
    args = cpu_test_args(
        tmp_path, RLCRMultiTurnConfig, num_generations_confidence=2, max_completion_length=4, max_confidence_length=4
    )
    result = evaluate_calibration(model, tokenizer, dataset, args, progress=False)
    assert result.num_missing_gold == 2 and [row["gold"] for row in result.rows] == ["2"]
    assert result.to_dict()["num_missing_gold"] == 2
