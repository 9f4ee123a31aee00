"""The code family against the real sandbox: gold outputs, the determinism check, limits and hostile proposals and
answers, each task type's scoring by execution, and one self-play step."""

from pathlib import Path

from trl_ext.self_play.code_reasoning import ZERO_TRIPLET, CodeTaskState, code_reasoning_task, make_proposal_parser
from trl_ext.testing import ScriptedGeneration, load_script


ROOT = Path(__file__).parents[2]
SCRIPT = Path(__file__).parents[1] / "scripts" / "absolute_zero_code_ranks.py"
scenario = load_script(SCRIPT)

SORT = "def f(xs, k):\n    return sorted(xs)[:k]"
DOUBLE = "def f(n):\n    return n * 2"


def proposal(task_type, program=None, inputs=(), message=None, given=None):
    text = f"```python\n{program}\n```\n" if program else ""
    text += "".join(f"```input\n{i}\n```\n" for i in inputs) + (f"```message\n{message}\n```\n" if message else "")
    fields = make_proposal_parser()(text)
    return {**fields, "task_type": task_type, **({"program": given} if given else {})}


def test_validation_by_execution_contains_hostile_proposals(tmp_path):
    sentinel = ROOT / "SANDBOX_SENTINEL_CODE_TASKS"
    state = CodeTaskState(timeout_s=1.0, memory_mb=256)
    hostile = {
        "clock": "import time\ndef f(n):\n    return time.perf_counter_ns() + n",
        "loop": "def f(n):\n    while True:\n        n += 1",
        "memory": "def f(n):\n    return len(bytearray(10**10))",
        "write": f"def f(n):\n    open({str(sentinel)!r}, 'w').write('x')\n    return n",
        "fork": "import os\ndef f(n):\n    return os.fork()",
        "object": "def f(n):\n    return object()",
        "exit": "import os\ndef f(n):\n    os._exit(0)",
        "huge": "def f(n):\n    return list(range(10**6))",
        "print": "def f(n):\n    print('x' * 10**7)\n    return n",
    }
    questions = [
        proposal("deduction", SORT, ["[3, 1, 2], 2"]),
        proposal("abduction", DOUBLE, ["21"]),
        *(proposal("deduction", program, ["1"]) for program in hostile.values()),
        proposal("induction", None, ["1", "'ab'", "[1, 2]"], "doubles", given=DOUBLE),
    ]
    checked = state.validate(questions)
    assert checked[0] == {"task_type": "deduction", "program": SORT, "input": "[3, 1, 2], 2", "output": "[1, 2]"}
    assert checked[1]["output"] == "42"
    assert dict(zip(hostile, checked[2:-1])) == dict.fromkeys(hostile)  # all invalid
    assert checked[-1]["visible"] == [["1", "2"], ["'ab'", "'abab'"]] and checked[-1]["hidden"] == [
        ["[1, 2]", "[1, 2, 1, 2]"]
    ]
    # each single-call proposal also runs on two nearby inputs
    assert not sentinel.exists() and state.executions == 2 * (3 * (2 + len(hostile)) + 3)


def test_values_are_read_back_only_up_to_the_familys_cap():
    # The host parses what comes back: a long value costs it, not the snippet. The family's cap applies in the
    # sandbox, before any parsing.
    from trl_ext.self_play.code_reasoning.programs import MAX_OUTPUT_CHARS, call_snippet

    state = CodeTaskState(timeout_s=2.0)
    short, long = state.execute([call_snippet("def f(n):\n    return 'x' * n", (n,)) for n in (10, 5000)])
    assert short.ok and short.value == "x" * 10
    assert not long.ok and f"{MAX_OUTPUT_CHARS} characters" in long.error and long.value_repr is None


def score(task, question, answers):
    completions = [[{"role": "assistant", "content": a}] for a in answers]
    columns = {key: [question.get(key)] * len(answers) for key in question}
    return task.reward_funcs[0](None, completions, None, **columns)


def test_each_task_type_is_scored_by_execution():
    task = code_reasoning_task(timeout_s=1.0)
    deduction = {"task_type": "deduction", "program": SORT, "input": "[3, 1, 2], 2", "output": "[1, 2]"}
    assert score(task, deduction, ["```output\n[1, 2]\n```", "```output\n[2, 1]\n```"]) == [1.0, 0.0]
    abduction = {**deduction, "task_type": "abduction"}
    answers = ["```input\n[9, 2, 1], 2\n```", "```input\n[1], 2\n```", "```input\n__import__('os').getcwd()\n```"]
    assert score(task, abduction, answers) == [1.0, 0.0, 0.0]
    induction = {
        "task_type": "induction",
        "program": DOUBLE,
        "message": "m",
        "visible": [["1", "2"]],
        "hidden": [["'ab'", "'abab'"], ["[1]", "[1, 1]"]],
    }
    answers = [
        "```python\ndef f(x):\n    return x + x\n```",
        "```python\ndef f(x):\n    return x * 2 if isinstance(x, str) else 0\n```",  # one of two pairs
        "```python\ndef f(x):\n    while True:\n        pass\n```",  # hostile answers fail, nothing else
        "```python\nimport os\ndef f(x):\n    os.kill(os.getppid(), 9)\n```",
    ]
    assert score(task, induction, answers) == [1.0, 0.0, 0.0, 0.0]


def test_a_program_random_off_its_own_input_is_refused():
    # Fails on main (issue 35, item 3): deterministic on the proposer's own input and random elsewhere, it validated,
    # and abduction graded the solver's other inputs at random.
    state = CodeTaskState(timeout_s=2.0)
    sly = "import os\ndef f(x):\n    return 1 if x == 'Hello' else int.from_bytes(os.urandom(8), 'big')"
    assert state.validate([proposal("abduction", sly, ["'Hello'"])]) == [None]
    task = code_reasoning_task(timeout_s=2.0)
    question = {"task_type": "abduction", "program": sly, "input": "'Hello'", "output": "1"}
    answers = ["```input\n'other'\n```", "```input\n'Hello'\n```"]
    assert score(task, question, answers) == [None, 1.0]  # the other input cannot be graded; the proposer's can


def test_a_stateful_gold_program_solves_its_own_induction_task():
    # Fails on main (issue 21, item 7): the hidden pairs ran one after another in one namespace, while each pair was
    # made in a fresh process, so a program keeping state between calls failed its own task (score 0.0).
    task = code_reasoning_task(timeout_s=2.0)
    stateful = {
        "global": "calls = []\ndef f(x):\n    calls.append(x)\n    return len(calls) * x",
        "default": "def f(x, seen=[]):\n    seen.append(x)\n    return len(seen) * x",
        "attribute": "def f(x):\n    f.n = getattr(f, 'n', 0) + 1\n    return f.n * x",
    }
    for name, program in stateful.items():
        question = task.state.validate([proposal("induction", None, ["1", "2", "3", "4"], "m", given=program)])[0]
        assert question["hidden"] == [["3", "3"], ["4", "4"]], name  # each pair made in a fresh process
        answers = [f"```python\n{program}\n```", "```python\ndef f(x):\n    return x\n```"]
        assert score(task, question, answers) == [1.0, 1.0], name


def test_one_self_play_step_with_the_sandbox(tmp_path):
    trainer, task = scenario.make_trainer(tmp_path, executor="sandbox")
    with ScriptedGeneration(trainer, scenario.script):
        trainer.train()
    assert task.state.triplets == [
        ZERO_TRIPLET,
        {"program": SORT, "input": "[3, 1, 2], 2", "output": "[1, 2]"},
        {"program": DOUBLE, "input": "21", "output": "42"},
    ]
    log = trainer.state.log_history[0]
    assert [log[f"task/{t}/valid_rate"] for t in ("deduction", "abduction", "induction")] == [0.5] * 3
    assert log["solver/code_correct_mean"] == 0.5 and task.state.executions == 22 + 11
