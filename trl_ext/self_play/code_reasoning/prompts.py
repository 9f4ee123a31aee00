"""Proposer and solver prompts of the code reasoning family (deduction, abduction, induction).

Answers are fenced blocks: ```python for programs, ```input for the arguments of one call, ```output for a returned
value, ```message for the induction hint.
"""

from __future__ import annotations

from collections.abc import Sequence


RULES = """Rules for the program:
- define a function `f` with at least one parameter that returns a value; helpers and classes may come before it
- the same input must always give the same output: no randomness, clock, files, network, printing or global state
- only the standard library, and it must finish in well under a second
- arguments and return value are plain Python literals (numbers, strings, booleans, None, lists, tuples, dicts, sets)"""

PROPOSE_TRIPLET = """You write Python puzzles. Design a new function `f` and one input for it. {goal}

{rules}

Reply with the program in a ```python block and the arguments of one call in an ```input block (several arguments \
separated by commas, strings quoted), for example:
```python
def f(words, k):
    return sorted(words, key=len)[:k]
```
```input
['pear', 'fig', 'banana'], 2
```

Here are earlier puzzles; make yours different from all of them.
{references}"""

GOALS = {
    "deduction": "A solver will see the function and the input and must work out the output, so make the "
    "computation take several careful steps.",
    "abduction": "A solver will see the function and its output and must find an input that produces it, so make "
    "the output hard to invert.",
}

PROPOSE_INPUTS = """Here is a Python function. Write {num_inputs} different inputs for it, each in its own ```input \
block (several arguments separated by commas, strings quoted), chosen so that the input/output pairs reveal what the \
function does. Then write a short ```message block that hints at the task without showing the code.

```python
{program}
```"""

SOLVE_DEDUCTION = """What does this Python function return for the given input? Think it through step by step, then \
give the returned value as a Python literal in an ```output block.

```python
{program}
```
```input
{input}
```"""

SOLVE_ABDUCTION = """Find an input for which this Python function returns the given output. Think it through step by \
step, then give the arguments of the call in an ```input block (several arguments separated by commas, strings \
quoted).

```python
{program}
```
```output
{output}
```"""

SOLVE_INDUCTION = """Write a Python function `f` that maps each input below to its output (inputs are the arguments \
of one call). Think it through step by step, then give the program in a ```python block.

{pairs}
Hint from the author:
```message
{message}
```"""


def reference_block(index: int, program: str, input_text: str, output: str) -> str:
    return f"Puzzle {index}:\n```python\n{program}\n```\n```input\n{input_text}\n```\n```output\n{output}\n```\n"


def propose_triplet(task_type: str, references: Sequence[dict]) -> str:
    blocks = "".join(reference_block(n + 1, r["program"], r["input"], r["output"]) for n, r in enumerate(references))
    return PROPOSE_TRIPLET.format(goal=GOALS[task_type], rules=RULES, references=blocks)


def pairs_text(pairs: Sequence[Sequence[str]]) -> str:
    return "".join(f"```input\n{i}\n```\n```output\n{o}\n```\n" for i, o in pairs)
