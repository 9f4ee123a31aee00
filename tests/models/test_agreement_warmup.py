"""The agreement warm-up: confidence-turn examples stating the share of sampled answers, and their cached build."""

import pytest

from trl_ext.models import agreement_warmup, warmup
from trl_ext.models.agreement_warmup import (
    agreement_confidence_examples,
    agreement_examples,
    balanced_by_share,
    share_distribution,
    tenths,
)
from trl_ext.models.cache import COMPLETE_MARKER


CONF = "How sure are you?"
ROWS = [
    {"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 1 + 2?"}]},
    {"prompt": [{"role": "user", "content": "What is 4 * 5?"}]},
]


def _stated(example):
    text = example["completion"][0]["content"]
    assert text.startswith("<confidence>") and text.endswith("</confidence>")
    return text[len("<confidence>") : -len("</confidence>")]


def _answer(example):
    return example["prompt"][-2]["content"]


def test_tenths_round_halves_up():
    # k = 8: 1/8 = 0.125, 2/8 = 0.25, 3/8 = 0.375, 5/8 = 0.625, 6/8 = 0.75, 7/8 = 0.875
    assert [tenths(c, 8) for c in range(9)] == [0.0, 0.1, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9, 1.0]
    assert tenths(1, 3) == 0.3 and tenths(2, 3) == 0.7 and tenths(1, 30) == 0.0 and tenths(1, 20) == 0.1


def test_each_distinct_answer_states_its_share_of_all_samples():
    # Row 0: "3" x5 (" 3 " and "3.0" normalise to "3"), "4" x2, one unparsable: shares 5/8 -> 0.6, 2/8 -> 0.3.
    # Row 1: every sample "20": 1.0.
    samples = [["3", "4", " 3 ", None, "3.0", "4", "3", "3"], ["20"] * 8]
    examples = agreement_confidence_examples(ROWS, samples, CONF, max_answers_per_row=2)
    assert examples == [
        {
            "prompt": [
                *ROWS[0]["prompt"],
                {"role": "assistant", "content": "<answer>3</answer>"},
                {"role": "user", "content": CONF},
            ],
            "completion": [{"role": "assistant", "content": "<confidence>0.6</confidence>"}],
        },
        {
            "prompt": [
                *ROWS[0]["prompt"],
                {"role": "assistant", "content": "<answer>4</answer>"},
                {"role": "user", "content": CONF},
            ],
            "completion": [{"role": "assistant", "content": "<confidence>0.3</confidence>"}],
        },
        {
            "prompt": [
                *ROWS[1]["prompt"],
                {"role": "assistant", "content": "<answer>20</answer>"},
                {"role": "user", "content": CONF},
            ],
            "completion": [{"role": "assistant", "content": "<confidence>1</confidence>"}],
        },
    ]
    assert share_distribution(examples) == {"0.3": 1, "0.6": 1, "1": 1}


def test_unparsable_samples_count_but_give_no_example():
    examples = agreement_confidence_examples(
        ROWS, [[None, None, None, "7"], [None, "", None, None]], CONF, answer_tag="a", confidence_tag="c"
    )
    # "7" is 1 of 4 samples: 0.25 -> 0.3; row 1 parsed nothing ("" is no answer).
    assert [(_answer(e), e["completion"][0]["content"]) for e in examples] == [("<a>7</a>", "<c>0.3</c>")]


def test_the_per_row_cap_draws_answers_uniformly_and_deterministically():
    # 5 distinct answers: "1" x4 (share 0.4 of 10), the others x1 or x2 (0.1, 0.2).
    samples = [["1", "1", "1", "1", "2", "2", "3", "4", "5", "5"]]
    rows = ROWS[:1]
    first = agreement_confidence_examples(rows, samples, CONF, seed=0, max_answers_per_row=2)
    assert len(first) == 2 and len({_answer(e) for e in first}) == 2
    assert agreement_confidence_examples(rows, samples, CONF, seed=0, max_answers_per_row=2) == first
    # Over seeds, every answer is kept about equally often (2/5 of the time), the most common one no more.
    kept = [
        _answer(e)
        for seed in range(500)
        for e in agreement_confidence_examples(rows, samples, CONF, seed=seed, max_answers_per_row=2)
    ]
    counts = {a: kept.count(f"<answer>{a}</answer>") for a in "12345"}
    assert all(150 < c < 250 for c in counts.values()), counts  # 200 expected each
    # Each kept answer states its own share, whatever else was kept.
    shares = {"1": "0.4", "2": "0.2", "3": "0.1", "4": "0.1", "5": "0.2"}
    assert all(_stated(e) == shares[_answer(e)[len("<answer>") : -len("</answer>")]] for e in first)
    everything = agreement_confidence_examples(rows, samples, CONF, max_answers_per_row=5)
    assert [_answer(e) for e in everything] == [f"<answer>{a}</answer>" for a in "12345"]  # first-seen order
    with pytest.raises(ValueError, match="max_answers_per_row"):
        agreement_confidence_examples(rows, samples, CONF, max_answers_per_row=0)
    with pytest.raises(ValueError, match="2 rows but 1"):
        agreement_confidence_examples(ROWS, samples, CONF)


def test_balancing_gives_every_stated_value_as_many_examples():
    def example(i, value):
        return {
            "prompt": [{"role": "user", "content": f"q{i}"}],
            "completion": [{"role": "assistant", "content": f"<confidence>{value}</confidence>"}],
        }

    # 8 examples, 3 values: round(8 / 3) = 3 each; 0.1 has 5 (3 drawn, none twice), 0.5 has 2 (both, one of them
    # again), 1 has 1 (three times).
    examples = [example(i, 0.1) for i in range(5)] + [example(5, 0.5), example(6, 0.5), example(7, 1)]
    balanced = balanced_by_share(examples, seed=0)
    assert share_distribution(balanced) == {"0.1": 3, "0.5": 3, "1": 3}
    prompts = [e["prompt"][0]["content"] for e in balanced]
    assert len(set(prompts[:3])) == 3 and set(prompts[:3]) <= {"q0", "q1", "q2", "q3", "q4"}
    assert sorted(prompts[3:6]) in (["q5", "q5", "q6"], ["q5", "q6", "q6"]) and prompts[6:] == ["q7"] * 3
    assert balanced == balanced_by_share(examples, seed=0)
    assert any(balanced_by_share(examples, seed=s)[:3] != balanced[:3] for s in range(1, 6))
    assert balanced_by_share([], seed=0) == []


def test_sampled_examples_are_built_once_and_reused(tmp_path, monkeypatch, digit_checkpoint):
    """End to end on a tiny random model: the samples parsed, the examples built from them and cached; a second call
    samples nothing."""
    stage1 = digit_checkpoint("stage1")
    builds = []

    def in_process(module, spec, spec_file, out, failure):  # the child's work, here (a child adds only a start)
        assert module == "trl_ext.models.agreement_warmup"
        builds.append(spec)
        agreement_warmup._build(spec, out)

    monkeypatch.setattr(warmup, "run_module_in_child", in_process)
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(3)]
    kwargs = {"seed": 5, "max_new_tokens": 3, "lenient": True, "use_cpu": True, "cache_dir": tmp_path / "cache"}
    built = agreement_examples(stage1, rows, 4, CONF, **kwargs)
    answers = built["answers"]
    assert len(answers) == 3 and all(len(a) == 4 for a in answers)
    assert any(a is not None for row in answers for a in row)
    assert built["examples"] == agreement_confidence_examples(rows, answers, CONF, seed=5)
    stats = built["stats"]
    assert stats["rows_sampled"] == 3 and stats["samples_per_row"] == 4
    # this checkpoint's seeded samples: rows 0 and 1 give one answer 4 times of 4, row 2 two answers twice each
    assert stats["examples"] == len(built["examples"]) == 4
    assert stats["unparsable_samples"] == 0
    assert stats["shares"] == {"0.5": 2, "1": 2}
    assert len(list((tmp_path / "cache").glob(f"*/{COMPLETE_MARKER}"))) == 1

    # The same inputs: the cached examples, no second sampling; another k or seed samples again.
    assert agreement_examples(stage1, rows, 4, CONF, **kwargs) == built and len(builds) == 1
    other = agreement_examples(stage1, rows, 2, CONF, **kwargs)
    assert len(builds) == 2 and all(len(a) == 2 for a in other["answers"])


def test_the_sampling_runs_outside_the_job_with_every_core(tmp_path, monkeypatch):
    import subprocess

    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda cmd, env, check: seen.update(cmd=cmd, env=env))
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(name, value)
    warmup.run_module_in_child(
        "trl_ext.models.agreement_warmup", {"stage1": "x"}, tmp_path / "spec", tmp_path, failure=""
    )
    assert seen["cmd"][1:3] == ["-m", "trl_ext.models.agreement_warmup"]
    assert not {"RANK", "WORLD_SIZE", "ACCELERATE_USE_CPU", "OMP_NUM_THREADS"} & set(seen["env"])
    assert not list(tmp_path.iterdir())  # the spec file is removed


def test_the_recipe_warms_up_in_two_stages(monkeypatch, recipe_warmup):
    """`--warmup_confidences agreement`: stage 1 is the "weighted" warm-up (the same build, so a cached one is
    reused), stage 2 fine-tunes its checkpoint on the sampled confidence turns beside stage 1's answer turns (gold)
    again, and RL starts from stage 2."""
    from trl_ext.recipe.rlcr import RLCRScriptArguments, warm_up

    sampled = []
    monkeypatch.setattr(
        warmup,
        "run_module_in_child",
        lambda module, spec, spec_file, out, failure: sampled.append(spec["k"]) or agreement_warmup._build(spec, out),
    )
    trained, base, training_args = recipe_warmup.trained, recipe_warmup.base, recipe_warmup.training_args
    train = recipe_warmup.rows(5)
    weighted = warm_up(base, train, RLCRScriptArguments(warmup_samples=3), training_args)[0]
    args = RLCRScriptArguments(warmup_samples=3, warmup_confidences="agreement", warmup_agreement_samples=4)
    path, rest, report = warm_up(base, train, args, training_args)
    assert len(trained) == 2  # the weighted build reused as stage 1, then stage 2
    stage2_base, stage2_examples = trained[1]
    assert stage2_base == weighted and report["agreement"]["model"] == path == report["model"] != weighted
    assert len(rest) == 2 and report["rows"] == 3 and report["examples"] == 6
    stats = report["agreement"]
    assert stats["rows_sampled"] == 3 and stats["samples_per_row"] == 4
    # Stage 2: the three gold answer turns of stage 1 again (they hold the answer turn), then the sampled shares,
    # as many examples per stated value.
    stage1_examples = trained[0][1]
    balanced = stats["balanced_shares"]
    assert stage2_examples[:3] == stage1_examples[::2] and len(stage2_examples) == 3 + sum(balanced.values())
    assert share_distribution(stage2_examples[3:]) == balanced and len(set(balanced.values())) == 1 < len(balanced)
    assert [e["completion"][0]["content"] for e in stage2_examples[:3]] == [
        f"<answer>{2 * i}</answer>" for i in range(3)
    ]
    assert stats["examples"] > 0 and sum(stats["shares"].values()) == stats["examples"]
    assert {e["prompt"][-1]["content"] for e in stage2_examples[3:]} == {CONF}
    assert report["seconds"] >= stats["seconds"] >= stats["sft_seconds"]
    # A second run: nothing sampled or trained again.
    assert warm_up(base, train, args, training_args)[0] == path and len(trained) == 2 and sampled == [4]
    with pytest.raises(ValueError, match="--warmup_agreement_samples must be at least 1"):
        RLCRScriptArguments(warmup_agreement_samples=0)


def test_no_parsable_sample_is_a_clear_error(monkeypatch):
    from types import SimpleNamespace

    from trl_ext.recipe import rlcr
    from trl_ext.recipe.rlcr import RLCRScriptArguments

    stats = {"rows_sampled": 3, "samples_per_row": 8}
    monkeypatch.setattr(rlcr, "agreement_examples", lambda *args, **kwargs: {"examples": [], "stats": stats})
    training_args = SimpleNamespace(
        confidence_prompt=CONF,
        seed=0,
        max_completion_length=8,
        answer_tag="answer",
        confidence_tag="confidence",
        lenient_parsing=False,
        chat_template_kwargs=None,
        use_cpu=True,
    )
    with pytest.raises(ValueError, match="none of the 8 answers sampled for each of 3 warm-up rows had a parsable"):
        rlcr.agreement_stage("stage1", [], [], RLCRScriptArguments(warmup_confidences="agreement"), training_args)
