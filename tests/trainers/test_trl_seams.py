"""The shape of TRL's `GRPOTrainer` that the tool-rounds and episodes code relies on beyond method names.

`AbsoluteZeroTrainer._episodes` runs `GRPOTrainer._generate_and_score_completions` up to its `_generate` call and
leaves it there (`_EpisodesGenerated`); `_replayed` hands TRL recorded `_generate` output; `ReplayGRPOTrainer` and
`CollectiveToolRounds` wrap `_tool_call_loop` and `_generate_single_turn`. A TRL upgrade that reorders or reshapes
these fails here, naming the TRL method, rather than as a wrong batch (docs/design.md#building-on-grpotrainer).
"""

import ast
import inspect
import textwrap

import pytest
from trl import GRPOTrainer

from trl_ext.trainers.seams.call_record import GenerateOutput


def method_tree(name: str) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(getattr(GRPOTrainer, name))))


def call_lines(tree: ast.AST, attribute: str, on_self: bool = True) -> list[int]:
    """Lines calling `self.<attribute>(...)` (or `<anything>.<attribute>(...)` when not `on_self`)."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attribute
        and (not on_self or (isinstance(node.func.value, ast.Name) and node.func.value.id == "self"))
    )


def returned_names(tree: ast.AST) -> list[str]:
    """The names of the method's last top-level `return a, b, ...`."""
    function = tree.body[0]
    (last,) = [node for node in function.body if isinstance(node, ast.Return)][-1:]
    return [element.id for element in last.value.elts]


GENERATE_OUTPUT = list(GenerateOutput._fields)  # how the trainers name the tuple TRL's _generate returns


def test_generate_and_score_completions_resets_environments_before_its_one_generate_call():
    method = "GRPOTrainer._generate_and_score_completions"
    tree = method_tree("_generate_and_score_completions")
    generate = call_lines(tree, "_generate")
    assert len(generate) == 1, (
        f"{method} no longer calls self._generate once ({len(generate)} calls): AbsoluteZeroTrainer._episodes stops "
        "it at that call (_EpisodesGenerated) to run a solving round's episodes."
    )
    resets = call_lines(tree, "reset", on_self=False)
    assert resets and max(resets) < generate[0], (
        f"{method} no longer resets the environments before calling self._generate: AbsoluteZeroTrainer._episodes "
        "relies on every episode's environment being drawn and reset when _generate runs."
    )
    for later in ("_get_per_token_logps_and_entropies", "_calculate_rewards"):
        lines = call_lines(tree, later)
        assert lines and min(lines) > generate[0], (
            f"{method} calls self.{later} before self._generate: AbsoluteZeroTrainer._episodes would run it for "
            "rows it throws away (and _replayed would be asked for it before its recorded generation)."
        )
    unpacked = [
        [element.id for element in node.targets[0].elts]
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.lineno in generate
    ]
    assert unpacked and len(unpacked[0]) == len(GENERATE_OUTPUT), (
        f"{method} unpacks self._generate's output into {unpacked} values, not the {len(GENERATE_OUTPUT)} that "
        "AbsoluteZeroTrainer._replayed and _generate_rows build and read (GenerateOutput)."
    )


def test_generate_returns_what_the_episodes_code_reads():
    assert returned_names(method_tree("_generate")) == GENERATE_OUTPUT, (
        f"GRPOTrainer._generate no longer returns {GENERATE_OUTPUT} in that order: GenerateOutput names that tuple "
        "by position, for AbsoluteZeroTrainer._replayed and _generate_rows and RecordsCalls."
    )


def test_tool_call_loop_returns_what_the_wrappers_read():
    returned = returned_names(method_tree("_tool_call_loop"))
    assert returned[:4] == ["tool_mask", "completions", "completion_ids", "logprobs"], (
        f"GRPOTrainer._tool_call_loop returns {returned}: ReplayGRPOTrainer._tool_call_loop reads the tool mask, "
        "completions, completion ids and log-probs from its first four values."
    )


@pytest.mark.parametrize(
    "method, parameters",
    [
        ("_generate", ["self", "prompts"]),
        ("_tokenize_prompts", ["self", "prompts"]),
        ("_calculate_rewards", ["self", "inputs", "prompts", "completions", "completion_ids_list"]),
        (
            "_tool_call_loop",
            [
                "self",
                "prompts",
                "prompt_ids",
                "completion_ids",
                "completions",
                "logprobs",
                "images",
                "multimodal_fields",
            ],
        ),
        (
            "_generate_single_turn",
            ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"],
        ),
        ("_get_tool_suffix_ids", ["self", "tool_messages"]),
    ],
)
def test_wrapped_seams_keep_their_parameters(method, parameters):
    found = list(inspect.signature(getattr(GRPOTrainer, method)).parameters)
    assert found == parameters, (
        f"GRPOTrainer.{method} now takes {found}, not {parameters}: the trainers and CollectiveToolRounds wrap it "
        "(or scope a replacement for one call) with that signature."
    )


def test_calculate_rewards_passes_the_live_environments():
    assert "self.environments" in inspect.getsource(GRPOTrainer._calculate_rewards), (
        "GRPOTrainer._calculate_rewards no longer passes self.environments to reward functions: "
        "AbsoluteZeroTrainer._solve scores a solving round while its episodes' environments are live."
    )


def test_the_fused_lm_head_decides_compaction_with_the_name_the_cpu_tiles_set():
    """`cpu_logprob_tiles` makes TRL's fused forward score only the labelled positions on CPU by rebinding
    `trl.trainer.utils._use_triton`: that name must be what `add_fused_lm_head`'s forward asks, and the only caller
    in the module (the kernels keep their own binding)."""
    import trl.trainer.utils as trl_utils

    source = inspect.getsource(trl_utils)
    calls = [line.strip() for line in source.splitlines() if "_use_triton(" in line]
    assert calls == ["compact = _use_triton(hidden_states.device)"], "trl.trainer.utils: add_fused_lm_head"
    assert "compact = _use_triton(" in inspect.getsource(trl_utils.add_fused_lm_head)
