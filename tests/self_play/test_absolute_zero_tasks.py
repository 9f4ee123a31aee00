"""The arithmetic task family: safe evaluator (with fuzzing), question parser, solver rewards, config validation."""

import ast
import time
from fractions import Fraction
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_ext.self_play import (
    TaskFamily,
    arithmetic_task,
    safe_evaluate,
    tagged_question_parser,
    template_solver_prompt,
)
from trl_ext.self_play.arithmetic import (
    format_number,
    make_answer_format_reward,
    make_numeric_match_reward,
    make_question_parser,
    parse_number,
    seed_prompts,
)
from trl_ext.testing import cpu_test_args
from trl_ext.trainers import AbsoluteZeroConfig


@pytest.mark.parametrize(
    "expression, value",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 / 2", Fraction(7, 2)),
        ("-3 × (2 + 5)", -21),
        ("10 ÷ 4", Fraction(5, 2)),
        ("0.5 + 0.25", Fraction(3, 4)),
        ("--4 - +1", 3),
        ("((((2))))*3", 6),
    ],
)
def test_evaluates_arithmetic_exactly(expression, value):
    assert safe_evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "1/0",
        "5 / (2 - 2)",  # division by zero
        "2 ** 10",
        "9**9**9**9",  # powers are not arithmetic here
        "__import__('os').system('true')",  # names, calls, attributes, strings
        "open('x')",
        "(1).real",
        "[1, 2]",
        "1 if 1 else 2",
        "1 < 2",
        "lambda: 1",
        "x + 1",
        "5",
        "-5",
        "",
        "   ",
        "1 +",
        "1 2",  # a bare number is not a question; syntax errors
        "99999999 * 99999999",  # intermediate magnitude above 1e12
        "1 / 3 / 3 / 3 / 3 / 3 / 3 / 3 / 3 / 3 / 3 / 3 / 3 / 3",  # denominator above the bound
        "1" + " + 1" * 40,  # more nodes than allowed
        "(" * 60 + "1+1" + ")" * 60,  # longer than the text bound
        "1e400 + 1",
        "1_000 + 1",
        "0x10 + 1",
        "1j + 1",
    ],
)
def test_rejects_everything_else(expression):
    assert safe_evaluate(expression) is None


def test_never_calls_eval():
    with (
        mock.patch("builtins.eval", side_effect=AssertionError("eval called")),
        mock.patch("builtins.exec", side_effect=AssertionError("exec called")),
    ):
        assert safe_evaluate("2 * (3 + 4)") == 14


# Bounds on hangs and quadratic blow-ups, not on speed: each input takes milliseconds; a quadratic regex scan of the
# 20,000-character inputs below took 12-20 s here, an unbounded power far longer. Generous for a loaded 2-core machine.
HANG_S = 5.0
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ATOMS = st.one_of(st.integers(-(10**15), 10**15).map(str), st.sampled_from(["0", "0.5", "1e9", "x", "()", "''", "**"]))


@st.composite
def expressions(draw, depth=0):
    if depth > 6 or draw(st.booleans()):
        return draw(ATOMS)
    op = draw(st.sampled_from(["+", "-", "*", "/", "**", "//", "%", " if ", ", ", "."]))
    left, right = draw(expressions(depth + 1)), draw(expressions(depth + 1))
    return draw(st.sampled_from([f"{left}{op}{right}", f"({left}{op}{right})", f"-{left}"]))


@FUZZ
@given(st.one_of(expressions(), st.text(max_size=200), st.text(alphabet="0123456789+-*/(). ", max_size=150)))
def test_fuzz_never_raises_or_hangs(text):
    start = time.perf_counter()
    value = safe_evaluate(text)
    assert time.perf_counter() - start < HANG_S
    if value is not None:
        assert abs(value) <= 10**12 and value.denominator <= 10**6
        tree = ast.parse(text.strip().replace("×", "*").replace("÷", "/"), mode="eval")  # safe_evaluate strips
        assert all(
            isinstance(n, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop))
            for n in ast.walk(tree)
        )


@pytest.mark.parametrize(
    "text",
    [
        "(" * 5000,
        "1" + "+1" * 5000,
        "-" * 10000 + "1",
        "9" * 10000,
        "\x00" * 50,
        "1+" + " " * 20000 + "x",
        " " * 9000 + "1+" + " " * 9000,
        "1 " * 10000,
    ],
)
def test_pathological_inputs(text):
    start = time.perf_counter()
    assert safe_evaluate(text) is None
    assert make_question_parser()(f"<question>{text}</question>") is None
    assert make_question_parser(lenient=True)(text) is None  # the lenient search: no quadratic backtracking blow-up
    assert time.perf_counter() - start < HANG_S


@FUZZ
@given(st.text(alphabet="0123456789+-*/() .x<>questionQ", max_size=3000))
def test_fuzz_parser_never_raises_or_hangs(text):
    start = time.perf_counter()
    for parse in (make_question_parser(), make_question_parser(lenient=True)):
        question = parse(text)
        assert question is None or safe_evaluate(question["expression"]) is not None
    assert time.perf_counter() - start < HANG_S


def test_format_and_parse_numbers():
    assert [format_number(Fraction(x)) for x in ("12", "-3.25", "0.0001", "1/3", "1/80000")] == [
        "12",
        "-3.25",
        "0.0001",
        None,
        None,
    ]
    assert [parse_number(x) for x in ("12", " -3.50 ", "1,000", "7.", "1e3", "seven", None, "9" * 100)] == [
        12,
        Fraction(-7, 2),
        1000,
        7,
        None,
        None,
        None,
        None,
    ]


def test_question_parser():
    parse = make_question_parser()
    assert parse("Sure: <question>What is 12 × 3 - 5?</question>") == {
        "question": "What is 12 * 3 - 5?",
        "expression": "12 * 3 - 5",
        "solution": "31",
    }
    assert parse("<question>Compute 7/2 =</question>")["solution"] == "3.5"
    for bad in [
        "12 * 3",
        "<question>1/3</question>",
        "<question>tell me a joke</question>",
        "<question></question>",
        "<question>1/0</question>",
        None,
        b"<question>1+1</question>",
        42,
    ]:
        assert parse(bad) is None
    lenient = make_question_parser(lenient=True)
    assert lenient("How about 4 * (2 + 1) = ?")["solution"] == "12"
    assert lenient("no numbers here") is None


def test_solver_rewards_never_raise():
    match, fmt = make_numeric_match_reward(), make_answer_format_reward()
    completions = [
        "<answer>31</answer>",
        "<answer>31.0</answer>",
        "<answer>30</answer>",
        "31",
        "",
        [{"role": "assistant", "content": "<answer>31</answer>"}],
        None,
        "<answer>" * 1000,
    ]
    gold = ["31"] * len(completions)
    assert match(None, completions, solution=gold) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert make_numeric_match_reward(lenient=True)(None, ["it is 31"], solution=["31"]) == [1.0]
    assert match(None, ["<answer>1</answer>"] * 2, solution=[None, "not a number"]) == [None, None]  # not applicable
    logged = []
    assert match(
        None,
        ["<answer>1</answer>"] * 4,
        solution=[None, "1", "  ", "2"],
        log_metric=lambda name, value: logged.append((name, value)),
    ) == [None, 1.0, None, 0.0]
    assert logged == [("numeric_match/missing_gold_rate", 0.5)]
    assert fmt(None, completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert match.__name__ == "numeric_match" and fmt.__name__ == "answer_format"


def test_task_family_pieces():
    task = arithmetic_task()
    assert isinstance(task, TaskFamily) and [f.__name__ for f in task.reward_funcs] == [
        "numeric_match",
        "answer_format",
    ]
    rows = seed_prompts(5, seed=1)
    assert rows.to_list() == seed_prompts(5, seed=1).to_list() and "<question>" in rows[0]["prompt"][0]["content"]
    assert task.solver_prompt_fn({"question": "What is 1+1?"}, {})[-1] == {"role": "user", "content": "What is 1+1?"}
    parse = tagged_question_parser()
    assert parse("<question> Why? </question>") == {"question": "Why?"}
    assert parse('<question>{"question": "2+2?", "solution": "4"}</question>') == {"question": "2+2?", "solution": "4"}
    assert parse('{"question": "Name a prime.", "level": 2}') == {"question": "Name a prime.", "level": 2}
    assert parse('<question>{"q": 1}</question>') == {"question": '{"q": 1}'}  # not a question object: the text
    for bad in ['{"question": ""}', "{" * 5000, "no tags", "", None, '{"question": 3}']:
        assert parse(bad) is None
    assert template_solver_prompt("Q: {question}", "Be brief.")({"question": "x"}, {}) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Q: x"},
    ]
    # a field the proposal lacks, or None (absent in this proposal, present in another), renders empty
    assert template_solver_prompt("{question} [{hint}]")({"question": "x", "hint": None}, {})[0]["content"] == "x []"
    assert template_solver_prompt("{question} [{hint}]")({"question": "x"}, {})[0]["content"] == "x []"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_questions_per_prompt": 1}, "num_questions_per_prompt must be at least 2"),
        ({"max_repropose_attempts": -1}, "max_repropose_attempts"),
        ({"proposer_reward_mode": "other"}, "proposer_reward_mode"),
        ({"proposer_rows": "some"}, "proposer_rows"),
        ({"proposer_loss_weight": -1.0}, "proposer_loss_weight"),
        ({"repropose_penalty": float("inf")}, "repropose_penalty"),
        ({"uniform_question_reward": float("nan")}, "uniform_question_reward"),
        ({"max_question_length": 0}, "max_question_length"),
        ({"question_tag": "<q>"}, "question_tag"),
        ({"proposer_prompt_template": "no placeholder"}, "proposer_prompt_template"),
        ({"solver_prompt_template": "no field"}, "solver_prompt_template"),
        ({"learnability_criteria": "[{not json"}, "learnability_criteria is not valid JSON"),
        ({"learnability_criteria": [{"reward": "a"}]}, r"learnability_criteria\[0\]"),
    ],
)
def test_config_errors_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        cpu_test_args(tmp_path, AbsoluteZeroConfig, **overrides)


def test_config_accepts_criteria_as_json(tmp_path):
    args = cpu_test_args(
        tmp_path,
        AbsoluteZeroConfig,
        learnability_criteria=(
            '[{"reward": "numeric_match", "threshold": 0.5, "count": "above", "min_ratio": 0.25, "max_ratio": 0.75}]'
        ),
    )
    assert args.learnability_criteria[0]["min_ratio"] == 0.25
