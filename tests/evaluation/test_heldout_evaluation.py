"""Held-out solver evaluation (`trl_ext.evaluation.solver`): the families' held-out questions, scoring with the family's
reward on hand-written replies, the per-level / per-type breakdown, prompts identical to the trainer's, greedy
generation, and reproducibility."""

import math

import pytest
from trl.chat_template_utils import add_response_schema

from trl_ext.evaluation.greedy import greedy_completions
from trl_ext.evaluation.solver import (
    SolverEvaluation,
    accuracy_breakdown,
    evaluate_solver,
    plot_heldout_accuracy,
    score_replies,
    solver_conversations,
)
from trl_ext.self_play import arithmetic_task, code_reasoning_task, workspace_task
from trl_ext.self_play.arithmetic import PROMPT_EXAMPLE, format_number, heldout_questions, safe_evaluate, seed_prompts
from trl_ext.self_play.code_reasoning.heldout import HELDOUT_PROGRAMS
from trl_ext.testing import (
    FakeExecutor,
    ScriptedGeneration,
    ScriptedModelGenerate,
    cpu_test_args,
    tiny_causal_lm,
    tiny_qwen3_lm,
)
from trl_ext.trainers import AbsoluteZeroConfig, AbsoluteZeroTrainer


def reply(text):
    return {"role": "assistant", "content": text}


# -- the breakdown ---------------------------------------------------------------------------------------------------
def test_accuracy_breakdown_by_hand():
    accuracy, by_group, counts = accuracy_breakdown([1.0, 0.0, 1.0, 1.0, 0.0], [2, 1, 2, 10, 1])
    assert accuracy == 3 / 5
    assert by_group == {"1": 0.0, "2": 1.0, "10": 1.0} and list(by_group) == ["1", "2", "10"]  # numeric order
    assert counts == {"1": 2, "2": 2, "10": 1}
    assert accuracy_breakdown([1.0, 0.0, 0.0], ["deduction", "abduction", "abduction"])[1] == {
        "abduction": 0.0,
        "deduction": 1.0,
    }
    assert math.isnan(accuracy_breakdown([], [])[0])
    with pytest.raises(ValueError, match="2 scores for 1 groups"):
        accuracy_breakdown([1.0, 0.0], [1])


# -- the arithmetic family's held-out questions ----------------------------------------------------------------------
def test_arithmetic_heldout_is_fixed_for_a_seed():
    questions = heldout_questions(12, 3)
    assert questions == heldout_questions(12, 3) and questions != heldout_questions(12, 4)
    assert heldout_questions(3, 0) == [  # pinned: the same rows on every machine and Python version
        {"question": "What is 5 + 10?", "expression": "5 + 10", "solution": "15", "level": 1},
        {"question": "What is 52 * 2?", "expression": "52 * 2", "solution": "104", "level": 2},
        {"question": "What is 22 + 6 * 3?", "expression": "22 + 6 * 3", "solution": "40", "level": 3},
    ]
    assert len(heldout_questions()) == 50 and heldout_questions(0) == []
    for n in (-1, 601):
        with pytest.raises(ValueError, match="0 to 600"):
            heldout_questions(n)


def test_arithmetic_heldout_questions_are_proposals_with_gold_answers():
    questions = heldout_questions(300, 0)
    expressions = [q["expression"] for q in questions]
    assert len(set(expressions)) == 300 and PROMPT_EXAMPLE not in expressions
    assert [q["level"] for q in questions] == [1, 2, 3] * 100
    for lenient in (False, True):  # exactly what the family's parser makes of a proposal
        parse = arithmetic_task(lenient=lenient).parse_question
        assert all({**parse(f"<question>{q['expression']}</question>"), "level": q["level"]} == q for q in questions)
    for q in questions:
        assert q["solution"] == format_number(safe_evaluate(q["expression"]))
        operators = sum(q["expression"].count(op) for op in "+-*/")
        assert operators == (2 if q["level"] == 3 else 1)
        if q["level"] == 1:
            assert all(int(x) < 20 for x in q["expression"].split()[::2])
        if "/" in q["expression"]:
            assert "." not in q["solution"]  # divides evenly


# -- the code family's held-out tasks --------------------------------------------------------------------------------
GOLD = {  # the input of each held-out program -> its output, worked out by hand
    "[3, 1, 4, 1, 5]": "46",
    "'python'": "'PyThOn'",
    "'mississippi'": "'i'",
    "10": "55",
    "[[1, 2, 3], [4, 5, 6]]": "[[1, 4], [2, 5], [3, 6]]",
    "[2, 7, 11, 15], 18": "(1, 2)",
    "'(()())('": "False",
    "[5, 9, 2, 6, 3]": "[9, 6, 3, 5, 2]",
    "'xyz', 3": "'abc'",
    "1234": "30",
    "[('a', 1), ('b', 2), ('a', 3)]": "{'a': [1, 3], 'b': [2]}",
    "[-2, 1, -3, 4, -1, 2, 1, -5, 4]": "6",
}


@pytest.fixture(scope="module")
def code_task():
    return code_reasoning_task(timeout_s=2.0, memory_mb=256)


def test_code_heldout_gold_outputs_come_from_the_sandbox(code_task):
    questions = code_task.heldout_questions(None, 0)
    assert sorted(q["task_type"] for q in questions) == ["abduction"] * 12 + ["deduction"] * 12
    assert {q["input"]: q["output"] for q in questions} == GOLD
    assert {q["program"] for q in questions} == {p for p, _ in HELDOUT_PROGRAMS}
    assert all(set(q) == {"task_type", "program", "input", "output"} for q in questions)  # a validated proposal's
    assert questions == code_task.heldout_questions(None, 0) and questions != code_task.heldout_questions(None, 1)
    five = code_task.heldout_questions(5, 2)
    assert len(five) == 5 and all(q in questions for q in five)
    with pytest.raises(ValueError, match="0 to 24"):
        code_task.heldout_questions(25, 0)


def test_code_heldout_refuses_a_broken_sandbox():
    task = code_reasoning_task(execute_many=FakeExecutor({}))  # every program fails
    with pytest.raises(RuntimeError, match="held-out program .* gave no output in the sandbox"):
        task.heldout_questions(2, 0)


def test_workspace_has_no_heldout_set():
    assert workspace_task().heldout_questions is None


# -- scoring with the family's own reward ----------------------------------------------------------------------------
def test_arithmetic_replies_scored_by_hand():
    questions = heldout_questions(6, 0)  # golds 15, 104, 40 (levels 1, 2, 3), then 32, -21, 94
    assert [q["solution"] for q in questions] == ["15", "104", "40", "32", "-21", "94"]
    replies = [
        reply(t)
        for t in (
            "<answer>15</answer>",
            "<answer>104.0</answer>",
            "<answer>41</answer>",
            "32",
            "<answer>-21</answer>",
            "no idea",
        )
    ]
    strict = arithmetic_task()
    scores = score_replies(strict, questions, solver_conversations(strict, questions), replies)
    assert scores == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert accuracy_breakdown(scores, [q["level"] for q in questions]) == (
        0.5,
        {"1": 0.5, "2": 1.0, "3": 0.0},
        {"1": 2, "2": 2, "3": 2},
    )
    lenient = arithmetic_task(lenient=True)  # the family's reward, so the family's parsing: a bare last number counts
    assert score_replies(lenient, questions, solver_conversations(lenient, questions), replies)[3] == 1.0


def test_code_replies_scored_by_execution(code_task):
    by_input = {(q["task_type"], q["input"]): q for q in code_task.heldout_questions(None, 0)}
    questions = [
        by_input["deduction", "10"],
        by_input["deduction", "'mississippi'"],
        by_input["deduction", "1234"],
        by_input["abduction", "[-2, 1, -3, 4, -1, 2, 1, -5, 4]"],
        by_input["abduction", "10"],
    ]
    replies = [
        reply(t)
        for t in (
            "55 it is.\n```output\n55\n```",
            "```output\n's'\n```",  # wrong: 'i' and 's' both occur 4 times, sorted() puts 'i' first
            "```output\n30\n```",
            "```input\n[6]\n```",  # another input with the same output: right, by execution
            "```input\n9\n```",  # f(9) is 34, not 55
        )
    ]
    scores = score_replies(code_task, questions, solver_conversations(code_task, questions), replies)
    assert scores == [1.0, 0.0, 1.0, 1.0, 0.0]
    accuracy, by_type, counts = accuracy_breakdown(scores, [q["task_type"] for q in questions])
    assert accuracy == 3 / 5 and by_type == {"abduction": 0.5, "deduction": 2 / 3}
    assert counts == {"abduction": 2, "deduction": 3}


def test_a_question_without_gold_is_refused():
    task = arithmetic_task()
    question = {"question": "What is 1 + 1?", "expression": "1 + 1", "solution": None, "level": 1}
    with pytest.raises(ValueError, match="numeric_match cannot score"):
        score_replies(task, [question], solver_conversations(task, [question]), [reply("<answer>2</answer>")])


# -- the evaluation end to end ---------------------------------------------------------------------------------------
def answer_level_one(questions):
    """A solver that is right on level 1 and wrong elsewhere."""
    golds = {q["question"]: (q["solution"] if q["level"] == 1 else "x") for q in questions}

    def script(prompt):
        question = next(text for text in golds if text in prompt)
        return f"<answer>{golds[question]}</answer>"

    return script


def test_evaluation_scores_the_model_replies():
    model, tokenizer = tiny_causal_lm()
    task, questions = arithmetic_task(), heldout_questions(7, 0)
    model.train()
    with ScriptedModelGenerate(model, tokenizer, answer_level_one(questions)) as generate:
        result = evaluate_solver(task, model, tokenizer, 16, questions, batch_size=3, progress=False)
    assert model.training  # restored
    assert len(generate.prompt_ids) == 7  # three batches: 3 + 3 + 1
    assert result.accuracy == 3 / 7 and result.by_group == {"1": 1.0, "2": 0.0, "3": 0.0}
    assert result.counts == {"1": 3, "2": 2, "3": 2} and result.reward == "numeric_match"
    assert result.accuracy == sum(row["score"] for row in result.rows) / len(result.rows)
    assert [row["question"] for row in result.rows] == questions
    assert result.rows[0]["reply"] == "<answer>15</answer>" and result.rows[1]["reply"] == "<answer>x</answer>"
    assert result.to_dict() == {
        "accuracy": 3 / 7,
        "num_questions": 7,
        "reward": "numeric_match",
        "breakdown": "level",
        "by_group": result.by_group,
        "counts": result.counts,
    }
    # Replies are cut at max_new_tokens, as in training: 3 tokens cannot hold an answer.
    with ScriptedModelGenerate(model, tokenizer, answer_level_one(questions)):
        assert evaluate_solver(task, model, tokenizer, 3, questions, progress=False).accuracy == 0.0


def test_prompts_are_the_trainers_solver_prompts(tmp_path):
    """The evaluation renders a question exactly as the trainer renders the solver prompt of the same proposal, chat
    template arguments included (Qwen3's template renders an empty think block with `enable_thinking=False`)."""
    model, tokenizer = tiny_qwen3_lm()
    task = arithmetic_task()
    question = heldout_questions(1, 0)[0]  # 5 + 10

    def script(prompt, k):
        return "<answer>15</answer>" if "What is" in prompt else f"<question>{question['expression']}</question>"

    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        num_questions_per_prompt=2,
        max_repropose_attempts=0,
        max_question_length=16,
        max_completion_length=16,
        chat_template_kwargs={"enable_thinking": False},
    )
    trainer = AbsoluteZeroTrainer(
        model,
        task.reward_funcs,
        args=args,
        train_dataset=seed_prompts(4, 0),
        processing_class=tokenizer,
        parse_question=task.parse_question,
        solver_prompt_fn=task.solver_prompt_fn,
    )
    with ScriptedGeneration(trainer, script) as gen:
        trainer.train()
    solver_ids = [ids for call in gen.calls for ids in call.prompt_ids if "What is" in tokenizer.decode(ids)]
    assert solver_ids
    with ScriptedModelGenerate(model, tokenizer, lambda prompt: "<answer>15</answer>") as generate:
        result = evaluate_solver(
            task, model, tokenizer, 16, [question], progress=False, chat_template_kwargs=args.chat_template_kwargs
        )
    assert generate.prompt_ids == [solver_ids[0]] and result.accuracy == 1.0
    assert "<think>\n\n</think>" in tokenizer.decode(solver_ids[0])
    with ScriptedModelGenerate(model, tokenizer, lambda prompt: "<answer>15</answer>") as generate:
        evaluate_solver(task, model, tokenizer, 16, [question], progress=False)
    assert generate.prompt_ids != [solver_ids[0]]  # without them: another prompt


def test_replies_go_through_the_tokenizers_response_parser():
    """A tokenizer with a response parser (Qwen3's, from TRL): replies are messages as TRL parses completions, the
    reasoning apart from the content."""
    model, tokenizer = tiny_qwen3_lm()
    tokenizer = add_response_schema(tokenizer)
    task, questions = arithmetic_task(), heldout_questions(3, 0)
    solve = answer_level_one(questions)
    with ScriptedModelGenerate(model, tokenizer, lambda prompt: f"<think>\nadd them\n</think>\n\n{solve(prompt)}"):
        result = evaluate_solver(task, model, tokenizer, 32, questions, progress=False)
    assert [row["reply"] for row in result.rows] == ["<answer>15</answer>", "<answer>x</answer>", "<answer>x</answer>"]
    assert result.accuracy == 1 / 3


def test_real_greedy_evaluation_reproduces_itself():
    model, tokenizer = tiny_causal_lm(seed=1, initializer_range=0.5)  # context-dependent replies
    task, questions = arithmetic_task(lenient=True), heldout_questions(6, 0)
    first = evaluate_solver(task, model, tokenizer, 6, questions, progress=False)
    second = evaluate_solver(task, model, tokenizer, 6, questions, progress=False)
    assert first == second
    assert len({row["reply"] for row in first.rows}) > 1  # the replies depend on the question
    # Left padding does not change a reply: one question per batch gives the same replies.
    alone = evaluate_solver(task, model, tokenizer, 6, questions, batch_size=1, progress=False)
    assert [row["reply"] for row in alone.rows] == [row["reply"] for row in first.rows]


def test_greedy_completions_stop_after_eos():
    model, tokenizer = tiny_causal_lm()
    eos = tokenizer.eos_token_id
    with ScriptedModelGenerate(model, tokenizer, lambda prompt: "ab" if "short" in prompt else "a much longer reply"):
        prompts = [tokenizer.encode("short"), tokenizer.encode("a longer prompt")]
        short, long = greedy_completions(model, tokenizer, prompts, 4)
    assert short == tokenizer.encode("ab") + [eos] and len(long) == 4 and eos not in long


def test_plot(tmp_path):
    before = SolverEvaluation(0.25, {"1": 0.5, "2": 0.0}, {"1": 2, "2": 2}, "level", "numeric_match", [{}] * 4)
    after = SolverEvaluation(0.5, {"1": 1.0, "2": 0.0}, {"1": 2, "2": 2}, "level", "numeric_match", [{}] * 4)
    log = [{"step": 1, "unified_filter/learnable_ratio": 0.5}, {"step": 2, "unified_filter/learnable_ratio": 1.0}]
    path = plot_heldout_accuracy({"before": before, "after": after}, log, tmp_path / "p.png", "title")
    assert (tmp_path / "p.png").stat().st_size > 10_000 and path.endswith("p.png")


def test_empty_set_is_refused():
    model, tokenizer = tiny_causal_lm()
    with pytest.raises(ValueError, match="no held-out questions"):
        evaluate_solver(arithmetic_task(), model, tokenizer, 4, [])
