"""Absolute Zero's code reasoning tasks: deduction (program + input -> output), abduction (program + output -> input)
and induction (input/output pairs + a message -> program), built from program triplets that the model proposes.

The proposer of a deduction or abduction task writes a program and an input, conditioned on `num_references`
triplets drawn from a buffer that starts with one trivial triplet (zero data) and grows with every valid proposal;
an induction proposer gets a program from the buffer and writes inputs and a hint. Gold outputs come from execution
in the sandbox (`trl_ext.sandbox`), twice per call: a proposal is valid when its program parses, defines `f`, runs
within the limits both times with equal results, and the result is a bounded Python literal. Solver answers are
checked by execution as well: deduction by value equality with the gold output, abduction by `f(predicted input) ==
output`, induction by the predicted program on held-out pairs. The parent process only reads values back with
`ast.literal_eval`; model-written code never runs outside the sandbox.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from datasets import Dataset

from ...core.model_text import neutralize_special_tokens
from ...rewards.parsing import completion_text
from ..base import TaskFamily, TaskState
from . import prompts
from .heldout import make_heldout_questions
from .programs import (
    MAX_MESSAGE_CHARS,
    MAX_OUTPUT_CHARS,
    RESULT_VAR,
    blocks_labeled,
    call_snippet,
    calls_snippet,
    check_program,
    derived_inputs,
    format_input,
    last_block,
    output_repr,
    parse_input,
    parse_value,
    same_outcome,
    values_equal,
)


TASK_TYPES = ("deduction", "abduction", "induction")
ZERO_TRIPLET = {"program": "def f(x):\n    return x", "input": "'Hello world'", "output": "'Hello world'"}
PROGRAM_LABELS = ("python", "py", "python3")

ExecuteMany = Callable[..., list]


class CodeTaskState(TaskState):
    """The triplet buffer and the executor of the code reasoning family (trainer state, see `TaskState`).

    Args:
        num_references: Buffer triplets shown to a deduction/abduction proposer.
        num_inputs: Inputs an induction proposer is asked for.
        min_pairs: Valid, distinct input/output pairs an induction proposal needs; the first half (rounded up) is
            shown to the solver, the rest held out to check its program.
        max_buffer_size: The buffer keeps the newest triplets beyond this size.
        timeout_s, memory_mb, max_workers: Limits of each sandboxed execution and the executor's concurrency.
        execute_many: The batched executor; defaults to `trl_ext.sandbox.execute_many` (tests pass a fake).
    """

    def __init__(
        self,
        num_references: int = 4,
        num_inputs: int = 6,
        min_pairs: int = 2,
        max_buffer_size: int = 4096,
        timeout_s: float = 5.0,
        memory_mb: int = 512,
        max_workers: int | None = None,
        execute_many: ExecuteMany | None = None,
    ):
        for name, value, low in (
            ("num_references", num_references, 1),
            ("num_inputs", num_inputs, 2),
            ("min_pairs", min_pairs, 2),
            ("max_buffer_size", max_buffer_size, 1),
        ):
            if value < low:
                raise ValueError(f"{name} must be at least {low} (got {value}).")
        if min_pairs > num_inputs:
            raise ValueError(f"min_pairs ({min_pairs}) cannot exceed num_inputs ({num_inputs}).")
        self.num_references, self.num_inputs, self.min_pairs = num_references, num_inputs, min_pairs
        self.max_buffer_size = max_buffer_size
        # Values are read back only up to the family's own cap on an output repr: the host parses them.
        self.limits = {"timeout_s": timeout_s, "memory_mb": memory_mb, "max_value_bytes": MAX_OUTPUT_CHARS}
        self.max_workers = max_workers
        self._execute_many = execute_many
        self.triplets: list[dict[str, str]] = [dict(ZERO_TRIPLET)]
        self.executions = 0  # on this process (each process runs only its share)

    # -- execution -----------------------------------------------------------------------------------------------
    def execute(self, snippets: list[str]) -> list:
        """Run `snippets` in the sandbox in one batch; results in order."""
        if not snippets:
            return []
        execute_many = self._execute_many
        if execute_many is None:
            from ...sandbox import execute_many
        results = execute_many(snippets, result_var=RESULT_VAR, max_workers=self.max_workers, **self.limits)
        if len(results) != len(snippets):
            raise RuntimeError(f"the executor returned {len(results)} results for {len(snippets)} snippets")
        self.executions += len(snippets)
        return results

    # -- TaskState -----------------------------------------------------------------------------------------------
    def proposer_prompt(self, seed_row: dict[str, Any], rng: random.Random):
        task_type = seed_row.get("task_type") or rng.choice(TASK_TYPES)
        if task_type not in TASK_TYPES:
            raise ValueError(f"seed row task_type {task_type!r} is not one of {TASK_TYPES}.")
        if task_type == "induction":
            program = rng.choice(self.triplets)["program"]
            content = prompts.PROPOSE_INPUTS.format(num_inputs=self.num_inputs, program=program)
            return [{"role": "user", "content": neutralize_special_tokens(content)}], {
                "task_type": task_type,
                "program": program,
            }
        references = rng.sample(self.triplets, min(self.num_references, len(self.triplets)))
        # The buffer's programs, inputs and outputs are model-written: their special-token strings become plain text.
        content = neutralize_special_tokens(prompts.propose_triplet(task_type, references))
        return [{"role": "user", "content": content}], {"task_type": task_type}

    def validate(self, questions: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """Complete each parsed proposal with its gold fields by executing it twice, or `None` when invalid.

        A deduction or abduction program also runs twice on up to two inputs near its own (`derived_inputs`) and is
        invalid unless both runs agree there too (failing twice counts as agreeing): a program that is deterministic
        on its own input only would otherwise pose an abduction task whose answers it grades at random.
        """
        plans, snippets = [], []
        for question in questions:
            plan = self._plan(question)
            plans.append(plan)
            if plan is not None:
                program, inputs, nearby = plan
                for args in (*inputs, *nearby):
                    snippets += [call_snippet(program, args)] * 2  # twice: the determinism check
        results = iter(self.execute(snippets))
        validated = []
        for question, plan in zip(questions, plans, strict=True):
            if plan is None:
                validated.append(None)
                continue
            program, inputs, nearby = plan
            outputs = []
            for _ in inputs:
                first, second = next(results), next(results)
                gold = output_repr(first)
                deterministic = (
                    gold is not None and output_repr(second) is not None and values_equal(first.value, second.value)
                )
                outputs.append(gold if deterministic else None)
            agree = [same_outcome(next(results), next(results)) for _ in nearby]
            validated.append(self._complete(question, program, inputs, outputs) if all(agree) else None)
        return validated

    def _plan(self, question: dict[str, Any]) -> tuple[str, list[tuple], list[tuple]] | None:
        """The program, the inputs to execute for a proposal and the nearby inputs to check it on, or `None` if it is
        invalid without running it."""
        task_type, program = question.get("task_type"), check_program(question.get("program"))
        inputs = question.get("inputs") if isinstance(question.get("inputs"), list) else []
        if program is None or task_type not in TASK_TYPES:
            return None
        if task_type != "induction":
            args = parse_input(inputs[-1]) if inputs else None
            return None if args is None else (program, [args], derived_inputs(args))
        message = question.get("message")
        if not isinstance(message, str) or not message.strip() or len(message) > MAX_MESSAGE_CHARS:
            return None
        distinct = {}
        for text in inputs:
            args = parse_input(text)
            if args is not None:
                distinct.setdefault(repr(args), args)
        chosen = list(distinct.values())[: self.num_inputs]
        return (program, chosen, []) if len(chosen) >= self.min_pairs else None

    def _complete(self, question, program, inputs, outputs) -> dict[str, Any] | None:
        task_type = question["task_type"]
        if task_type != "induction":
            if outputs[0] is None:
                return None
            return {"task_type": task_type, "program": program, "input": format_input(inputs[0]), "output": outputs[0]}
        pairs = [[format_input(args), out] for args, out in zip(inputs, outputs, strict=True) if out is not None]
        if len(pairs) < self.min_pairs:
            return None
        shown = (len(pairs) + 1) // 2
        return {
            "task_type": task_type,
            "program": program,
            "message": question["message"].strip(),
            "visible": pairs[:shown],
            "hidden": pairs[shown:],
        }

    def update(self, questions: list[dict[str, Any]]) -> None:
        """Add the valid deduction and abduction triplets not yet in the buffer (induction reuses buffer programs)."""
        known = {(t["program"], t["input"]) for t in self.triplets}
        for q in questions:
            if q.get("task_type") in ("deduction", "abduction") and (q["program"], q["input"]) not in known:
                known.add((q["program"], q["input"]))
                self.triplets.append({"program": q["program"], "input": q["input"], "output": q["output"]})
        del self.triplets[: max(0, len(self.triplets) - self.max_buffer_size)]

    def state_dict(self) -> dict[str, Any]:
        return {"triplets": [dict(t) for t in self.triplets]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        triplets = state.get("triplets") if isinstance(state, dict) else None
        keys = set(ZERO_TRIPLET)
        if (
            not isinstance(triplets, list)
            or not triplets
            or not all(
                isinstance(t, dict) and set(t) == keys and all(isinstance(v, str) for v in t.values())
                for t in triplets
            )
        ):
            raise ValueError(
                "code task state must be {'triplets': [{'program': str, 'input': str, 'output': str}, ...]} with at "
                "least one triplet; the checkpoint's task state is malformed."
            )
        self.triplets = [dict(t) for t in triplets]

    def metrics(self) -> dict[str, float]:
        return {"buffer_size": float(len(self.triplets))}


def make_proposal_parser(lenient: bool = False):
    """`parse_question` for code proposals: the last ```python block as `program`, every ```input block as `inputs`,
    the last ```message block as `message`. The trainer merges the proposer prompt's context (`task_type`, and the
    given program for induction) over these fields; `CodeTaskState.validate` decides validity by execution."""
    labels = PROGRAM_LABELS + (("",) if lenient else ())

    def parse_proposal(text: str) -> dict[str, Any] | None:
        fields = {
            "program": last_block(text, *labels),
            "inputs": blocks_labeled(text, "input"),
            "message": last_block(text, "message"),
        }
        return fields if fields["program"] is not None or fields["inputs"] else None

    return parse_proposal


def solver_prompt(question: dict[str, Any], row: dict[str, Any]) -> list[dict[str, str]]:
    task_type = question.get("task_type")
    if task_type == "deduction":
        content = prompts.SOLVE_DEDUCTION.format(program=question["program"], input=question["input"])
    elif task_type == "abduction":
        content = prompts.SOLVE_ABDUCTION.format(program=question["program"], output=question["output"])
    else:
        content = prompts.SOLVE_INDUCTION.format(
            pairs=prompts.pairs_text(question["visible"]), message=question["message"]
        )
    # Programs, inputs, outputs and the hint are model-written: their special-token strings become plain text.
    return [{"role": "user", "content": neutralize_special_tokens(content)}]


def _column(kwargs, name, n):
    values = kwargs.get(name)
    return values if values is not None else [None] * n


def make_correctness_reward(state: CodeTaskState, lenient: bool = False):
    """`code_correct`: 1.0 when the solver's answer is right, checked by execution, else 0.0; `None` on rows that are
    not code tasks, and on rows that cannot be graded fairly (counted, through TRL's `log_metric`, as fractions of
    the call's rows):

    - `code_correct/gold_not_reproduced_rate`: the task's gold no longer comes out of its program. Every question's
      gold (its output, or its held-out outputs) is made again in the same sandbox batch as the answers' checks: two
      runs at validation prove nothing about a program that keeps state outside its process;
    - `code_correct/nondeterministic_rate`: an abduction answer's two runs of the task's program disagree (the
      proposer's program, not the answer, decides). An induction answer whose own program's two runs disagree is
      wrong (0.0) and counted here too.

    All executions of a call run in one sandbox batch: each abduction and induction answer twice, each distinct
    question's gold once.
    """
    labels = PROGRAM_LABELS + (("",) if lenient else ())

    def code_correct(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:
        n = len(completions)
        types, programs = _column(kwargs, "task_type", n), _column(kwargs, "program", n)
        inputs, outputs, hidden = (
            _column(kwargs, "input", n),
            _column(kwargs, "output", n),
            _column(kwargs, "hidden", n),
        )
        rewards: list[float | None] = [None] * n
        snippets: dict[str, int] = {}  # snippet -> its place in the batch (each question's gold snippet runs once)
        golds: dict[int, tuple[int, Any]] = {}  # row -> (gold snippet's place, expected value)
        checks = []  # (row, place of the first run, place of the second run, expected value)

        def place(snippet: str, again: bool = False) -> int:
            key = snippet if not again else (snippet, len(snippets))
            return snippets.setdefault(key, len(snippets))

        for row, (completion, task_type) in enumerate(zip(completions, types, strict=True)):
            if task_type not in TASK_TYPES:
                continue
            rewards[row] = 0.0
            text = completion_text(completion)
            if task_type == "induction":
                pairs = hidden[row] or []
                expected = [parse_value(o)[1] for _, o in pairs]
                if pairs:
                    golds[row] = (place(calls_snippet(programs[row], [parse_input(i) for i, _ in pairs])), expected)
                program = check_program(last_block(text, *labels))
                if program is not None and pairs:
                    snippet = calls_snippet(program, [parse_input(i) for i, _ in pairs])
                    checks.append((row, place(snippet, True), place(snippet, True), expected))
                continue
            expected = parse_value(outputs[row])[1]
            gold_args = parse_input(inputs[row])
            if gold_args is not None:
                golds[row] = (place(call_snippet(programs[row], gold_args)), expected)
            if task_type == "deduction":
                ok, value = parse_value(last_block(text, "output"))
                rewards[row] = float(ok and values_equal(value, expected))
            else:
                args = parse_input(last_block(text, "input"))
                if args is not None:
                    snippet = call_snippet(programs[row], args)
                    checks.append((row, place(snippet, True), place(snippet, True), expected))
        results = state.execute([key if isinstance(key, str) else key[0] for key in snippets])
        nondeterministic = 0
        for row, first, second, expected in checks:
            if not same_outcome(results[first], results[second]):
                nondeterministic += 1
                rewards[row] = None if types[row] == "abduction" else 0.0
                continue
            # Value equality only: the gold values are bounded, and an induction answer's list of values may be longer
            # than one output's bound (`output_repr`) while each of its values is the gold one.
            result = results[first]
            rewards[row] = float(getattr(result, "ok", False) and values_equal(result.value, expected))
        not_reproduced = 0
        for row, (gold, expected) in golds.items():
            if not (getattr(results[gold], "ok", False) and values_equal(results[gold].value, expected)):
                not_reproduced += 1
                rewards[row] = None
        if callable(log_metric := kwargs.get("log_metric")):
            log_metric("code_correct/gold_not_reproduced_rate", not_reproduced / max(n, 1))
            log_metric("code_correct/nondeterministic_rate", nondeterministic / max(n, 1))
        return rewards

    return code_correct


def make_format_reward(lenient: bool = False):
    """`code_format`: 1.0 when the response ends its reasoning with the block its task type asks for, readable
    (a literal ```output, literal ```input arguments, or a ```python program defining `f`), else 0.0."""
    labels = PROGRAM_LABELS + (("",) if lenient else ())

    def code_format(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:
        types = _column(kwargs, "task_type", len(completions))
        rewards = []
        for completion, task_type in zip(completions, types, strict=True):
            text = completion_text(completion)
            if task_type == "deduction":
                ok = parse_value(last_block(text, "output"))[0]
            elif task_type == "abduction":
                ok = parse_input(last_block(text, "input")) is not None
            elif task_type == "induction":
                ok = check_program(last_block(text, *labels)) is not None
            else:
                rewards.append(None)
                continue
            rewards.append(float(ok))
        return rewards

    return code_format


def seed_prompts(n: int, seed: int = 0, task_types: Sequence[str] = TASK_TYPES) -> Dataset:
    """`n` seed rows, the task types in equal shares (shuffled). The `prompt` is a placeholder: the trainer asks
    `CodeTaskState.proposer_prompt` for the real one, built from the buffer at that step."""
    unknown = set(task_types) - set(TASK_TYPES)
    if unknown or not task_types:
        raise ValueError(f"task_types must be a non-empty subset of {TASK_TYPES} (got {list(task_types)}).")
    kinds = [task_types[i % len(task_types)] for i in range(n)]
    random.Random(seed).shuffle(kinds)
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Propose a {kind} task."}], "task_type": kind} for kind in kinds]
    )


def code_reasoning_task(lenient: bool = False, **state_kwargs) -> TaskFamily:
    """The code reasoning family; `state_kwargs` go to `CodeTaskState` (limits, buffer, executor).

    Learnability by default: the solver is right on some but not all responses. Pass `family.state` to
    `AbsoluteZeroTrainer(task_state=...)`.
    """
    state = CodeTaskState(**state_kwargs)
    return TaskFamily(
        name="code",
        parse_question=make_proposal_parser(lenient),
        solver_prompt_fn=solver_prompt,
        reward_funcs=[make_correctness_reward(state, lenient), make_format_reward(lenient)],
        seed_prompts=seed_prompts,
        reward_weights=[1.0, 0.25],
        state=state,
        heldout_questions=make_heldout_questions(state.validate),
        heldout_breakdown="task_type",
        learning_curves=(
            "proposer/invalid_rate",
            "unified_filter/learnable_ratio",
            "solver/code_correct_mean",
            "task/buffer_size",
        ),
        card_metrics={"solver accuracy": "solver/code_correct_mean", "buffer size": "task/buffer_size"},
    )
