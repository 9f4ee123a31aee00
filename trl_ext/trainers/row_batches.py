"""What the trainers do alike to the batch dicts of `GRPOTrainer._generate_and_score_completions`: find this
process's rows of a gathered batch, restrict the loss to a mask, and join the batches of several row kinds."""

from __future__ import annotations

import torch

from ..core.batch import concat_row_batches


def local_rows(accelerator, num_local: int) -> slice:
    """This process's rows of a batch gathered over processes (in process order, `num_local` rows each)."""
    start = accelerator.process_index * num_local
    return slice(start, start + num_local)


def restrict_loss(batch: dict, keep: torch.Tensor) -> None:
    """Train `batch` only where `keep` (per row `(B,)`, or per token `(B, T)`) is 1.

    The mask goes into `tool_mask`, which TRL's loss reads and nothing else does: `completion_mask` is also the
    attention mask."""
    keep = keep.to(batch["completion_mask"].device)
    if keep.dim() == 1:
        keep = keep.unsqueeze(1)
    batch["tool_mask"] = batch.get("tool_mask", torch.ones_like(batch["completion_mask"])) * keep


KIND_KEY = "row_kind"  # batch key of a row's kind (RLCR: ANSWER/CONFIDENCE; Absolute Zero: SOLVER/PROPOSER)


def concat_row_kinds(batches: dict[int, dict], pad_token_id: int, accelerator) -> dict:
    """One batch from the batches of several row kinds (`{kind: batch}`, in row order), each row tagged with its
    kind under `KIND_KEY`.

    `num_items_in_batch`, which TRL's loss normalisation reads, is recounted over the joined rows of every process."""
    for kind, batch in batches.items():
        device = batch["advantages"].device
        batch[KIND_KEY] = torch.full((batch["advantages"].size(0),), kind, dtype=torch.long, device=device)
    batch = concat_row_batches(list(batches.values()), pad_token_id=pad_token_id)
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    batch["num_items_in_batch"] = accelerator.gather(loss_mask.sum()).sum()
    return batch
