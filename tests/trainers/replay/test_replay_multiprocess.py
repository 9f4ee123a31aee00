"""ReplayGRPOTrainer across processes and across a checkpoint: identical buffers and replay decisions."""

import math
from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


SCRIPT = Path(__file__).parents[2] / "scripts" / "replay_ranks.py"


@pytest.mark.multiprocess
def test_two_ranks_hold_identical_buffers_and_make_identical_decisions():
    ranks = run_torchrun(SCRIPT, nproc=2, args=["ranks", "6"], timeout=600)
    assert [r["world_size"] for r in ranks] == [2, 2]
    first, second = ranks
    assert len(first["plans"]) == len(second["plans"]) == 6
    for a, b in zip(first["plans"], second["plans"], strict=True):
        assert a["group_tasks"] == b["group_tasks"] and a["global_stored"] == b["global_stored"]
        assert a["fresh_max"] == b["fresh_max"]
    assert any(any(p["global_stored"]) for p in first["plans"]), "replay happened"
    # A replay group spanning both ranks leaves them with different fresh row counts: the smaller one was padded.
    assert any(a["fresh_local"] != b["fresh_local"] for a, b in zip(first["plans"], second["plans"]))
    assert first["buffer"] == second["buffer"]
    assert first["buffer"]["trajectories"], "the buffer holds trajectories"
    assert first["replay_logs"] == second["replay_logs"]
    assert first["digest"] == second["digest"]


@pytest.mark.multiprocess
def test_resume_restores_the_buffer_and_the_next_replay_decisions(tmp_path):
    full = run_torchrun(SCRIPT, nproc=1, args=["full", str(tmp_path / "full")], timeout=600)[0]
    checkpoint = tmp_path / "full" / "checkpoint-2"
    assert (checkpoint / "replay_state.json").is_file()
    # A new process resumes from the same checkpoint into a fresh output directory.
    resume_dir = tmp_path / "resumed"
    resume_dir.mkdir()
    (resume_dir / "checkpoint-2").symlink_to(checkpoint, target_is_directory=True)
    resumed = run_torchrun(SCRIPT, nproc=1, args=["resume", str(resume_dir)], timeout=600)[0]

    after = [p for p in full["plans"] if p["step"] >= 2]
    assert [p["step"] for p in resumed["plans"]] == [2, 3]
    assert any(any(p["global_stored"]) for p in after), "the compared steps replay"
    for a, b in zip(after, resumed["plans"], strict=True):
        assert a["group_tasks"] == b["group_tasks"] and a["local_stored"] == b["local_stored"]
    for key in ("buckets", "retired", "trajectories", "rng"):
        assert resumed["buffer"][key] == full["buffer"][key], key
    for task, logps in full["buffer"]["logps"].items():
        for a, b in zip(logps, resumed["buffer"]["logps"][task], strict=True):
            assert all(math.isclose(x, y, abs_tol=1e-5) for x, y in zip(a, b, strict=True))
