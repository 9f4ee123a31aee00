"""What the trainers do alike to the batch dicts of `GRPOTrainer._generate_and_score_completions`: find this
process's rows of a gathered batch (or its share of work to spread), restrict the loss to a mask, and join the batches
of several row kinds."""

from __future__ import annotations

import torch

from ...core.batch import concat_row_batches


def local_rows(accelerator, num_local: int) -> slice:
    """This process's rows of a batch gathered over processes (in process order, `num_local` rows each)."""
    start = accelerator.process_index * num_local
    return slice(start, start + num_local)


def process_share(accelerator, items: list) -> tuple[list, int]:
    """This process's equal share of `items` (process `r` takes the `r`-th slice), padded with copies of the first
    item: every process then makes the same calls with the same row counts (vLLM server mode and gathers need it).
    Returns the share and how many of its items are real; the padding comes last."""
    per_process = -(-len(items) // accelerator.num_processes)
    padded = items + items[:1] * (per_process * accelerator.num_processes - len(items))
    rows = local_rows(accelerator, per_process)
    return padded[rows], max(0, min(len(items) - rows.start, per_process))


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


class RowBeta(float):
    """A KL coefficient per row, for the one place TRL's loss multiplies it by the per-token KL.

    `GRPOTrainer._compute_loss` tests `self.beta != 0.0` and adds `self.beta * per_token_kl`; scoped as `self.beta`
    for that call, this object passes the test as the float `value` (non-zero) and multiplies a `(B, T)` tensor row by
    row with `per_row` `(B,)`. Everywhere else it is that float."""

    def __new__(cls, value: float, per_row: torch.Tensor):
        beta = super().__new__(cls, value)
        beta.per_row = per_row
        return beta

    def __mul__(self, other):
        if isinstance(other, torch.Tensor):
            return self.per_row.to(other.device, other.dtype).view(-1, *([1] * (other.dim() - 1))) * other
        return float(self) * other

    __rmul__ = __mul__
