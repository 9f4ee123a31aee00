"""The RLCR ablation's bookkeeping (benchmarks/rlcr_ablation.py): what it reads of each run's metrics.json, and its
summary line, with and without the stated confidence's mean of k samples."""

import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import rlcr_ablation as ablation  # benchmarks/ is no package: importable once on the path


def _evaluation(auroc_within, mean_within=None):
    metrics = {key: 0.5 for key in ablation.METRICS} | {"auroc_within_groups": auroc_within, "bins": [{"count": 3}]}
    if mean_within is not None:
        mean = {key: 0.5 for key in ablation.MEAN_OF_K_METRICS} | {"auroc_within_groups": mean_within}
        metrics[ablation.MEAN_OF_K] = mean | {"samples_per_question": 8, "bins": [{"count": 3}]}
    return metrics


def _run(tmp_path, name, before, after):
    (tmp_path / name).mkdir()
    metrics = {"before": before, "after": after, "seconds": {"total": 1.0}, "train_log": []}
    (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
    return ablation.read_run(name, ["--confidence_samples", "8"], 0, tmp_path)


def test_reads_the_mean_of_k_column_and_shows_its_within_level_auroc(tmp_path):
    entry = _run(tmp_path, "base", _evaluation(0.5, 0.55), _evaluation(0.5, 0.625))
    mean = entry["after"][ablation.MEAN_OF_K]
    assert mean["auroc_within_groups"] == 0.625 and mean["samples_per_question"] == 8 and "bins" not in mean
    line = ablation.summary_line(entry)
    assert "within levels 0.500 -> 0.500" in line  # the greedy column first
    assert line.endswith("mean of 8 confidences within levels 0.550 -> 0.625")


def test_without_samples_the_entry_and_line_are_the_greedy_ones(tmp_path):
    entry = _run(tmp_path, "base", _evaluation(0.5), _evaluation(0.6))
    assert ablation.MEAN_OF_K not in entry["after"]
    assert ablation.summary_line(entry).endswith("confidence bins [3]")
