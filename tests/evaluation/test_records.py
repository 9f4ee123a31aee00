"""Per-sample records of held-out evaluations: questions and groups joined to records, JSONL round trip."""

import math

import pytest

from trl_ext.evaluation.records import prompt_text, read_jsonl, with_questions, write_jsonl


def test_records_get_their_rows_question_and_group():
    rows = [
        {
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}],
            "level": 1,
        },
        {"prompt": "What is 7*6?"},  # no level: group None
    ]
    records = [{"correct": 1}, {"correct": 0}, {"correct": 0}, {"correct": None, "prompt": "kept"}]
    joined = with_questions(records, rows, num_samples=2)
    assert [r["prompt"] for r in joined] == ["What is 2+3?", "What is 2+3?", "What is 7*6?", "kept"]
    assert [r["group"] for r in joined] == [1, 1, None, None]
    assert with_questions(records[:2], rows[:1], 2, group_column=None)[0]["group"] is None
    with pytest.raises(ValueError, match="3 records for 2 rows of 2 samples"):
        with_questions(records[:3], rows, num_samples=2)
    assert prompt_text([{"role": "system", "content": "x"}]) == '[{"role": "system", "content": "x"}]'


def test_jsonl_round_trip_writes_nan_as_null(tmp_path):
    path = write_jsonl(tmp_path / "sub" / "r.jsonl", [{"a": 1.5, "b": math.nan}, {"a": None, "c": [math.inf]}])
    assert read_jsonl(path) == [{"a": 1.5, "b": None}, {"a": None, "c": [None]}]
