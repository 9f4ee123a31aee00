"""Two torchrun ranks in vLLM server mode (loopback server) whose rows make different numbers of tool calls.

Plain `GRPOTrainer` runs TRL's tool loop per process: with different row counts in a tool round, a rank receives
completions generated from another rank's rollouts; with a rank that has no tool round left, the collectives no longer
line up and the run fails (gloo reports the mismatch; NCCL would hang). `CollectiveToolRounds` (in every trl-ext
trainer that accepts tools) keeps the rounds in step: no mis-pairing, no deadlock, identical weights and metrics.
"""

from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


SCRIPT = Path(__file__).parents[1] / "scripts" / "tool_ranks.py"


def tags(results):
    return [row["tags"] for r in results for row in r["rows"]]


def tool_calls(results):
    return [row["text"].count("<tool_call>") for r in results for row in r["rows"]]


@pytest.mark.multiprocess
def test_plain_grpo_pairs_a_completion_with_another_ranks_rollout():
    results = run_torchrun(SCRIPT, nproc=2, args=["grpo", "uneven"], timeout=300)
    # Tool round 1: rank 0 sends 2 rows, rank 1 one; rank 1 slices rows [1:2] of the 3: rank 0's second rollout's.
    assert results[0]["requests"] == [2, 3]
    assert tags(results) == [["A-0"], ["A-1"], ["B-0"], ["A-1", "B-1"]]


@pytest.mark.multiprocess
def test_plain_grpo_fails_when_only_one_rank_calls_tools():
    # Rank 0 enters a second tool round (a gather of its prompts) while rank 1 gathers its length metrics: gloo
    # sees a message of the wrong size and aborts the run. A timeout or another crash is not this failure.
    with pytest.raises(RuntimeError) as failure:
        run_torchrun(SCRIPT, nproc=2, args=["grpo", "one_rank"], timeout=240)
    message = str(failure.value)
    assert message.startswith("torchrun exited with"), message[-3000:]
    assert "Received data size doesn't match expected size. Is there a distributed collective mismatch" in message, (
        message[-3000:]
    )


@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario", ["one_rank", "uneven"])
def test_collective_tool_rounds_fix_plain_grpo(scenario):
    results = run_torchrun(SCRIPT, nproc=2, args=["safe_grpo", scenario], timeout=300)
    assert tags(results) == [["A-0"], ["A-1"], ["B-0"], ["B-1"]]
    assert tool_calls(results) == {"one_rank": [1, 2, 0, 0], "uneven": [1, 1, 0, 1]}[scenario]
    # Each tool round is one request with the same row count from each rank (padding rows fill the gap).
    assert results[0]["requests"] == {"one_rank": [2, 4, 2], "uneven": [2, 4]}[scenario]
    assert results[0]["digest"] == results[1]["digest"] and results[0]["log"] == results[1]["log"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario", ["one_rank", "uneven"])
def test_absolute_zero_tool_rounds_in_step(scenario):
    results = run_torchrun(SCRIPT, nproc=2, args=["azr", scenario], timeout=300)
    selected = tags(results)
    assert len(selected) == 4 and all(len(t) == 1 for t in selected)  # every row carries its own rollout's tag only
    assert [t[0][0] for t in selected] == ["A", "A", "B", "B"] and [t[0][-1] for t in selected] == ["0", "1"] * 2
    assert tool_calls(results) == {"one_rank": [1, 2, 0, 0], "uneven": [1, 1, 0, 1]}[scenario]
    # Proposer (2 seeds), solver (4 questions x n=2), then tool rounds of 2 x 4 rows (rank 0's 4 or 2 rows, padded).
    assert results[0]["requests"] == {"one_rank": [2, 4, 8, 4], "uneven": [2, 4, 8]}[scenario]
    assert results[0]["digest"] == results[1]["digest"] and results[0]["log"] == results[1]["log"]


@pytest.mark.multiprocess
def test_replay_tool_rounds_in_step():
    results = run_torchrun(SCRIPT, nproc=2, args=["replay", "one_rank"], timeout=300)
    assert tags(results) == [["A-0"], ["A-1"], ["B-0"], ["B-1"]]
    assert tool_calls(results) == [1, 2, 0, 0]
    assert results[0]["requests"] == [2, 4, 2]
    assert results[0]["digest"] == results[1]["digest"] and results[0]["log"] == results[1]["log"]
