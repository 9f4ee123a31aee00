"""The answer-probability warm-up: the chance read off the probability of the model's own answer, the confidence-turn
examples stating it, their cached build, and the recipe's two stages."""

import pytest

from trl_ext.core.turns import follow_up_turn
from trl_ext.evaluation.greedy import completion_probabilities, greedy_completions
from trl_ext.models import probability_warmup, warmup
from trl_ext.models.agreement_warmup import share_distribution
from trl_ext.models.cache import COMPLETE_MARKER
from trl_ext.models.probability_warmup import calibrated_tenths, probability_confidence_examples, probability_examples
from trl_ext.rewards import extract_answer


CONF = "How sure are you?"


def test_the_chance_keeps_the_order_of_the_probabilities_and_is_stated_in_tenths():
    probabilities = [0.05, 0.1, 0.2, 0.3, 0.5, 0.6, 0.8, 0.9, 0.95, 0.99]
    correct = [0, 0, 0, 1, 0, 0, 1, 1, 0, 1]
    stated, info = calibrated_tenths(probabilities, correct)
    assert info["fitted"] and info["slope"] > 0
    assert stated == sorted(stated) and stated[0] < 0.4 < 0.5 < stated[-1]
    assert all(round(s, 1) == s and 0 <= s <= 1 for s in stated)
    # shuffled rows get the same chance each: it is a function of the probability
    order = [3, 9, 0, 5, 1, 8, 2, 7, 4, 6]
    again, _ = calibrated_tenths([probabilities[i] for i in order], [correct[i] for i in order])
    assert again == [stated[i] for i in order]
    # nothing to fit: every row states the rows' accuracy
    assert calibrated_tenths([0.2, 0.9], [0, 0]) == ([0.0, 0.0], {"fitted": False, "accuracy": 0.0})
    assert calibrated_tenths([0.2, 0.9, 1.0], [1, 1, 1])[0] == [1.0, 1.0, 1.0]
    assert calibrated_tenths([], []) == ([], {"fitted": False})


def test_each_row_states_its_chance_after_its_own_answer():
    prompts = [[{"role": "system", "content": "S"}, {"role": "user", "content": "What is 1 + 2?"}]]
    examples = probability_confidence_examples(prompts, ["<answer>4</answer>"], [0.3], CONF)
    assert examples == [
        {
            "prompt": [
                {"role": "system", "content": "S"},
                {"role": "user", "content": "What is 1 + 2?"},
                {"role": "assistant", "content": "<answer>4</answer>"},
                {"role": "user", "content": CONF},
            ],
            "completion": [{"role": "assistant", "content": "<confidence>0.3</confidence>"}],
        }
    ]
    assert probability_confidence_examples(prompts, ["a"], [1.0], CONF)[0]["completion"][0]["content"] == (
        "<confidence>1</confidence>"
    )
    with pytest.raises(ValueError, match="1 prompts, 2 answers and 1 stated"):
        probability_confidence_examples(prompts, ["a", "b"], [0.1], CONF)


def _in_process(builds):
    def run(module, spec, spec_file, out, failure):  # the child's work, here (a child adds only an interpreter start)
        assert module == "trl_ext.models.probability_warmup"
        builds.append(spec)
        probability_warmup._build(spec, out)

    return run


def _greedy(model, tokenizer, prompts, n):
    turn = follow_up_turn(tokenizer, CONF, [tokenizer.eos_token_id])
    ids = turn.first_turn_ids(tokenizer, prompts)
    answers = greedy_completions(model, tokenizer, ids, n)
    texts = [tokenizer.decode(a, skip_special_tokens=True).strip() for a in answers]
    return texts, completion_probabilities(model, tokenizer, ids, answers)


def test_the_examples_state_the_chance_of_the_greedy_answers_and_are_built_once(
    tmp_path, monkeypatch, digit_checkpoint
):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stage1 = digit_checkpoint("stage1")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(stage1).eval(), AutoTokenizer.from_pretrained(stage1)
    prompts = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(6)]
    texts, probabilities = _greedy(model, tokenizer, prompts, 3)
    # rows 0, 2 and 5 are right (their gold is the model's own answer), the others wrong
    golds = [extract_answer(t, "answer", True) if i in (0, 2, 5) else "-1" for i, t in enumerate(texts)]
    rows = [{"prompt": p, "solution": g} for p, g in zip(prompts, golds)]
    builds = []
    monkeypatch.setattr(warmup, "run_module_in_child", _in_process(builds))
    kwargs = {"max_new_tokens": 3, "lenient": True, "use_cpu": True, "cache_dir": tmp_path / "cache"}
    built = probability_examples(stage1, rows, CONF, **kwargs)

    stated, calibration = calibrated_tenths(probabilities, [1, 0, 1, 0, 0, 1])
    assert built["examples"] == probability_confidence_examples(prompts, texts, stated, CONF)
    stats = built["stats"]
    assert stats["rows"] == 6 and stats["accuracy"] == 0.5 and stats["calibration"] == pytest.approx(calibration)
    assert stats["shares"] == share_distribution(built["examples"])
    assert len(list((tmp_path / "cache").glob(f"*/{COMPLETE_MARKER}"))) == 1
    # The same inputs: the cached examples; another gold answer is another build.
    assert probability_examples(stage1, rows, CONF, **kwargs) == built and len(builds) == 1
    rows[1] = {**rows[1], "solution": golds[0]}
    probability_examples(stage1, rows, CONF, **kwargs)
    assert len(builds) == 2


def test_the_recipe_states_the_chance_of_the_rl_rows_answers_in_a_second_stage(monkeypatch, recipe_warmup):
    """`--warmup_confidences answer_probability`: stage 1 is the "weighted" warm-up (the same cached build), stage 2
    fine-tunes it on confidence turns after its own answers to the RL rows (whose gold it never saw) beside stage 1's
    answer turns (gold) again, and RL starts from stage 2."""
    from trl_ext.recipe.rlcr import RLCRScriptArguments, warm_up

    builds = []
    monkeypatch.setattr(warmup, "run_module_in_child", _in_process(builds))
    trained, base, training_args = recipe_warmup.trained, recipe_warmup.base, recipe_warmup.training_args
    train = recipe_warmup.rows(7)
    weighted = warm_up(base, train, RLCRScriptArguments(warmup_samples=3), training_args)[0]
    args = RLCRScriptArguments(warmup_samples=3, warmup_confidences="answer_probability")
    path, rest, report = warm_up(base, train, args, training_args)
    assert len(trained) == 2 and trained[1][0] == weighted  # the weighted build reused as stage 1, then stage 2
    assert report["answer_probability"]["model"] == path == report["model"] != weighted
    assert len(rest) == 4 and report["answer_probability"]["rows"] == 4
    # the stage answered the four RL rows, not the three warm-up rows
    assert [p[-1]["content"] for p in builds[0]["prompts"]] == [f"What is {i} + {i}?" for i in range(3, 7)]
    stage2 = trained[1][1]
    balanced = report["answer_probability"]["balanced_shares"]
    assert stage2[:3] == trained[0][1][::2] and len(stage2) == 3 + sum(balanced.values())
    assert share_distribution(stage2[3:]) == balanced
    assert {e["prompt"][0]["content"] for e in stage2[3:]} <= {f"What is {i} + {i}?" for i in range(3, 7)}
    # A second run: nothing answered or trained again.
    assert warm_up(base, train, args, training_args)[0] == path and len(trained) == 2 and len(builds) == 1


def test_the_second_stage_trains_its_answer_turns_about_as_often_as_its_confidence_turns(monkeypatch, recipe_warmup):
    """More RL rows than warm-up rows: stage 1's answer turns are repeated to about as many as the stage's confidence
    turns, so the confidence examples do not outweigh the answers (the embedded default: 800 against 200)."""
    from trl_ext.recipe.rlcr import RLCRScriptArguments, warm_up

    monkeypatch.setattr(warmup, "run_module_in_child", _in_process([]))
    trained, base, training_args = recipe_warmup.trained, recipe_warmup.base, recipe_warmup.training_args
    args = RLCRScriptArguments(warmup_samples=2, warmup_confidences="answer_probability")
    report = warm_up(base, recipe_warmup.rows(10), args, training_args)[2]["answer_probability"]
    answer_turns, stage2 = trained[0][1][::2], trained[1][1]
    confidences = sum(report["balanced_shares"].values())
    repeats = report["answer_turn_repeats"]
    assert len(answer_turns) == 2 and repeats == round(confidences / 2) >= 3
    assert stage2[: 2 * repeats] == answer_turns * repeats and len(stage2) == 2 * repeats + confidences


def test_rl_rows_without_gold_are_left_out_and_none_is_a_clear_error(monkeypatch, recipe_warmup):
    from trl_ext.recipe import rlcr
    from trl_ext.recipe.rlcr import RLCRScriptArguments

    seen = []
    monkeypatch.setattr(
        rlcr, "probability_examples", lambda stage1, rows, *a, **k: seen.append(rows) or {"examples": [], "stats": {}}
    )
    monkeypatch.setattr(rlcr, "second_stage", lambda *args: {})
    args, training_args = RLCRScriptArguments(warmup_confidences="answer_probability"), recipe_warmup.training_args
    rows = [{"prompt": [], "solution": "4"}, {"prompt": [], "solution": None}, {"prompt": [], "solution": " "}]
    rlcr.probability_stage("stage1", rows, [], args, training_args)
    assert seen == [rows[:1]]
    with pytest.raises(ValueError, match="none of the 2 RL rows has a gold answer in 'solution'"):
        rlcr.probability_stage("stage1", rows[1:], [], args, training_args)
