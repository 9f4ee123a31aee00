"""The code reasoning family on hand-written programs: parsing, proposer prompts from the buffer, validation (gold by
execution, determinism, bounds), scoring of each task type, the buffer and its JSON state.

Execution goes through `FakeExecutor` (programs answered by Python functions written here); the same checks against
the real sandbox are in test_code_tasks_sandbox.py.
"""

import json
import random

import pytest

from trl_ext.self_play.code_reasoning import (
    ZERO_TRIPLET,
    CodeTaskState,
    code_reasoning_task,
    make_proposal_parser,
    seed_prompts,
    solver_prompt,
)
from trl_ext.self_play.code_reasoning.programs import (
    MAX_OUTPUT_CHARS,
    check_program,
    derived_inputs,
    fenced_blocks,
    format_input,
    parse_input,
    parse_value,
)
from trl_ext.testing import FakeExecutor


SORT = "def f(xs, k):\n    return sorted(xs)[:k]"
DOUBLE = "def f(n):\n    return n * 2"
COUNTER = "def f(n):\n    return next(c)"  # a different value at every call
RAISES = "def f(n):\n    return 1 // n"
BIG = "def f(n):\n    return 'x' * n"
OBJECT = "def f(n):\n    return object()"
GUESS_DOUBLE = "def f(m):\n    return m + m"  # another program computing DOUBLE
GUESS_WRONG = "def f(m):\n    return m + 1"


def counter():
    state = iter(range(10**6))
    return lambda n: next(state)


def executor():
    return FakeExecutor(
        {
            SORT: lambda xs, k: sorted(xs)[:k],
            DOUBLE: lambda n: n * 2,
            COUNTER: counter(),
            RAISES: lambda n: 1 // n,
            BIG: lambda n: "x" * n,
            OBJECT: lambda n: object(),
            GUESS_DOUBLE: lambda m: m + m,
            GUESS_WRONG: lambda m: m + 1,
        }
    )


def proposal(program=None, inputs=(), message=None):
    text = "Let me think.\n"
    if program is not None:
        text += f"```python\n{program}\n```\n"
    text += "".join(f"```input\n{i}\n```\n" for i in inputs)
    if message is not None:
        text += f"```message\n{message}\n```\n"
    return text


def parsed(task_type, text, program=None):
    """What the trainer hands to validate: the parsed fields, the proposer context merged over them."""
    context = {"task_type": task_type, **({"program": program} if program else {})}
    return {**make_proposal_parser()(text), **context}


# -- text ---------------------------------------------------------------------------------------------------------
def test_fenced_blocks_and_program_checks():
    text = "x ```python\ndef f(a):\n    return a\n``` and ```input\n1, 'b'\n``` ```Output\n3\n```"
    assert fenced_blocks(text) == [("python", "def f(a):\n    return a\n"), ("input", "1, 'b'\n"), ("output", "3\n")]
    assert fenced_blocks("```python\nunterminated") == [] and fenced_blocks(None) == []
    assert check_program(" def f(a):\n    return a\n") == "def f(a):\n    return a"
    assert check_program("import math\nclass T: pass\ndef f(a):\n    return T()") is not None
    for bad in (
        "def g(a):\n    return a",
        "def f(a) return a",
        "f = lambda a: a",
        "",
        None,
        "def f(a):\n    return a\n" + "#" * 5000,
        "def outer():\n    def f(a):\n        return a",
    ):
        assert check_program(bad) is None, bad


def test_inputs_and_values_are_literals():
    assert parse_input("[3, 1], 'a'") == ([3, 1], "a")
    assert parse_input("{'k': (1, 2)}  # a comment") == ({"k": (1, 2)},)
    for bad in (
        "",
        "x",
        "k=1",
        "1), (2",
        "1)(2",
        "*[1, 2]",
        "[1], **{}",
        "__import__('os')",
        "1e999",
        "f(1)",
        "1, 2,,",
        "[" * 300 + "]" * 300,
        None,
        "1" * 2000,
    ):
        assert parse_input(bad) is None, bad
    assert format_input(([3, 1], "a")) == "[3, 1], 'a'" and parse_input(format_input((5,))) == (5,)
    assert parse_value(" [1,2] ") == (True, [1, 2]) and parse_value("{1, 2}") == (True, {1, 2})
    for bad in ("nan", "os.getcwd()", "'unterminated", "1" * (MAX_OUTPUT_CHARS + 1), None):
        assert parse_value(bad) == (False, None)


def test_parser_reads_blocks_and_rejects_prose():
    parse = make_proposal_parser()
    fields = parse(proposal(SORT, ["[3, 1, 2], 2", "[5], 1"], "sorting"))
    assert fields == {"program": SORT + "\n", "inputs": ["[3, 1, 2], 2\n", "[5], 1\n"], "message": "sorting\n"}
    assert parse("def f(x): return x") is None and parse(12) is None
    assert parse("```\n" + DOUBLE + "\n```") is None
    assert make_proposal_parser(lenient=True)("```\n" + DOUBLE + "\n```")["program"] == DOUBLE + "\n"


def test_an_input_is_the_argument_list_of_a_call():
    # Fails on main (issue 21, item 6): the input was wrapped as `(<text>\n,)`, so a trailing comma (valid call syntax,
    # 89 of AZR's 17,572 seed inputs) made a double comma and the proposal was invalid.
    assert parse_input("'Python',") == ("Python",)
    assert parse_input("[1, 2],\n{'a': 3},  # two arguments\n") == ([1, 2], {"a": 3})
    state = CodeTaskState(execute_many=executor())
    checked = state.validate([parsed("abduction", proposal(DOUBLE, ["21,"]))])
    assert checked == [{"task_type": "abduction", "program": DOUBLE, "input": "21", "output": "42"}]


# -- proposer prompts ---------------------------------------------------------------------------------------------
def test_proposer_prompts_come_from_the_buffer_with_the_given_rng():
    state = CodeTaskState(num_references=2)
    state.triplets += [{"program": DOUBLE, "input": str(n), "output": str(2 * n)} for n in range(5)]
    prompt, context = state.proposer_prompt({"task_type": "deduction"}, random.Random(0))
    again, _ = state.proposer_prompt({"task_type": "deduction"}, random.Random(0))
    assert prompt == again and context == {"task_type": "deduction"}  # same rng, same prompt (every rank)
    text = prompt[0]["content"]
    assert text.count("```python\n") == 3 and "Puzzle 2:" in text and "Puzzle 3:" not in text  # example + 2 refs
    assert "work out the output" in text
    prompt, context = state.proposer_prompt({"task_type": "induction"}, random.Random(1))
    assert context["task_type"] == "induction" and context["program"] in {t["program"] for t in state.triplets}
    assert context["program"] in prompt[0]["content"] and "6 different inputs" in prompt[0]["content"]
    abduction, _ = state.proposer_prompt({"task_type": "abduction"}, random.Random(0))
    assert "find an input" in abduction[0]["content"]
    with pytest.raises(ValueError, match="task_type"):
        state.proposer_prompt({"task_type": "poetry"}, random.Random(0))


def test_seed_prompts_mix_the_task_types():
    rows = seed_prompts(9, seed=3)
    assert sorted(rows["task_type"]) == ["abduction"] * 3 + ["deduction"] * 3 + ["induction"] * 3
    assert rows["task_type"] == seed_prompts(9, seed=3)["task_type"] != ["deduction", "abduction", "induction"] * 3
    assert set(seed_prompts(4, task_types=["deduction"])["task_type"]) == {"deduction"}
    with pytest.raises(ValueError, match="task_types"):
        seed_prompts(3, task_types=["poetry"])


# -- validation ----------------------------------------------------------------------------------------------------
def test_validation_executes_every_proposal_twice_in_one_batch():
    fake = executor()
    state = CodeTaskState(execute_many=fake)
    questions = [
        parsed("deduction", proposal(SORT, ["[3, 1, 2], 2"])),
        parsed("abduction", proposal(DOUBLE, ["4", "21"])),  # the last input block is the input
        parsed("deduction", proposal(COUNTER, ["1"])),  # not deterministic
        parsed("deduction", proposal(RAISES, ["0"])),  # raises
        parsed("abduction", proposal(BIG, [str(MAX_OUTPUT_CHARS + 1)])),  # output too long
        parsed("deduction", proposal(OBJECT, ["1"])),  # output not a literal
        parsed("deduction", proposal("def g(n):\n    return n", ["1"])),  # no f: not executed
        parsed("abduction", proposal(DOUBLE, ["n=3"])),  # not literal arguments: not executed
        parsed("induction", proposal(None, ["1", "2", "2", "oops", "3"], "doubles"), program=DOUBLE),
        parsed("induction", proposal(None, ["1", "x"], "doubles"), program=DOUBLE),  # one valid pair
        parsed("induction", proposal(None, ["1", "2"]), program=DOUBLE),  # no message
        parsed("induction", proposal(None, ["0", "1", "2"], "hmm"), program=RAISES),  # 2 of 3 pairs run
    ]
    checked = state.validate(questions)
    # one batch: 6 single calls, their 12 nearby inputs and 6 induction inputs, each twice
    assert fake.calls == [2 * (6 + 12 + 3 + 3)]
    assert checked[0] == {"task_type": "deduction", "program": SORT, "input": "[3, 1, 2], 2", "output": "[1, 2]"}
    assert checked[1] == {"task_type": "abduction", "program": DOUBLE, "input": "21", "output": "42"}
    assert checked[2:8] == [None] * 6
    assert checked[8] == {
        "task_type": "induction",
        "program": DOUBLE,
        "message": "doubles",
        "visible": [["1", "2"], ["2", "4"]],
        "hidden": [["3", "6"]],
    }
    assert checked[9] is None and checked[10] is None
    assert checked[11]["visible"] == [["1", "1"]] and checked[11]["hidden"] == [["2", "0"]]
    assert state.validate([]) == [] and fake.calls == [48]  # nothing to run: no call


# -- scoring -------------------------------------------------------------------------------------------------------
def score(task, questions, answers, **extra):
    correct, fmt = task.reward_funcs
    columns = {key: [q.get(key) for q in questions] for key in {k for q in questions for k in q}}
    completions = [[{"role": "assistant", "content": a}] for a in answers]
    return correct(None, completions, None, **columns, **extra), fmt(None, completions, None, **columns)


def test_deduction_is_value_equality():
    task = code_reasoning_task(execute_many=executor())
    q = {"task_type": "deduction", "program": SORT, "input": "[3, 1, 2], 2", "output": "[1, 2]"}
    answers = [
        "```output\n[1,2]\n```",
        "I think ```output\n[9]\n``` no wait ```output\n[ 1 , 2 ]\n```",
        "```output\n(1, 2)\n```",
        "```output\n[1, 2\n```",
        "the answer is [1, 2]",
        "```output\nf([3,1,2], 2)\n```",
    ]
    correct, fmt = score(task, [q] * len(answers), answers)
    assert correct == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # a tuple is not the list; code is not a literal
    assert fmt == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert task.state._execute_many.calls == [1]  # deduction runs the gold program once per question


def test_abduction_runs_the_program_on_the_predicted_input():
    fake = executor()
    task = code_reasoning_task(execute_many=fake)
    q = {"task_type": "abduction", "program": SORT, "input": "[3, 1, 2], 2", "output": "[1, 2]"}
    answers = [
        "```input\n[2, 1, 9], 2\n```",  # another preimage: correct
        "```input\n[1, 2], 5\n```",
        "```input\n[1, 2]\n```",  # right output / too few arguments
        "```input\n[7, 8], 2\n```",
        "```input\n__import__('os').system('x')\n```",
        "no block",
    ]
    correct, fmt = score(task, [q] * len(answers), answers)
    assert correct == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0] and fmt == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert fake.calls == [2 * 4 + 1]  # the literal answers twice and the gold once, in one batch


def test_induction_runs_the_predicted_program_on_the_held_out_pairs():
    fake = executor()
    task = code_reasoning_task(execute_many=fake)
    q = {
        "task_type": "induction",
        "program": DOUBLE,
        "message": "doubles",
        "visible": [["1", "2"]],
        "hidden": [["3", "6"], ["-4", "-8"]],
    }
    answers = [
        f"```python\n{GUESS_DOUBLE}\n```",
        f"```python\n{GUESS_WRONG}\n```",
        "```python\ndef g(m): pass\n```",
        "```python\nunknown = 1\ndef f(m):\n    return m\n```",
    ]
    correct, fmt = score(task, [q] * len(answers), answers)
    assert correct == [1.0, 0.0, 0.0, 0.0] and fmt == [1.0, 1.0, 0.0, 1.0]
    assert fake.calls == [2 * 3 + 1]  # the programs twice and the gold once
    prompt = solver_prompt(q, {})[0]["content"]
    assert "```input\n1\n```\n```output\n2\n```" in prompt and "-8" not in prompt  # held-out pairs stay hidden


def test_induction_answers_are_not_bounded_by_one_output():
    # Fails on main (issue 21, item 7): the list of an answer's held-out values had to fit one output's bound, so a
    # gold program whose outputs fit it one by one failed its own task.
    task = code_reasoning_task(execute_many=executor())
    q = {
        "task_type": "induction",
        "program": BIG,
        "message": "repeats x",
        "visible": [["1", "'x'"]],
        "hidden": [[str(n), repr("x" * n)] for n in (600, 700)],
    }
    assert score(task, [q], [f"```python\n{BIG}\n```"])[0] == [1.0]


def test_a_gold_that_no_longer_reproduces_drops_its_rows():
    # Fails on main (issue 35, item 2): a program keeping state outside its process (the page cache, on main) passed
    # the two-run check at validation, then graded the same correct answer 0 0 1 1 0 0. Now the gold is made again
    # in the grading batch: when it no longer comes out, the rows are dropped (None) and counted.
    calls = iter(range(10**6))
    toggles = "def f(n):\n    return read_the_register()"  # the value flips every second execution
    fake = FakeExecutor({toggles: lambda n: next(calls) // 2 % 2})
    task = code_reasoning_task(execute_many=fake)
    (question,) = task.state.validate([parsed("abduction", proposal(toggles, ["5"]))])
    assert question["output"] == "0"  # valid: its two runs agreed
    logged = {}
    correct, fmt = score(task, [question] * 6, ["```input\n5\n```"] * 6, log_metric=logged.__setitem__)
    assert correct == [None] * 6 and fmt == [1.0] * 6
    assert logged["code_correct/gold_not_reproduced_rate"] == 1.0


def test_nondeterminism_off_the_validated_input_is_caught():
    # Fails on main (issue 35, item 3): a program deterministic on its own input and random elsewhere validated, and
    # abduction graded the solver's other inputs with it ([1, 0, 1, 0, ...] for one answer): the proposer chose its
    # own solve rate. Now validation also runs it twice on nearby inputs, and grading runs each answer twice.
    coin = iter(range(10**6))
    sly = "def f(x):\n    return 1 if x == 'Hello' else coin()"
    fake = FakeExecutor({sly: lambda x: 1 if x == "Hello" else next(coin) % 2})
    task = code_reasoning_task(execute_many=fake)
    assert task.state.validate([parsed("abduction", proposal(sly, ["'Hello'"]))]) == [None]
    # A task posed before (in the buffer of a run from an older version, or random on inputs no check tried):
    question = {"task_type": "abduction", "program": sly, "input": "'Hello'", "output": "1"}
    logged = {}
    correct, _ = score(task, [question] * 10, ["```input\n'other'\n```"] * 10, log_metric=logged.__setitem__)
    assert correct == [None] * 10 and logged["code_correct/nondeterministic_rate"] == 1.0
    correct, _ = score(task, [question] * 2, ["```input\n'Hello'\n```"] * 2)
    assert correct == [1.0, 1.0]  # the validated input still grades


def test_a_random_induction_answer_is_wrong():
    coin = iter(range(10**6))
    guess = "def f(m):\n    return guess()"
    fake = executor()
    fake.programs[guess] = lambda m: m * 2 if next(coin) % 2 == 0 else 0  # right on every other execution
    task = code_reasoning_task(execute_many=fake)
    question = {
        "task_type": "induction",
        "program": DOUBLE,
        "message": "m",
        "visible": [["1", "2"]],
        "hidden": [["3", "6"]],
    }
    logged = {}
    correct, _ = score(task, [question] * 4, [f"```python\n{guess}\n```"] * 4, log_metric=logged.__setitem__)
    assert correct == [0.0] * 4 and logged["code_correct/nondeterministic_rate"] == 1.0


def test_nearby_inputs_keep_types_and_differ():
    assert derived_inputs(("Hello world",)) == [("Hello worldx",), ("dlrow olleH",)]
    assert derived_inputs(([3, 1, 2], 2)) == [([3, 1, 2, 3], 3), ([2, 1, 3], 1)]
    assert derived_inputs(("aba", True)) == [("abax", False), ("ab", False)]
    assert derived_inputs(({"a": 1},)) == [({},)] and derived_inputs((None,)) == []
    assert derived_inputs(("x" * 999,)) == [("x" * 998,)]  # grown past the input bound: left out


def test_rows_without_a_task_type_are_not_applicable():
    task = code_reasoning_task(execute_many=executor())
    assert score(task, [{"task_type": None}], ["```output\n1\n```"]) == ([None], [None])


# -- buffer --------------------------------------------------------------------------------------------------------
def test_buffer_update_dedupes_caps_and_round_trips_through_json():
    state = CodeTaskState(max_buffer_size=3)
    assert state.triplets == [ZERO_TRIPLET]
    new = [{"task_type": "deduction", "program": DOUBLE, "input": str(n), "output": str(2 * n)} for n in (1, 2, 1)]
    induction = {"task_type": "induction", "program": DOUBLE, "message": "m", "visible": [], "hidden": []}
    state.update([*new, induction])
    assert state.triplets == [ZERO_TRIPLET] + [
        {"program": DOUBLE, "input": n, "output": o} for n, o in (("1", "2"), ("2", "4"))
    ]
    state.update([{"task_type": "abduction", "program": SORT, "input": "[1], 1", "output": "[1]"}])
    assert len(state.triplets) == 3 and state.triplets[0]["input"] == "1"  # the oldest went
    assert state.metrics() == {"buffer_size": 3.0}

    restored = CodeTaskState()
    restored.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert restored.triplets == state.triplets
    for bad in (
        {},
        {"triplets": []},
        {"triplets": [{"program": 1, "input": "", "output": ""}]},
        {"triplets": [{**ZERO_TRIPLET, "extra": "x"}]},
        [],
    ):
        with pytest.raises(ValueError, match="malformed"):
            CodeTaskState().load_state_dict(bad)


def test_bad_state_config_names_the_field():
    for kwargs, field in (
        ({"num_references": 0}, "num_references"),
        ({"min_pairs": 1}, "min_pairs"),
        ({"num_inputs": 3, "min_pairs": 4}, "min_pairs"),
    ):
        with pytest.raises(ValueError, match=field):
            CodeTaskState(**kwargs)
