"""AbsoluteZeroTrainer with the code family and scripted generation: the step's validation and scoring, the buffer
update, per-task-type metrics, the buffer in checkpoints and on resume, and two torchrun ranks (real sandbox) with identical buffers.

The scenario (tests/scripts/absolute_zero_code_ranks.py): one seed prompt per task type, K = 2 proposals each (one
valid; the invalid ones: no code, a clock-reading program that fails the determinism check, prose), rollout_n = 2
responses, one right and one wrong.
"""

from pathlib import Path

import pytest

from trl_ext.self_play.code_reasoning import ZERO_TRIPLET
from trl_ext.testing import BatchRecorder, ScriptedGeneration, load_script, run_torchrun
from trl_ext.trainers.seams.trainer_state import CheckpointStateError, load_state, save_state


SCRIPT = Path(__file__).parents[2] / "scripts" / "absolute_zero_code_ranks.py"
scenario = load_script(SCRIPT)

SORT_TRIPLET = {"program": scenario.SORT, "input": "[3, 1, 2], 2", "output": "[1, 2]"}
DOUBLE_TRIPLET = {"program": scenario.DOUBLE, "input": "21", "output": "42"}


def test_one_step_validates_scores_and_grows_the_buffer(tmp_path):
    trainer, task = scenario.make_trainer(tmp_path)
    with ScriptedGeneration(trainer, scenario.script) as gen, BatchRecorder(trainer) as rec:
        trainer.train()
    fake = task.state._execute_many
    # One sandbox batch for the proposals (3 programs, 6 nearby inputs + 2 induction inputs, each run twice), one for
    # the answers (2 abduction inputs and 2 induction programs, each twice, and each question's gold once).
    assert fake.calls == [2 * (3 + 6 + 2), 2 * (2 + 2) + 3]
    assert task.state.triplets == [ZERO_TRIPLET, SORT_TRIPLET, DOUBLE_TRIPLET]

    prompts = scenario.proposer_prompts(gen, trainer.processing_class)[0]
    assert "def f(x):\n    return x" in prompts[4]  # the induction proposer got the buffer's (only) program

    batch = rec.batches[0]
    solver = batch["advantages"][batch["row_kind"] == 0]
    assert solver.tolist()[::2] == pytest.approx([0.7070] * 3, abs=1e-3)  # the right response of each pair
    assert solver.tolist()[1::2] == pytest.approx([-0.7070] * 3, abs=1e-3)
    log = trainer.state.log_history[0]
    for task_type in ("deduction", "abduction", "induction"):
        assert log[f"task/{task_type}/valid_rate"] == 0.5
        assert log[f"task/{task_type}/solve_rate"] == 0.5
        assert log[f"task/{task_type}/learnable_ratio"] == 1.0
    assert log["task/buffer_size"] == 3 and log["proposer/invalid_rate"] == 0.5
    assert log["solver/code_correct_mean"] == 0.5


def test_the_buffer_is_saved_in_checkpoints_and_restored_on_resume(tmp_path):
    trainer, _ = scenario.make_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    with ScriptedGeneration(trainer, scenario.script) as gen:
        trainer.train()
    saved = load_state(tmp_path / "checkpoint-1", "absolute_zero_state", "AbsoluteZeroTrainer")  # JSON, no pickle
    assert saved == {"task_state": {"triplets": [ZERO_TRIPLET, SORT_TRIPLET, DOUBLE_TRIPLET]}}
    second_step = scenario.proposer_prompts(gen, trainer.processing_class)[1]
    assert scenario.SORT in second_step[0]  # the references now include the step-1 programs

    resumed, task = scenario.make_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    assert task.state.triplets == [ZERO_TRIPLET]
    with ScriptedGeneration(resumed, scenario.script) as gen:
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert scenario.proposer_prompts(gen, resumed.processing_class) == [second_step]  # the same prompts as before
    assert task.state.triplets == [ZERO_TRIPLET, SORT_TRIPLET, DOUBLE_TRIPLET]

    save_state(tmp_path / "checkpoint-1", "absolute_zero_state", {"task_state": {"triplets": "not a list"}})
    broken, _ = scenario.make_trainer(tmp_path, max_steps=2)
    with pytest.raises(CheckpointStateError, match="malformed"), ScriptedGeneration(broken, scenario.script):
        broken.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


@pytest.mark.multiprocess
def test_two_ranks_hold_identical_buffers_and_share_the_executions():
    single = run_torchrun(SCRIPT, nproc=1, args=["6", "sandbox", "2"], timeout=600)[0]
    ranks = run_torchrun(SCRIPT, nproc=2, args=["3", "sandbox", "2"], timeout=600)
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["buffer"] == ranks[1]["buffer"] == single["buffer"]
    assert single["buffer"]["triplets"] == [ZERO_TRIPLET, SORT_TRIPLET, DOUBLE_TRIPLET]
    # Each rank ran a share of the snippets, together what one process runs alone, but for the gold of a question
    # whose answers are split over the ranks, which each of them makes again (at most one per question per step).
    assert 0 < ranks[0]["executions"] < single["executions"] and 0 < ranks[1]["executions"] < single["executions"]
    assert single["executions"] <= ranks[0]["executions"] + ranks[1]["executions"] <= single["executions"] + 3 * 2
    assert ranks[0]["logs"] == ranks[1]["logs"]
    for log, expected in zip(ranks[0]["logs"], single["logs"], strict=True):
        for key, value in expected.items():  # TRL's proposer/ metrics count the padding rows: the self-play ones
            if key.startswith(("task/", "unified_filter/", "solver/", "proposer/reward_mean", "proposer/invalid")):
                assert log[key] == pytest.approx(value), key
    for role in (0, 1):
        for step in range(2):
            merged = [a for r in ranks for a, x in zip(r["advantages"][step], r["row_kind"][step]) if x == role]
            alone = [a for a, x in zip(single["advantages"][step], single["row_kind"][step]) if x == role]
            assert merged[: len(alone)] == pytest.approx(alone, abs=1e-6)  # then a zero-loss padding proposer row
