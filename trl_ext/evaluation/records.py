"""Per-sample records of a held-out evaluation, written as JSONL beside its JSON, so that anyone can recompute a
metric, slice it by group, or bootstrap it: one line per sample with the question (`prompt`), its `group` (e.g. the
difficulty level, or a user column), the reply (`answer`), whether it was `correct`, and the stated `confidence`."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


DEFAULT_GROUP_COLUMN = "level"
"""The column whose value is each question's group: the built-in data's difficulty level."""


def prompt_text(prompt: Any) -> str:
    """A question as text: a plain prompt as it is, a conversation's last user message."""
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else json.dumps(prompt)
    return str(prompt)


def with_questions(
    records: Sequence[dict],
    rows: Sequence[dict],
    num_samples: int = 1,
    group_column: str | None = DEFAULT_GROUP_COLUMN,
) -> list[dict]:
    """Each record (`num_samples` per row, in row order) with its row's question under `prompt` and the row's
    `group_column` value under `group` (`None` when the row has no such column); the record's own keys win."""
    if len(records) != len(rows) * num_samples:
        raise ValueError(f"{len(records)} records for {len(rows)} rows of {num_samples} samples.")
    out = []
    for i, record in enumerate(records):
        row = rows[i // num_samples]
        group = row.get(group_column) if group_column else None
        out.append({"prompt": prompt_text(row.get("prompt")), "group": group, **record})
    return out


def write_jsonl(path: str | os.PathLike, records: Sequence[dict]) -> str:
    """One JSON object per line (NaN written as null, non-JSON values as text); the folder is created."""

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(clean(record), default=str) + "\n")
    return str(path)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
