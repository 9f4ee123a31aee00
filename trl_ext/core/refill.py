"""DAPO-style refill of answer groups whose rewards are all equal: which groups each refill round regenerates, which
regenerated groups replace them, and where every row of the final batch comes from.

A group is `group_size` consecutive rows of the gathered (all-process) batch, and each process holds whole groups
(`groups_per_process` of them, in process order). The bookkeeping is built from gathered rewards, so it is identical
on every process: each process reads its own call size and rows from it, and all of them agree on the collectives.
"""

from __future__ import annotations

import torch


def _spread(values: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group, the largest and the smallest scored (non-NaN) value: `-inf` and `inf` when none is scored."""
    grouped = values.view(-1, group_size)
    scored = ~torch.isnan(grouped)
    highest = torch.where(scored, grouped, -torch.inf).amax(dim=1)
    lowest = torch.where(scored, grouped, torch.inf).amin(dim=1)
    return highest, lowest


def equal_reward_groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(N,)` rewards -> `(N // group_size,)` bool: True where a group has a scored value and all its scored values
    are equal (its advantages are 0). A group with no scored value (NaN: no gold answer) is not one: no sample can
    change it."""
    highest, lowest = _spread(values, group_size)
    return torch.isfinite(highest) & (highest == lowest)


def mixed_reward_groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """`(N,)` rewards -> `(N // group_size,)` bool: True where a group's scored values are not all equal."""
    highest, lowest = _spread(values, group_size)
    return highest > lowest


class GroupRefill:
    """Refill rounds over a batch of `num_processes * groups_per_process` groups.

    `values` `(W * B,)`: the first sampling's gathered rewards. The groups whose rewards are all equal are pending.
    Each round (`next_round`), every process regenerates `K` groups, `K` being the largest number of pending groups
    any process holds: its own pending groups first, then (a process with fewer) copies of its own groups as
    fillers, whose results are discarded. `accept` takes the round's gathered rewards `(W * K * group_size,)`: a
    pending group whose regenerated rows are mixed is replaced by them and leaves the pending list; one still all
    equal stays pending, with its original rows.

    Rows are then named by round (0: the first sampling, r: refill round r) in the concatenation of the rounds'
    batches, first sampling first: `local_index(p)` into process `p`'s concatenation (each round's rows of process
    `p`), `gathered_index()` into the concatenation of the rounds' gathered batches; `gathered_sources()` gives each
    final row's round and row inside that round's gathered batch.
    """

    def __init__(self, values: torch.Tensor, num_processes: int, group_size: int):
        if values.numel() % (num_processes * group_size):
            raise ValueError(
                f"{values.numel()} rows do not hold whole groups of {group_size} on each of {num_processes} processes."
            )
        self.num_processes, self.group_size = num_processes, group_size
        self.groups_per_process = values.numel() // (num_processes * group_size)
        equal = equal_reward_groups(values.detach().cpu(), group_size).view(num_processes, -1)
        self.pending: list[list[int]] = [torch.nonzero(row).flatten().tolist() for row in equal]
        self.equal_before = sum(len(groups) for groups in self.pending)
        # (round, slot) each group's final rows come from; round 0 slot g is the first sampling's group g
        self.source = [[(0, group) for group in range(self.groups_per_process)] for _ in range(num_processes)]
        self.round_sizes: list[int] = []  # K of each refill round
        self._open = False  # a round was planned and awaits its rewards

    @property
    def replaced(self) -> int:
        """Groups replaced so far, over all processes."""
        return sum(round_ > 0 for groups in self.source for round_, _ in groups)

    def next_round(self) -> list[list[int]] | None:
        """Per process, the local groups its `K` slots regenerate (pending ones first, then fillers), or `None` when
        no process has a pending group."""
        size = max(len(groups) for groups in self.pending)
        if size == 0:
            return None
        slots = []
        for groups in self.pending:
            fill = groups or [0]  # a process without pending groups still makes the call
            slots.append([fill[slot % len(fill)] for slot in range(size)])
        self._open = True
        self.round_sizes.append(size)
        return slots

    def accept(self, values: torch.Tensor) -> int:
        """Take the round's gathered rewards `(W * K * group_size,)`; returns how many groups it replaced."""
        if not self._open:
            raise RuntimeError("accept() follows next_round().")
        round_, size = len(self.round_sizes), self.round_sizes[-1]
        mixed = mixed_reward_groups(values.detach().cpu(), self.group_size).view(self.num_processes, size)
        replaced = 0
        for process, groups in enumerate(self.pending):
            still = []
            for slot, group in enumerate(groups):  # the pending groups hold the first slots; fillers are not read
                if mixed[process, slot]:
                    self.source[process][group] = (round_, slot)
                    replaced += 1
                else:
                    still.append(group)
            self.pending[process] = still
        self._open = False
        return replaced

    def _rows_per_process(self) -> list[int]:
        """Rows each process holds in each round's batch, first sampling first."""
        return [n * self.group_size for n in (self.groups_per_process, *self.round_sizes)]

    def _sources(self, process: int, gathered: bool) -> list[tuple[int, int]]:
        """`(round, row of that round's batch)` of each of `process`'s final rows: of its own rows of the round's
        batch, or (`gathered`) of the round's gathered batch, where process `p`'s rows come `p`-th."""
        rows = self._rows_per_process()
        return [
            (round_, (process * rows[round_] if gathered else 0) + slot * self.group_size + i)
            for round_, slot in self.source[process]
            for i in range(self.group_size)
        ]

    def local_index(self, process: int) -> list[int]:
        """Process `process`'s final rows, as rows of its concatenation of the rounds' batches."""
        rows = self._rows_per_process()
        return [sum(rows[:round_]) + row for round_, row in self._sources(process, gathered=False)]

    def gathered_sources(self) -> list[tuple[int, int]]:
        """`(round, row of that round's gathered batch)` of every final row, in process order."""
        return [source for process in range(self.num_processes) for source in self._sources(process, gathered=True)]

    def gathered_index(self) -> list[int]:
        """Every final row, in process order, as a row of the concatenation of the rounds' gathered batches."""
        rows = self._rows_per_process()
        return [self.num_processes * sum(rows[:round_]) + row for round_, row in self.gathered_sources()]
