"""Tests for `trl_ext.rewards`: hand-computed values, thread safety, adversarial inputs and fuzzing."""

import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_ext.rewards import (
    accuracy_reward,
    brier_reward,
    completion_text,
    extract_tag,
    format_reward,
    is_missing,
    make_accuracy_reward,
    make_brier_reward,
    make_confidence_format_reward,
    make_format_reward,
    normalize_answer,
    parse_confidence,
    verify_answer,
    verify_answers,
    verify_answers_counted,
)
from trl_ext.rewards import verify as verify_module


confidence_format_reward = make_confidence_format_reward()


def _call(func, completions, **columns):
    """Call a reward function the way TRL does (prompts, completions, completion_ids, **columns)."""
    return func(prompts=["prompt"] * len(completions), completions=completions, completion_ids=None, **columns)


def _in_thread(func, *args):
    """Run `func(*args)` on a worker thread; return its result, re-raising anything it raised."""
    box = {}

    def target():
        try:
            box["result"] = func(*args)
        except BaseException as error:  # handed back to the test
            box["error"] = error

    thread = threading.Thread(target=target, daemon=True)  # a hung thread must not keep pytest from exiting
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "worker thread did not finish"
    if "error" in box:
        raise box["error"]
    return box["result"]


# ----------------------------------------------------------------------------------------------------------------
# parse_confidence


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.85", 0.85),
        (".85", 0.85),
        ("1", 1.0),
        ("0", 0.0),
        ("1.0", 1.0),
        ("0.", 0.0),
        ("85%", 0.85),
        ("85.5 %", 0.855),
        ("100%", 1.0),
        ("0%", 0.0),
        ("  0.3 \n", 0.3),
        ("1.5", None),
        ("150%", None),
        ("100.1%", None),
        ("-0.1", None),
        ("-0", None),
        ("+0.5", None),
        ("nan", None),
        ("NaN", None),
        ("inf", None),
        ("-inf", None),
        ("Infinity", None),
        ("1e400", None),
        ("1e-1", None),
        ("abc", None),
        ("0.8 or 0.9", None),
        ("high", None),
        ("", None),
        ("   ", None),
        ("%", None),
        (".", None),
        ("0.5.5", None),
        ("85%%", None),
        ("٠.٥", None),  # non-ASCII digits, which float() would accept
        ("0." + "0" * 1000 + "1", None),  # absurdly long
        (None, None),
        (0.5, None),
    ],
)
def test_parse_confidence(text, expected):
    result = parse_confidence(text)
    if expected is None:
        assert result is None
    else:
        assert isinstance(result, float)
        assert result == pytest.approx(expected)


# ----------------------------------------------------------------------------------------------------------------
# extract_tag / completion_text / normalize_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>42</answer>", "42"),
        ("<answer> 42 \n</answer>", "42"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("<answer>\nmulti\nline\n</answer>", "multi\nline"),
        ("<answer></answer>", ""),
        ("<answer>1</answer><answer>2", "1"),  # trailing unclosed tag is not a pair
        ("<answer>x <answer>5</answer>", "5"),  # stray opening tag before a complete pair
        ("<answer>x<answer>5</answer></answer>", "5"),  # nested: the innermost pair
        ("<answer>42", None),
        ("42</answer>", None),
        ("</answer>42<answer>", None),
        ("<Answer>42</Answer>", None),
        ("no tags at all", None),
        ("", None),
        (None, None),
    ],
)
def test_extract_tag(text, expected):
    assert extract_tag(text, "answer") == expected


# Bounds on hangs and quadratic blow-ups, not on speed (generous for a loaded 2-core machine): the linear code takes
# milliseconds where the quadratic one took tens of seconds.
QUADRATIC_S = 5.0
# A stuck verifier is cut off at its timeout; a fresh worker (a spawned process importing math_verify) may follow.
RESTART_S = 10.0


def test_normalize_answer_is_linear_in_boxed_depth():
    # Peeling one layer per pass rescanned the rest each time: 4,000 layers took 3.6 s, 20,000 would take ~90 s.
    depth = 20_000
    start = time.perf_counter()
    assert normalize_answer("\\boxed{" * depth + "7" + "}" * depth) == "7"
    assert normalize_answer("$\\boxed{" * depth + "7" + "}$" * depth) == "7"
    assert time.perf_counter() - start < QUADRATIC_S


def test_extract_tag_is_linear_on_many_unclosed_tags():
    text = "<answer>" * 20_000 + "</answer>"
    start = time.perf_counter()
    assert extract_tag(text, "answer") == ""
    assert extract_tag("<answer>1" * 20_000, "answer") is None  # a lazy-regex scan took 16 s here
    assert time.perf_counter() - start < QUADRATIC_S


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("plain", "plain"),
        ([{"role": "assistant", "content": "hi"}], "hi"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "last"}], "last"),
        ([{"role": "assistant", "content": None}], ""),
        ([{"role": "assistant"}], ""),
        ([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "ab"),
        ({"role": "assistant", "content": "single message"}, "single message"),
        ([], ""),
        (None, ""),
        (42, ""),
        ([None], ""),
    ],
)
def test_completion_text(completion, expected):
    assert completion_text(completion) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Paris  ", "paris"),
        ("$5$", "5"),
        ("$$5$$", "5"),
        ("\\boxed{5}", "5"),
        ("$\\boxed{x + 1}$", "x + 1"),
        ("\\boxed{1}+\\boxed{2}", "\\boxed{1}+\\boxed{2}"),
        ("\\boxed{\\boxed{ $\\boxed{7}$. }}", "7"),  # wrappers peeled in any order and nesting
        ("\\boxed{{1}+{2}}", "{1}+{2}"),
        ("\\boxed{1}}", "\\boxed{1}}"),
        ("}\\boxed{1}", "}\\boxed{1}"),
        ("\\boxed{\\boxed{1}", "\\boxed{\\boxed{1}"),
        ("$", "$"),
        ("42.", "42"),
        ("1,000", "1000"),
        ("1,234,567.50", "1234567.5"),
        ("1,2", "1,2"),
        ("3.0", "3"),
        ("0.50", "0.5"),
        ("-0.0", "0"),
        ("+7", "7"),
        ("100", "100"),
        ("New   York\n City", "new york city"),
        ("1e400", "1e400"),
        ("9" * 5000, "9" * 5000),
        ("", ""),
        (None, ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


# ----------------------------------------------------------------------------------------------------------------
# verify_answer

VERIFY_CASES = [
    ("42", "42", True),
    ("42", "43", False),
    ("0.5", "1/2", True),
    ("\\frac{1}{2}", "0.5", True),
    ("0.5", "\\frac{1}{2}", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("x^2+1", "1+x^2", True),
    ("1000", "1,000", True),
    ("3", "3.0", True),
    ("5", "\\boxed{5}", True),
    ("81", "9**2", True),
    ("9", "9**2", False),
    ("2", "2^{100000}", False),
    ("42", "42 or 43", False),
    ("(1, 2)", "(1,2)", True),
    ("2^{2023}", "2^{2023}", True),
    ("\\binom{5}{2}", "10", True),
    ("5!", "120", True),
    ("The answer is \\boxed{7}", "7", True),
    ("Paris", "paris", True),
    ("Paris", "London", False),
    ("42", "", False),
    ("", "", False),
    (42, "42", True),
]


@pytest.mark.parametrize(("gold", "prediction", "expected"), VERIFY_CASES)
def test_verify_answer(gold, prediction, expected):
    assert verify_answer(gold, prediction) is expected


def test_verify_answer_off_main_thread():
    # math_verify's timeouts use signal.alarm, which raises off the main thread unless disabled.
    results = _in_thread(lambda: [verify_answer(gold, pred) for gold, pred, _ in VERIFY_CASES])
    assert results == [expected for _, _, expected in VERIFY_CASES]


ADVERSARIAL = [
    "9**9**9**9",
    "10^10^10^10",
    "10^{10^{10^{10}}}",
    "2^{2^{2^{2^{2}}}}",
    "10^{-10^{10}}",
    "\\sqrt{2}^{10^{9}}",
    "x^{10^{10}}",
    "e^{10^{10}}",
    "(10^{10})!",
    "1000000000!",
    "\\binom{1000000000}{500000000}",
    "\\Gamma(1000000000)",
    "\\gcd(10^{10^{10}}, 5)",
    "\\operatorname{zeros}(100000, 100000)",
    "\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{1000000000}",
    "\\sum_{i=1}^{10^9} i",
    "(x+y+z+w)^{60}",
    "\\tan(\\tan(\\tan(\\tan(\\tan(\\tan(1))))))",
    "1E999999999",
    "(" * 500 + "1" + ")" * 500,
    "{" * 1000 + "}" * 1000,
    "1+" * 999 + "1",
    "\\frac{" * 300,
    "|1|" * 12,
    "\\left|1\\right|" * 20,
    "(1," * 160,
    "x^{2}" * 100,
    "9" * 100_000,
    "<answer>" * 10_000,
]


# Pairs that are harmless separately but make sympy's `simplify` run for minutes (or forever) together, or that
# sympy evaluates while parsing.
ADVERSARIAL_PAIRS = [
    ("\\log(5+e)", "1000000"),
    ("2\\log(2)+1", "9144344"),
    ("10", "\\sin(128x)"),
    ("10", "\\cos^{n}(\\frac{\\lfloor {20}^{18} \\rfloor}{\\log((16)(15))})"),
    ("7", "\\sin(x+1)^{60}"),
    ("7", "\\sin((x+1)^{4})"),
    ("7", "\\sin(a+b+c+d+f+g+h)"),
    ("7", "\\sin(x+y+1)\\cos(x+y+1)\\tan(x+y+1)\\sin(2x+y+1)"),
    ("7", "\\sin(\\binom{e}{9})"),
    ("42", "\\binom{18\\cdot 5}{\\sin(14)}"),
    ("7", "e^{\\sin(9^{9^{9}})}"),
    ("7", "e^{\\cos(99999!)}"),
    ("7", "e^{10+\\cos^{\\arctan(4)}(({20}^{65} e^{1e203}!)(\\ln(7)))}"),
    ("12", "\\frac{8}{4465270} \\log(18)"),
    ("\\pi+\\sin(428805682394039)", "461697517868.352199^{9}^{7}"),
    ("x=3", "[\\log(|\\tan(9)|)+5, \\log((483267)!))"),
    ("x^2+1", "(\\exp(6848846333\\cdot 41.624), \\lfloor (10)^{95.229} \\rfloor)"),
]


@pytest.fixture
def short_timeout(monkeypatch):
    """A short verifier timeout, so that tests of inputs that hit it stay fast."""
    monkeypatch.setattr(verify_module, "VERIFY_TIMEOUT_S", 0.2)
    return verify_module.VERIFY_TIMEOUT_S


@pytest.mark.parametrize(
    "on_main_thread",
    # the main-thread run tries every case (about 17 s), the worker-thread run a sample (4 s, each case waiting for
    # the timeout); the fast loop keeps test_hostile_answers_share_one_batch_deadline
    [pytest.param(True, marks=pytest.mark.slow), pytest.param(False, marks=pytest.mark.slow)],
    ids=["main-thread", "worker-thread"],
)
def test_adversarial_answers_finish_fast(on_main_thread, short_timeout):
    # Each call may spend the timeout, and the next one may have to start a fresh worker after a kill.
    bound = short_timeout + RESTART_S

    cases = [("42", text) for text in ADVERSARIAL] + ADVERSARIAL_PAIRS
    if not on_main_thread:
        # The parent's side does not depend on the thread (no signals there): a sample, with a kill, is enough.
        cases = cases[:3] + [("42", "1E999999999")] + ADVERSARIAL_PAIRS[-3:]

    def check_all():
        durations = {}
        for gold, text in cases:
            reply = f"<think>x</think><answer>{text}</answer>"
            for expected, func, args, kwargs in (
                (False, verify_answer, (gold, text), {}),
                (False, verify_answer, (text, gold), {}),
                ([0.0], _call, (accuracy_reward, [reply]), {"solution": [gold]}),
            ):
                start = time.perf_counter()
                assert func(*args, **kwargs) == expected
                durations[text[:40]] = max(durations.get(text[:40], 0.0), time.perf_counter() - start)
        return durations

    durations = check_all() if on_main_thread else _in_thread(check_all)
    slow = {text: round(seconds, 2) for text, seconds in durations.items() if seconds > bound}
    assert not slow


def _worker_pid():
    verify_answer("1/2", "0.5")  # starts the worker if needed
    return verify_module._worker.process.pid


def _is_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_uninterruptible_input_is_killed_within_timeout(monkeypatch):
    # sympy turns 1E999999999 into an exact rational in one big-integer operation that SIGALRM cannot interrupt,
    # so only the hard timeout ends it.
    monkeypatch.setattr(verify_module, "VERIFY_TIMEOUT_S", 1.0)
    pid = _worker_pid()
    start = time.perf_counter()
    assert verify_answer("42", "1E999999999") is False
    assert time.perf_counter() - start < 1.0 + RESTART_S
    assert not _is_alive(pid)
    assert verify_answer("1/2", "0.5") is True
    assert verify_module._worker.process.pid != pid


def test_hung_worker_is_killed_and_replaced(short_timeout):
    pid = _worker_pid()
    os.kill(pid, signal.SIGSTOP)  # the worker stops answering, as in a runaway computation
    start = time.perf_counter()
    assert verify_answer("1/2", "0.5") is False  # not verified in time; exact match fails too
    assert time.perf_counter() - start < short_timeout + RESTART_S
    assert not _is_alive(pid)
    assert verify_answer("2", "2") is True  # exact match needs no worker
    assert verify_module._worker is None
    assert verify_answer("1/2", "0.5") is True
    assert verify_module._worker.process.pid != pid


def test_crashed_worker_is_replaced():
    pid = _worker_pid()
    os.kill(pid, signal.SIGKILL)  # as a segfault or the memory limit would
    verify_module._worker.process.wait()
    assert verify_answer("\\frac{1}{2}", "0.5") is True
    assert verify_module._worker.process.pid != pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_worker_memory_is_limited():
    with open(f"/proc/{_worker_pid()}/limits") as limits:
        address_space = next(line for line in limits if line.startswith("Max address space")).split()
    assert int(address_space[3]) == verify_module.VERIFY_MEMORY_BYTES


def _verify_in_child(queue):
    queue.put((verify_answer("1/2", "0.5"), verify_module._worker.process.pid))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_verify_answer_in_forked_child():
    parent_pid = _worker_pid()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_verify_in_child, args=(queue,))
    child.start()
    result, child_worker_pid = queue.get(timeout=60)
    child.join(timeout=60)
    assert result is True
    assert child_worker_pid != parent_pid  # the child started its own worker instead of sharing the parent's
    assert _is_alive(parent_pid)
    assert verify_answer("1/2", "0.5") is True
    assert verify_module._worker.process.pid == parent_pid


def test_verify_answer_from_concurrent_threads():
    # Requests from several threads share one worker; each must get its own answers back.
    cases = [("1/2", "0.5", True), ("\\frac{1}{3}", "0.5", False), ("x^2+1", "1+x^2", True), ("2", "3", False)]
    expected = [result for _, _, result in cases] * 10

    def check():
        return [verify_answer(gold, prediction) for gold, prediction, _ in cases * 10]

    threads_results = []
    threads = [threading.Thread(target=lambda: threads_results.append(check())) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert threads_results == [expected] * 6


def test_interrupted_call_leaves_no_stale_answers(monkeypatch):
    _worker_pid()

    def interrupted(self, timeout_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_module._Worker, "read_result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        verify_answers([("1/2", "0.5"), ("1", "2")])
    monkeypatch.undo()
    # The interrupted request's answers (True, False) must not be taken for this one's.
    assert verify_answers([("1", "2"), ("1/2", "0.5")]) == [False, True]


def test_verify_answers_batch(monkeypatch):
    monkeypatch.setattr(verify_module, "VERIFY_TIMEOUT_S", 1.0)
    pairs = [(gold, prediction) for gold, prediction, _ in VERIFY_CASES]
    assert verify_answers(pairs) == [expected for _, _, expected in VERIFY_CASES]
    # A pair that kills the worker only costs its own verdict: the rest of the batch goes to a fresh worker.
    assert verify_answers([("1/2", "0.5"), ("42", "1E999999999"), ("\\frac{1}{2}", "0.5"), ("1", "2")]) == [
        True,
        False,
        True,
        False,
    ]
    assert verify_answers([]) == []


def test_hostile_answers_share_one_batch_deadline(monkeypatch):
    # Each of these runs past the first round's budget (0.2 s here): 24 in a row would take 5 s; the batch stops at
    # its 2 s deadline (the bound on the time is generous for a loaded machine). The cheap pairs are decided first,
    # whatever their place in the batch; pairs reached after the deadline are not verified (None) and counted.
    monkeypatch.setattr(verify_module, "VERIFY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(verify_module, "VERIFY_QUICK_S", 0.2)
    monkeypatch.setattr(verify_module, "VERIFY_BATCH_TIMEOUT_S", 2.0)
    verify_answer("1/2", "0.5")  # a started worker
    pid = verify_module._worker.process.pid
    hostile = [
        pair
        for i in range(6)
        for pair in (
            (f"\\log({5 + i}+e)", "1000000"),
            (f"{10 + i}", "\\sin(128x)"),
            (f"{7 + i}", "\\sin(x+1)^{60}"),
            (f"{42 + i}", "(x+y+z+w)^{60}"),
        )
    ]
    pairs = [("1/2", "0.5"), *hostile, ("3", "3"), ("1/4", "0.25")]
    start = time.perf_counter()
    verdicts, unverified = verify_answers_counted(pairs)
    elapsed = time.perf_counter() - start
    assert verdicts[0] is True and verdicts[-2:] == [True, True]  # the last one too: cheap pairs go first
    assert set(verdicts[1:-2]) == {None} and unverified == 24  # no hostile pair got its whole budget
    assert elapsed < 2.0 + 6.0
    assert verify_module._worker.process.pid == pid  # skipping needs no kill
    assert verify_answer("1/4", "0.25") is True  # the next batch has its own deadline

    logged = []
    rewards = _call(
        accuracy_reward,
        [f"<answer>{p}</answer>" for _, p in hostile[:8]],
        solution=[g for g, _ in hostile[:8]],
        log_metric=lambda name, value: logged.append((name, value)),
    )
    (rate,) = [value for name, value in logged if name == "accuracy/unverified_rate"]
    assert rate == rewards.count(None) / 8 and rate >= 0.5  # at most 3 whole budgets fit after the first round
    assert set(rewards) <= {0.0, None}


@pytest.mark.parametrize("distinct", [False, True], ids=["same-hostile-answer", "distinct-hostile-answers"])
def test_hostile_answers_do_not_starve_correct_ones(monkeypatch, distinct):
    # Fails on main (issue 35, item 7): three `9**9**9**9` answers ahead of two correct `0.5` answers spent the
    # batch's deadline one whole budget after another, and the correct ones scored 0.0 (exact match), but 1.0 when
    # the batch came in another order. Now cheap pairs go first and the verdicts do not depend on the order.
    monkeypatch.setattr(verify_module, "VERIFY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(verify_module, "VERIFY_QUICK_S", 0.2, raising=False)  # new in issue 35
    monkeypatch.setattr(verify_module, "VERIFY_BATCH_TIMEOUT_S", 2.0)
    verify_answer("1/2", "0.5")  # a started worker
    hostile = ["9**9**9**9", "9**9**9**8", "8**9**9**9"] if distinct else ["9**9**9**9"] * 3
    answers = hostile + ["0.5", "0.5"]
    gold = "\\frac{1}{2}"
    for order in ([0, 1, 2, 3, 4], [3, 4, 0, 1, 2], [0, 3, 1, 4, 2]):
        logged = {}
        rewards = _call(
            accuracy_reward,
            [f"<answer>{answers[i]}</answer>" for i in order],
            solution=[gold] * 5,
            log_metric=logged.__setitem__,
        )
        by_answer = {i: reward for i, reward in zip(order, rewards)}
        assert by_answer[3] == by_answer[4] == 1.0
        assert {by_answer[i] for i in range(3)} <= {0.0, None}
        if not distinct:  # one distinct hostile pair: a short and a whole budget fit in the deadline
            assert [by_answer[i] for i in range(3)] == [0.0] * 3
        assert logged["accuracy/unverified_rate"] == rewards.count(None) / 5


# ----------------------------------------------------------------------------------------------------------------
# accuracy


def test_reward_function_names():
    assert accuracy_reward.__name__ == "accuracy"
    assert brier_reward.__name__ == "brier"
    assert format_reward.__name__ == "format"
    assert confidence_format_reward.__name__ == "confidence_format"
    assert make_accuracy_reward(answer_tag="final").__name__ == "accuracy"


def test_accuracy_reward_values():
    completions = [
        "<think>x</think><answer>42</answer>",
        "<think>x</think><answer>42</answer>",
        "<think>x</think><answer>0.5</answer>",
        "<think>x</think> the answer is 42",
        "<think>x</think><answer>  </answer>",
        "<answer>41</answer> wait, no: <answer>42</answer>",
        "",
    ]
    golds = ["42", "43", "\\frac{1}{2}", "42", "42", "42", "42"]
    assert _call(accuracy_reward, completions, solution=golds) == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_accuracy_reward_conversational_and_non_string_gold():
    completions = [
        [{"role": "assistant", "content": "<think>x</think><answer>42</answer>"}],
        [{"role": "assistant", "content": None}],
        [{"role": "user", "content": "<answer>42</answer>"}, {"role": "assistant", "content": "no tag"}],
    ]
    assert _call(accuracy_reward, completions, solution=[42, 42, 42]) == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("gold", [None, "", "   \n", float("nan")], ids=["None", "empty", "blank", "nan"])
def test_accuracy_reward_without_gold_is_not_applicable(gold):
    # A row without a usable gold answer is never scored as wrong (nor right: "None" is no answer): None, which TRL
    # leaves out of the group baselines, and a counted metric.
    logged = []
    completions = ["<answer>42</answer>", "<answer>None</answer>", "<answer>nan</answer>", "<answer>7</answer>"]
    rewards = _call(
        accuracy_reward,
        completions,
        solution=[gold, gold, gold, "7"],
        log_metric=lambda name, value: logged.append((name, value)),
    )
    assert rewards == [None, None, None, 1.0]
    assert ("accuracy/missing_gold_rate", 0.75) in logged


def test_is_missing():
    assert all(map(is_missing, [None, "", " \t", float("nan"), np.float32("nan")]))
    assert not any(map(is_missing, ["0", 0, 0.0, False, "None", "nan"]))


def test_accuracy_reward_custom_tag_column_and_func():
    reward = make_accuracy_reward(answer_tag="final", solution_column="gold", accuracy_func=lambda g, p: g == p[::-1])
    assert _call(reward, ["<final>cba</final>", "<answer>cba</answer>"], gold=["abc", "abc"]) == [1.0, 0.0]


def test_accuracy_func_that_raises_is_logged_once_and_counted(caplog):
    calls = []

    def broken(gold, prediction):
        calls.append(prediction)
        if prediction == "2":
            raise RuntimeError("boom")
        return gold == prediction

    reward = make_accuracy_reward(accuracy_func=broken)
    logged = []
    completions = ["<answer>1</answer>", "<answer>2</answer>", "<answer>2</answer>", "no answer"]
    with caplog.at_level(logging.ERROR, logger="trl_ext.rewards.user_calls"):
        for _ in range(2):
            rewards = _call(
                reward, completions, solution=["1"] * 4, log_metric=lambda name, value: logged.append((name, value))
            )
            assert rewards == [1.0, None, None, 0.0]  # raised: not judged, not wrong
    assert len(calls) == 6
    errors = [
        r
        for r in caplog.records
        if r.getMessage().startswith(f"accuracy_func ({broken.__module__}.{broken.__qualname__}) raised")
    ]  # its role and its own name
    assert len(errors) == 1 and "RuntimeError: boom" in caplog.text  # the first traceback, once
    assert logged.count(("errors/accuracy_func_rate", 0.5)) == 2


def test_accuracy_reward_missing_column_raises():
    with pytest.raises(ValueError, match="solution"):
        _call(accuracy_reward, ["<answer>42</answer>"], answer=["42"])
    with pytest.raises(ValueError, match="my_gold"):
        _call(make_accuracy_reward(solution_column="my_gold"), ["<answer>42</answer>"], solution=["42"])


# ----------------------------------------------------------------------------------------------------------------
# brier


def test_brier_reward_values():
    completions = [
        "<confidence>0.8</confidence>",
        "<confidence>0.8</confidence>",
        "<confidence>80%</confidence>",
        "<confidence>1</confidence>",
        "<confidence>0</confidence>",
        "<confidence>very sure</confidence>",
        "<confidence>1.5</confidence>",
        "no confidence",
        [{"role": "assistant", "content": "<analysis>ok</analysis><confidence>0.5</confidence>"}],
    ]
    labels = [1, 0, True, 1, 1, 1, 0, 1, 0.0]
    expected = [0.96, 0.36, 0.96, 1.0, 0.0, 0.0, 0.0, 0.0, 0.75]
    assert _call(brier_reward, completions, answer_correct=labels) == pytest.approx(expected)


def test_brier_reward_without_label_is_not_applicable():
    # An answer that could not be judged (no gold) gives its confidences no Brier reward, not even a perfect one.
    completions = ["<confidence>1</confidence>", "<confidence>0</confidence>", "<confidence>1</confidence>"]
    assert _call(brier_reward, completions, answer_correct=[None, float("nan"), 1]) == [None, None, 1.0]


def test_brier_reward_uses_last_confidence_and_custom_names():
    reward = make_brier_reward(confidence_tag="conf", label_column="ok")
    assert _call(reward, ["<conf>0.1</conf> <conf>0.9</conf>"], ok=[False]) == pytest.approx([1 - 0.81])


def test_brier_reward_configuration_errors():
    with pytest.raises(ValueError, match="answer_correct"):
        _call(brier_reward, ["<confidence>0.5</confidence>"], solution=["1"])
    with pytest.raises(ValueError, match="answer_correct"):
        _call(brier_reward, ["<confidence>0.5</confidence>"], answer_correct=["yes"])
    with pytest.raises(ValueError, match="answer_correct"):
        _call(brier_reward, ["<confidence>0.5</confidence>"], answer_correct=[2])


# ----------------------------------------------------------------------------------------------------------------
# format / confidence_format


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>reasoning</think><answer>42</answer>", 1.0),
        ("  <think>a\nb</think>\n\n<answer> 42 </answer>\n", 1.0),
        ("<think></think><answer>42</answer>", 1.0),
        ("<think>x</think><answer></answer>", 0.0),
        ("<think>x</think><answer> </answer>", 0.0),
        ("<answer>42</answer><think>x</think>", 0.0),
        ("<think>x</think>text<answer>42</answer>", 0.0),
        ("<think>x</think><answer>42</answer> trailing", 0.0),
        ("leading <think>x</think><answer>42</answer>", 0.0),
        ("<think>x</think><answer>4</answer><answer>2</answer>", 0.0),
        ("<think>x<think>y</think><answer>42</answer>", 0.0),
        ("<think>x</think><answer>42", 0.0),
        ("<answer>42</answer>", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert _call(format_reward, [text]) == [expected]
    assert _call(format_reward, [[{"role": "assistant", "content": text}]]) == [expected]


def test_format_reward_custom_tags():
    reward = make_format_reward(think_tag="reasoning", answer_tag="final")
    assert _call(reward, ["<reasoning>r</reasoning><final>1</final>", "<think>r</think><answer>1</answer>"]) == [
        1.0,
        0.0,
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<confidence>0.7</confidence>", 1.0),
        ("<analysis>sure</analysis>\n<confidence>70%</confidence>", 1.0),
        ("<think>t</think><answer>1</answer><analysis>a</analysis><confidence>0.7</confidence>", 1.0),
        ("<confidence>high</confidence>", 0.0),
        ("<confidence>1.5</confidence>", 0.0),
        ("<confidence></confidence>", 0.0),
        ("<analysis>a</analysis><confidence>0.7</confidence> trailing", 0.0),
        ("<confidence>0.7</confidence><analysis>a</analysis>", 0.0),
        ("<analysis>a</analysis> gap <confidence>0.7</confidence>", 0.0),
        ("<analysis>a</analysis><analysis>b</analysis><confidence>0.7</confidence>", 0.0),
        ("<confidence>0.1</confidence><confidence>0.7</confidence>", 0.0),
        ("<analysis>a<confidence>0.7</confidence>", 0.0),
        ("", 0.0),
    ],
)
def test_confidence_format_reward(text, expected):
    assert _call(confidence_format_reward, [text]) == [expected]


# ----------------------------------------------------------------------------------------------------------------
# fuzzing: nothing a model writes makes a reward raise or leave [0, 1]

FRAGMENTS = [
    "<answer>", "</answer>", "<think>", "</think>", "<confidence>", "</confidence>", "<analysis>", "</analysis>",
    "%", ".", "0", "1", "5", "9", "85", "nan", "inf", "-", "e", "^", "**", "{", "}", "\\frac", "\\boxed{", "$", " ",
    "\n", "\ufffd", "\x00", "1e400", "9" * 50,
]  # fmt: skip
MATH_FRAGMENTS = [
    "\\frac{", "}{", "}", "{", "^", "_", "\\sqrt", "(", ")", "[", "]", "|", "\\sin", "\\cos", "\\log", "\\ln", "e",
    "x", "!", "\\binom", "\\pi", "\\infty", "+", "-", "*", "**", "/", ",", "=", "%", "\\%", "$", "\\boxed{", "\\cdot",
    "0", "1", "2", "9", "42", "99999", "1e400", ".", " ",
]  # fmt: skip
tagged_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=30).map("".join)
math_text = st.lists(st.sampled_from(MATH_FRAGMENTS), min_size=1, max_size=25).map("".join)
answered_text = math_text.map(lambda body: f"<think>t</think><answer>{body}</answer>")
any_text = st.text() | tagged_text | answered_text
completion = any_text | any_text.map(lambda text: [{"role": "assistant", "content": text}])
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_rewards(values, size):
    assert isinstance(values, list) and len(values) == size
    for value in values:
        assert isinstance(value, float) and 0.0 <= value <= 1.0 and not math.isnan(value)


@FUZZ
@given(st.one_of(any_text, st.none(), st.integers(), st.floats()))
def test_parse_confidence_fuzz(text):
    value = parse_confidence(text)
    assert value is None or (isinstance(value, float) and 0.0 <= value <= 1.0)


@FUZZ
@given(any_text)
def test_text_helpers_fuzz(text):
    assert isinstance(normalize_answer(text), str)
    assert isinstance(completion_text(text), str)
    for tag in ("answer", "confidence"):
        content = extract_tag(text, tag)
        assert content is None or (isinstance(content, str) and content in text)


@FUZZ
@given(st.lists(completion, min_size=1, max_size=3), st.data())
def test_cheap_rewards_fuzz(completions, data):
    labels = data.draw(st.lists(st.sampled_from([0, 1, True, False, 0.0, 1.0]), min_size=len(completions),
                                max_size=len(completions)))  # fmt: skip
    for func in (brier_reward, format_reward, confidence_format_reward):
        _check_rewards(_call(func, completions, answer_correct=labels), len(completions))


GOLDS = st.sampled_from(["42", "\\frac{1}{2}", "x^2+1", "(1, 2)", "Paris", "\\log(5+e)"]) | math_text | any_text


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(completion, GOLDS)
def test_accuracy_reward_fuzz(completion_value, gold):
    rewards = _call(accuracy_reward, [completion_value], solution=[gold])
    if is_missing(gold):
        assert rewards == [None]
    else:
        _check_rewards(rewards, 1)
    assert isinstance(verify_answer(gold, completion_text(completion_value)), bool)


# --- lenient extraction (opt-in, for models too small to follow the tag format) --------------------------------------

from trl_ext.rewards import extract_answer, extract_confidence  # noqa: E402


@pytest.mark.parametrize(
    "text, strict, lenient",
    [
        ("The answer is 7.", None, "7"),
        ("3 + 4 = 7\n\nDone", None, "7"),
        ("<answer>5</answer> and 9", "5", "5"),  # the tag wins
        ("no number", None, None),
        ("version2 x3", None, None),  # digits glued to letters are not numbers
        ("It is -7.", None, "-7"),  # the sign belongs to the number
        ("from 3-7", None, "7"),  # a hyphen after a digit is no sign
    ],
)
def test_extract_answer(text, strict, lenient):
    assert extract_answer(text, "answer") == strict
    assert extract_answer(text, "answer", lenient=True) == lenient


@pytest.mark.parametrize(
    "text, strict, lenient",
    [
        ("I am 70% sure", None, 0.7),
        ("It costs 30 cents; 0.4 likely", None, 0.4),  # 30 is no confidence, 0.4 is
        ("<confidence>0.2</confidence> 0.9", 0.2, 0.2),
        ("2.5 out of 10", None, None),
        ("confidence: -0.5", None, None),  # out of range, not 0.5
        ("-0.5 or 0.25", None, 0.25),
        ("60-70%", None, 0.7),  # a range, not a negative number
    ],
)
def test_extract_confidence(text, strict, lenient):
    assert extract_confidence(text, "confidence") == strict
    assert extract_confidence(text, "confidence", lenient=True) == (pytest.approx(lenient) if lenient else None)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_lenient_extraction_never_raises(text):
    answer = extract_answer(text, "answer", lenient=True)
    assert answer is None or isinstance(answer, str)
    confidence = extract_confidence(text, "confidence", lenient=True)
    assert confidence is None or 0.0 <= confidence <= 1.0
