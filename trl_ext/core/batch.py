"""Concatenate the row batches returned by `GRPOTrainer._generate_and_score_completions`."""

from __future__ import annotations

import torch
from trl.trainer.utils import split_tensor_dict


# Prompts are left-padded by TRL, everything else per token is right-padded.
_LEFT_PADDED = {"prompt_ids", "prompt_mask"}


def _pad_value(key: str, pad_token_id: int) -> float:
    if key.endswith("_ids"):
        return pad_token_id
    if key == "importance_sampling_ratio":
        return 1.0
    return 0  # masks and log-probs: padded positions are masked out anyway


def concat_row_batches(batches: list[dict], pad_token_id: int) -> dict:
    """Stack row batches with the same keys: 2-D tensors are padded to the widest batch, 1-D tensors concatenated.

    Scalars (e.g. `num_items_in_batch`) are dropped: they describe one batch and must be recomputed for the union.
    Keys must agree across batches; other value types are not supported and raise.
    """
    keys = list(batches[0])
    for batch in batches[1:]:
        if set(batch) != set(keys):
            raise ValueError(f"Row batches have different keys: {sorted(keys)} vs {sorted(batch)}.")
    out = {}
    for key in keys:
        values = [b[key] for b in batches]
        if not all(isinstance(v, torch.Tensor) for v in values):
            raise TypeError(f"Cannot concatenate non-tensor batch entry {key!r}.")
        if values[0].dim() == 0:
            continue
        if values[0].dim() == 2:
            width = max(v.size(1) for v in values)
            side = "left" if key in _LEFT_PADDED else "right"
            fill = _pad_value(key, pad_token_id)
            padded = []
            for v in values:
                extra = v.new_full((v.size(0), width - v.size(1)), fill)
                padded.append(torch.cat([extra, v] if side == "left" else [v, extra], dim=1))
            values = padded
        out[key] = torch.cat(values, dim=0)
    return out


def trim_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_width: int):
    """Cut `[left-padded prompt | right-padded completion]` rows to the columns some row uses.

    Returns `(input_ids, attention_mask, kept_completion_width)`: the prompt part loses the padding columns every row
    has on the left, the completion part those every row has on the right (at least one column stays).
    """
    prompt_width = input_ids.size(1) - completion_width
    used = attention_mask.bool().any(0)
    prompt_used = torch.nonzero(used[:prompt_width]).flatten()
    start = int(prompt_used[0]) if prompt_used.numel() else prompt_width
    completion_used = torch.nonzero(used[prompt_width:]).flatten()
    keep = int(completion_used[-1]) + 1 if completion_used.numel() else 1
    end = prompt_width + keep
    return input_ids[:, start:end], attention_mask[:, start:end], keep


def merge_rows(parts, order, width: int):
    """Inverse of splitting rows into groups: `parts[i]` is a tuple of (rows_i, width_i) tensors (or None) for the
    rows `order[i]`; each is right-padded with zeros to `width` and the rows are put back in their original order."""
    index = torch.cat(order)
    inverse = torch.empty_like(index)
    inverse[index] = torch.arange(index.numel(), device=index.device)
    merged = []
    for field in zip(*parts, strict=True):
        if field[0] is None:
            merged.append(None)
            continue
        padded = [torch.nn.functional.pad(t, (0, width - t.size(1))) for t in field]
        merged.append(torch.cat(padded)[inverse])
    return tuple(merged)


def scatter_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], num_rows: int, width: int, device) -> torch.Tensor:
    """`(num_rows, width)` zeros with each part's `(row indices, values)` put in place, values right-padded with zeros
    to `width`; differentiable in the values. Rows no part names stay 0."""
    dtype = parts[0][1].dtype if parts else torch.float32
    out = torch.zeros(num_rows, width, dtype=dtype, device=device)
    for index, values in parts:
        out = out.index_copy(0, index, torch.nn.functional.pad(values, (0, width - values.size(1))))
    return out


def rows_by_key(keys: torch.Tensor) -> list[list[int]]:
    """Row indices per distinct value of `keys`, groups in order of first appearance, rows in order."""
    groups: dict[int, list[int]] = {}
    for row, key in enumerate(keys.tolist()):
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def group_rows(chunks: list[dict], key: str) -> list[dict]:
    """Re-split equal row chunks so that the rows sharing a value of `key` sit together.

    Groups keep the order in which they first appear, rows keep their order within a group, and the chunks keep
    their number and size (a group that does not fit is continued in the next chunk). Tensors with a row dimension
    and lists are permuted; scalars and `None` are kept.
    """
    merged = {}
    for name, first in chunks[0].items():
        if isinstance(first, list):
            merged[name] = [item for chunk in chunks for item in chunk[name]]
        elif isinstance(first, torch.Tensor) and first.dim() > 0:
            merged[name] = torch.cat([chunk[name] for chunk in chunks])
        else:
            merged[name] = first
    order = [row for rows in rows_by_key(merged[key]) for row in rows]
    for name, value in merged.items():
        if isinstance(value, list):
            merged[name] = [value[i] for i in order]
        elif isinstance(value, torch.Tensor) and value.dim() > 0:
            merged[name] = value[order]
    return split_tensor_dict(merged, len(chunks))
