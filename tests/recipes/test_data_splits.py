"""Held-out questions unseen by construction: the normalisation that decides when two questions are one, the built-in
data's three disjoint splits, every shipped config's report set against its training, warm-up and tune sets, and a
user file's deduplication before its held-out rows are split off."""

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from datasets import Dataset

from trl_ext.data import graded_arithmetic
from trl_ext.data.graded_arithmetic import LEVELS, SPLITS, normalise_question, question_split
from trl_ext.recipe.data import datasets_for, deduplicated_heldout_split, load_recipe_dataset
from trl_ext.recipe.rlcr import RLCRScriptArguments


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "recipes" / "configs").glob("*.yaml"))


@pytest.mark.parametrize(
    "a, b",
    [
        ("What is 4 + 3?", "what is 3+4?"),  # operand order, case, whitespace
        ("What is  12 *\t5 - 100?", "What is 5 * 12 - 100?"),  # the product's factors, the difference kept
        ("What is 7 - 2 + 10?", "What is 10 + 7 - 2?"),  # the signed terms of a sum
        ("What is 2 * 3 * 4?", "What is 4*2*3?"),
    ],
)
def test_normalisation_equates_the_same_question(a, b):
    assert normalise_question(a) == normalise_question(b)


@pytest.mark.parametrize(
    "a, b",
    [
        ("What is 10 - 3?", "What is 3 - 10?"),  # subtraction does not commute
        ("What is 6 / 3 + 1?", "What is 1 + 6 / 3?"),  # `/` binds to the 3: left alone, not reordered
        ("What is 4 + 3 * x?", "What is 3 + 4 * x?"),  # `*` binds to the 3: left alone
        ("What is 13 + 4?", "What is 3 + 14?"),  # numbers are never split
        ("What is 2 * (3 + 4)?", "What is 3 * (2 + 4)?"),
    ],
)
def test_normalisation_keeps_different_questions_apart(a, b):
    assert normalise_question(a) != normalise_question(b)


def test_normalised_forms():
    assert normalise_question(" What is 9 + 1 ? ") == "what is 1+9?"
    assert normalise_question("What is 712 * 35 - 180?") == "what is 35*712-180?"
    assert normalise_question("What is 1.5 + 0.25.") == "what is 0.25+1.5."  # a full stop ends the sentence


def test_splits_are_disjoint_deterministic_and_graded():
    sets = {split: graded_arithmetic(300, seed=1, split=split) for split in SPLITS}
    keys = {split: {normalise_question(q) for q in data["question"]} for split, data in sets.items()}
    for split, data in sets.items():
        assert all(question_split(q) == split for q in data["question"])
        assert len(keys[split]) == 300  # distinct while the level's share of the split lasts
        assert data["level"][:LEVELS] == list(range(1, LEVELS + 1))
        for row in data:
            expression = row["question"].removeprefix("What is ").removesuffix("?")
            assert str(eval(expression)) == row["solution"]  # test-only check of the generator's arithmetic
    assert (
        not keys["train"] & keys["tune"] and not keys["train"] & keys["report"] and not keys["tune"] & keys["report"]
    )
    again = graded_arithmetic(300, seed=1, split="report")
    assert again.to_list() == sets["report"].to_list()
    assert again.to_list() != graded_arithmetic(300, seed=2, split="report").to_list()
    with pytest.raises(ValueError, match="split must be one of"):
        graded_arithmetic(5, split="test")


def test_a_split_past_its_share_of_a_level_repeats_its_own_questions():
    data = graded_arithmetic(5 * 200, seed=0, split="report")  # level 1's report share has about 120 questions
    level_1 = [q for q, level in zip(data["question"], data["level"]) if level == 1]
    assert len({normalise_question(q) for q in level_1}) < 200
    assert all(question_split(q) == "report" for q in level_1)


def _builtin_sets(config_path: Path) -> dict[str, set[str]] | None:
    """The normalised questions of a shipped config's training, warm-up, tune and report sets (as its recipe and
    the ablations build them), or None when the config brings its own dataset or the recipe has no built-in one."""
    config = yaml.safe_load(config_path.read_text())
    if config.get("dataset_name") or config.get("dataset_path") or not config_path.name.startswith(("rlcr", "replay")):
        return None
    keys = ("num_train_samples", "num_eval_samples", "system_prompt", "train_levels")
    fields = {k: config[k] for k in keys if k in config}
    settings = SimpleNamespace(seed=config.get("seed", 42))
    train, report = datasets_for(RLCRScriptArguments(**fields, eval_split="report"), settings)
    _, tune = datasets_for(RLCRScriptArguments(**fields, eval_split="tune"), settings)
    warmup = train.select(range(min(config.get("warmup_samples", 0), len(train))))
    return {
        name: {normalise_question(q) for q in data["question"]}
        for name, data in (("train", train), ("warmup", warmup), ("tune", tune), ("report", report))
    }


@pytest.mark.parametrize("config", CONFIGS, ids=[path.stem for path in CONFIGS])
def test_every_shipped_config_reports_on_questions_it_never_trained_or_tuned_on(config):
    sets = _builtin_sets(config)
    if sets is None:
        pytest.skip(f"{config.name} does not use the built-in data")
    assert sets["report"] and sets["train"]
    for other in ("train", "warmup", "tune"):
        assert not sets["report"] & sets[other], f"{config.name}: report questions in the {other} set"
    assert not sets["tune"] & sets["train"]


def test_the_shipped_rlcr_default_reports_on_40_questions_per_level():
    config = yaml.safe_load((CONFIGS[0].parent / "rlcr_smollm2_cpu.yaml").read_text())
    _, report = datasets_for(
        RLCRScriptArguments(num_eval_samples=config["num_eval_samples"], eval_split=config["eval_split"]),
        SimpleNamespace(seed=config["seed"]),
    )
    assert config["eval_split"] == "report" and [report["level"].count(level) for level in range(1, 6)] == [40] * 5


def test_train_levels_choose_the_training_levels_and_leave_the_heldout_set_whole(tmp_path):
    settings = SimpleNamespace(seed=3)
    train, report = datasets_for(RLCRScriptArguments(num_train_samples=40, train_levels=[2, 4]), settings)
    whole, same_report = datasets_for(RLCRScriptArguments(num_train_samples=40), settings)
    assert train["level"] == [2, 4] * 20 and all(question_split(q) == "train" for q in train["question"])
    assert report.to_list() == same_report.to_list() and set(report["level"]) == set(range(1, LEVELS + 1))
    # the default draws the same rows as naming every level
    assert whole.to_list() == graded_arithmetic(40, seed=3, levels=[1, 2, 3, 4, 5]).to_list()
    with pytest.raises(ValueError, match="levels must be distinct values in 1..5"):
        graded_arithmetic(5, levels=[0, 2])
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f'{{"question": "q{i}", "answer": "{i}"}}\n' for i in range(10)))
    with pytest.raises(ValueError, match="--train_levels 2 selects levels of the built-in data"):
        datasets_for(RLCRScriptArguments(dataset_path=str(path), train_levels=[2]), settings)


def test_eval_split_is_checked():
    with pytest.raises(ValueError, match="--eval_split must be 'report' or 'tune'"):
        datasets_for(RLCRScriptArguments(num_train_samples=5, eval_split="train"), SimpleNamespace(seed=0))


def test_a_users_file_is_deduplicated_before_its_heldout_rows_are_split_off(tmp_path, caplog):
    questions = [f"What is {i} + 1?" for i in range(20)]
    questions[3] = "what is 1+0 ?"  # row 0 again
    questions[18] = "What is 1 + 5?"  # row 5 again, among the last rows
    path = tmp_path / "data.jsonl"
    Dataset.from_list([{"question": q, "answer": "x"} for q in questions]).to_json(path)
    with caplog.at_level(logging.INFO, logger="trl_ext.recipe.data"):
        train, evaluation = load_recipe_dataset(RLCRScriptArguments(dataset_path=str(path), num_eval_samples=5), None)
    held = [p[-1]["content"] for p in evaluation["prompt"]]
    seen = [p[-1]["content"] for p in train["prompt"]]
    assert held == [questions[i] for i in (16, 17, 19)]  # the last of the 18 distinct rows, a fifth at most
    assert seen == [q for i, q in enumerate(questions[:16]) if i != 3]
    assert "2 repeating an earlier training question and 0 asking a held-out one" in caplog.text
    assert "the last 3 distinct rows of split 'train'" in caplog.text


def test_training_rows_asking_a_test_splits_question_are_dropped(caplog):
    train = Dataset.from_list([{"question": q} for q in ["What is 2 + 3?", "What is 4 + 4?", "What is 3+2?"]])
    test = Dataset.from_list([{"question": q} for q in ["what is 3 + 2?", "What is 3 + 2 ?", "What is 9 + 9?"]])
    args = RLCRScriptArguments(dataset_test_split="test", num_eval_samples=5)
    with caplog.at_level(logging.INFO, logger="trl_ext.recipe.data"):
        kept, evaluation = deduplicated_heldout_split(train, test, args)
    assert kept["question"] == ["What is 4 + 4?"] and evaluation["question"] == ["what is 3 + 2?", "What is 9 + 9?"]
    assert "1 repeating an earlier training question and 1 asking a held-out one" in caplog.text
