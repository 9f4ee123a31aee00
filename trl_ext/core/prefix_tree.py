"""Pack rows that share a prefix into one sequence with a tree attention mask.

An RLCR confidence row is `prompt + answer + follow-up + confidence`, and its parent answer row is `prompt + answer`:
scoring them separately recomputes the prompt and the answer once per confidence. Packed, a family is one sequence:
the root row (the member with the shortest prompt, i.e. the answer row), then, for every other member, the tokens
after the point where it leaves the root (a branch). A branch token attends to the root tokens before its fork and to
the earlier tokens of its own branch, with the position ids it has in its own row, so every scored token sees exactly
the context it has in the row-by-row forward.

Rows are `[left-padded prompt | right-padded completion]` as in TRL's loss forward; the real tokens of a row must be
contiguous (TRL's masks are). Only completion tokens are scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import rows_by_key


IGNORE_INDEX = -100


@dataclass
class PackedFamilies:
    """The packed forward's inputs and the map back to rows.

    `shift_labels[f, p]` is the token that packed position `p` predicts (`-100` where nothing is scored), so
    `log_probs[f, p]` of a forward with these labels is the log-prob of that token. Scored token `i` comes from
    `(source[0][i], source[1][i])` and belongs to row `target[0][i]`, completion column `target[1][i]`.
    """

    input_ids: torch.Tensor  # (F, T)
    position_ids: torch.Tensor  # (F, T)
    shift_labels: torch.Tensor  # (F, T)
    attend: torch.Tensor  # (F, T, T) bool: query attends to key
    source: tuple[torch.Tensor, torch.Tensor]
    target: tuple[torch.Tensor, torch.Tensor]

    def unpack(self, values: torch.Tensor, n_rows: int, width: int) -> torch.Tensor:
        """Per-position values `(F, T)` of the packed forward -> per-row `(n_rows, width)` completion values (zero
        where a row has no token). Differentiable."""
        out = values.new_zeros(n_rows, width)
        return out.index_put(self.target, values[self.source])


def _common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.numel(), b.numel())
    differs = torch.nonzero(a[:n] != b[:n])
    return int(differs[0]) if differs.numel() else n


def pack_prefix_families(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_width: int,
    family: torch.Tensor,
    pad_token_id: int,
) -> PackedFamilies:
    """Pack the rows of each `family` id into one sequence (families in order of first appearance).

    Args:
        input_ids, attention_mask: `(B, L)`, `[left-padded prompt | right-padded completion]`.
        completion_width: number of completion columns (the last `completion_width` columns of each row).
        family: `(B,)` family id per row. Rows of a family that do not share a prefix still pack correctly (their
            branch starts at 0); sharing is what saves the compute.
        pad_token_id: filler for the packed padding.
    """
    device = input_ids.device
    prompt_width = input_ids.size(1) - completion_width
    real = attention_mask.bool()
    n_prompt = real[:, :prompt_width].sum(1).tolist()
    sequences = [input_ids[row][real[row]] for row in range(input_ids.size(0))]

    # Per family: token ids, positions, labels, segment (0 root, k branch k), fork (root keys a branch may see).
    packed, source_family, source_pos, target_row, target_col = [], [], [], [], []
    for f, members in enumerate(rows_by_key(family)):
        root = min(members, key=lambda row: n_prompt[row])
        parts = {"ids": [], "positions": [], "labels": [], "segment": [], "fork": []}
        offset = 0
        for branch, row in enumerate([root] + [m for m in members if m != root]):
            seq, start = sequences[row], n_prompt[row]
            if start == 0:
                raise ValueError(f"Row {row} has no prompt token: its first completion token cannot be scored.")
            # A branch starts where the row leaves the root, and no later than the token predicting the row's
            # first completion token (a position holds one label).
            fork = 0 if branch == 0 else min(_common_prefix_length(seq, sequences[root]), start - 1)
            index = torch.arange(fork, seq.numel(), device=device)
            labels = torch.full_like(index, IGNORE_INDEX)
            scored = (index + 1 >= start) & (index + 1 < seq.numel())
            labels[scored] = seq[index[scored] + 1]
            parts["ids"].append(seq[fork:])
            parts["positions"].append(index)
            parts["labels"].append(labels)
            parts["segment"].append(torch.full_like(index, branch))
            parts["fork"].append(torch.full_like(index, fork))
            # completion token `start + c` of the row is predicted at packed position `offset + start + c - 1 - fork`
            columns = torch.arange(seq.numel() - start, device=device)
            source_family.append(torch.full_like(columns, f))
            source_pos.append(offset + start - 1 - fork + columns)
            target_row.append(torch.full_like(columns, row))
            target_col.append(columns)
            offset += index.numel()
        packed.append({name: torch.cat(values) for name, values in parts.items()})

    width = max(p["ids"].numel() for p in packed)
    fills = {"ids": pad_token_id, "positions": 0, "labels": IGNORE_INDEX, "segment": -1, "fork": 0}
    out = {}
    for name, fill in fills.items():
        dtype = input_ids.dtype if name == "ids" else torch.long
        out[name] = torch.full((len(packed), width), fill, dtype=dtype, device=device)
        for f, p in enumerate(packed):
            out[name][f, : p[name].numel()] = p[name]

    query, key = torch.arange(width, device=device)[:, None], torch.arange(width, device=device)[None, :]
    seg_q, seg_k = out["segment"][:, :, None], out["segment"][:, None, :]
    root_key_before_fork = (seg_k == 0) & (seg_q > 0) & (key < out["fork"][:, :, None])
    # padding (segment -1) attends to earlier padding only, so no query row is fully masked
    attend = (key <= query) & ((seg_k == seg_q) | root_key_before_fork)

    return PackedFamilies(
        input_ids=out["ids"],
        position_ids=out["positions"],
        shift_labels=out["labels"],
        attend=attend,
        source=(torch.cat(source_family), torch.cat(source_pos)),
        target=(torch.cat(target_row), torch.cat(target_col)),
    )


def tree_mask_unsupported(config) -> str | None:
    """Why a model cannot run a packed forward (a custom 4-D mask plus position ids), or None if it can.

    The packed forward needs an attention implementation that applies a 4-D mask as given (`sdpa`, `eager`), the
    same mask on every layer (no sliding-window or chunked layers), and positions read from `position_ids` (rotary
    embeddings; ALiBi-style biases derived from the 2-D mask would be wrong).
    """
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager"):
        return f"attn_implementation={implementation!r} does not take a custom 4-D mask (sdpa and eager do)"
    text = config.get_text_config()
    if text is not config:
        return "multimodal models are not packed"
    layer_types = getattr(text, "layer_types", None) or []
    windowed = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
    if any(kind != "full_attention" for kind in layer_types) or (not layer_types and windowed):
        return "the model has sliding-window or chunked attention layers"
    if getattr(text, "rope_parameters", None) is None and getattr(text, "rope_theta", None) is None:
        return "the model does not use rotary position embeddings"
    return None


def tree_attention_mask(attend: torch.Tensor, attn_implementation: str) -> torch.Tensor:
    """`attend` (F, T, T) as the 4-D mask the attention implementation applies as is: boolean for sdpa, additive
    float (0 / dtype min) for eager."""
    mask = attend[:, None]
    if attn_implementation == "eager":
        return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
    return mask


def family_chunks(family: torch.Tensor, max_rows: int) -> list[torch.Tensor]:
    """Row indices of whole families (in order of first appearance), at most `max_rows` rows per chunk unless a
    single family is larger: the packed counterpart of scoring `max_rows` rows at a time."""
    chunks = [[]]
    for rows in rows_by_key(family):
        if chunks[-1] and len(chunks[-1]) + len(rows) > max_rows:
            chunks.append([])
        chunks[-1].extend(rows)
    return [torch.tensor(rows, dtype=torch.long) for rows in chunks if rows]
