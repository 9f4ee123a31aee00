"""benchmarks/gpu_check.sh on a machine without CUDA: its prerequisite check (the embedded model, or with --tiny only a
tokenizer) passes, its CUDA check fails with a FAIL line and a non-zero exit before any benchmark or results folder;
and the benchmarks' results carry versions, commit and device and go where the check points them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trl_ext.testing import tiny_tokenizer


ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def gpu_check(*args, **env):
    run_env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "WHEELS": "/nonexistent", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=run_env, timeout=300)


@pytest.mark.slow  # fresh interpreters importing torch and TRL: seconds
@pytest.mark.parametrize("mode", ["embedded", "tiny"])
def test_cpu_path_up_to_the_cuda_check(mode, tmp_path):
    before = set((ROOT / "benchmarks" / "results").rglob("*"))
    env = {}
    if mode == "tiny":  # a tokenizer-only folder stands in for the embedded model
        tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
        env["TRL_EXT_TINY_TOKENIZER"] = str(tmp_path / "tokenizer")
    proc = gpu_check(*(["--tiny"] if mode == "tiny" else []), **env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"PASS prerequisites ({mode} model)" in proc.stdout and "FAIL CUDA device" in proc.stdout
    assert "no CUDA device" in proc.stderr
    assert set((ROOT / "benchmarks" / "results").rglob("*")) == before  # nothing written, nothing replaced


@pytest.mark.slow
def test_a_missing_tokenizer_fails_the_prerequisites(tmp_path):
    proc = gpu_check("--tiny", "--prereqs-only", TRL_EXT_TINY_TOKENIZER=str(tmp_path / "none"))
    assert proc.returncode == 1 and "FAIL prerequisites" in proc.stdout


def test_unknown_arguments_are_refused():
    proc = gpu_check("--fast")
    assert proc.returncode == 2 and "unknown argument --fast" in proc.stderr


def test_benchmark_results_record_their_environment_and_go_where_asked(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import common

    monkeypatch.setenv("TRL_EXT_BENCH_RESULTS", str(tmp_path / "new"))
    assert common.results_dir() == tmp_path / "new"
    monkeypatch.delenv("TRL_EXT_BENCH_RESULTS")
    assert common.results_dir() == ROOT / "benchmarks" / "results"
    env = common.provenance(seeds=[1])
    assert {"commit", "packages", "device", "cuda", "command", "seeds"} <= set(env)
    assert {"torch", "transformers", "trl", "trl-ext"} <= set(env["packages"]) and env["packages"]["trl"]
    assert env["device"] == ("CPU" if not common.on_cuda() else env["device"]) and env["seeds"] == [1]
