"""Two torchrun ranks (gloo) train plain GRPOTrainer for 2 steps and end with identical weights."""

import time
from pathlib import Path

import pytest

from trl_ext.testing import run_torchrun


# every test here starts torchrun with two ranks
pytestmark = pytest.mark.multiprocess
SCRIPTS = Path(__file__).parents[1] / "scripts"


def test_two_ranks_finish_two_steps_with_identical_weights():
    results = run_torchrun(SCRIPTS / "grpo_two_ranks.py", nproc=2, timeout=600)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["world_size"] == 2 and r["backend"] == "gloo" and r["global_step"] == 2
        assert r["final_digest"] != r["initial_digest"]  # the run trained
    assert results[0]["final_digest"] == results[1]["final_digest"]  # DDP kept the replicas in sync


def test_runner_reports_a_failing_rank(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    with pytest.raises(RuntimeError, match="exited with"):
        run_torchrun(script, nproc=2, timeout=120)


def test_runner_reports_a_missing_result(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text("pass\n")
    with pytest.raises(RuntimeError, match="rank 0 wrote no result"):
        run_torchrun(script, nproc=2, timeout=120)


def test_ranks_temporary_files_are_removed_with_the_run(tmp_path):
    script = tmp_path / "scratch.py"
    script.write_text(
        "import tempfile\nfrom pathlib import Path\nfrom trl_ext.testing import write_rank_result\n"
        "folder = Path(tempfile.mkdtemp())\n(folder / 'checkpoint').write_bytes(b'x' * 1024)\n"
        "write_rank_result({'folder': str(folder)})\n"
    )
    folders = [Path(r["folder"]) for r in run_torchrun(script, nproc=2, timeout=120)]
    assert folders[0] != folders[1] and folders[0].parent == folders[1].parent
    assert folders[0].parent.name == "tmp" and folders[0].parent.parent.name.startswith("trl_ext_torchrun_")
    assert not any(folder.exists() for folder in folders)  # gone with the run, not left in /tmp


def test_runner_reports_a_hang_and_kills_every_rank(tmp_path):
    script = tmp_path / "hang.py"
    pids = tmp_path / "pids"
    script.write_text(f"import os, time\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\ntime.sleep(120)\n")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish in 10s"):
        run_torchrun(script, nproc=2, timeout=10)
    assert time.monotonic() - start < 60  # the ranks were killed, not waited for (they sleep 120 s)
    ranks = [int(p) for p in pids.read_text().split()]
    assert len(ranks) == 2
    assert not any(_running(pid) for pid in ranks)  # no rank left running after a deadlock


def _running(pid):
    """Alive and not a zombie (a killed orphan may wait to be reaped by PID 1)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
