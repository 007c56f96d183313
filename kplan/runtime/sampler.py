"""A batch sampler that splits each global batch over workers by per-worker sizes.

Epoch e visits the dataset in the order of a seeded permutation (numpy's PCG64 seeded with
``(seed, e)``; identity without shuffling). Micro-step n takes the next M = Σ sizes indices of
that order and gives worker r the slice ``[Σ_{j<r} sizes_j, Σ_{j<=r} sizes_j)``; so the union over
workers is the same global batch for any split, and every worker computes the same positions
without communication. An epoch ends when the next optimizer step (``accum_steps`` micro-steps)
no longer fits (the tail is skipped, as with ``drop_last``).

Sizes follow a schedule of ``(first_micro_step, sizes)`` entries. A DataLoader with worker
processes asks for indices ahead of use (``prefetch_depth`` micro-steps), so a new split is
scheduled from a micro-step the loader has not asked for yet; all workers schedule the same
change at the same micro-step. The position (epoch, samples into the epoch, micro-steps since
the start) is exact and restorable.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kplan.core.errors import InputError


@dataclass(frozen=True)
class Position:
    """Where the data stream is: epoch, samples consumed in it, micro-steps since the start."""

    epoch: int
    offset: int
    micro: int


@dataclass(frozen=True)
class MicroBatchInfo:
    """What one yielded micro-batch was: its micro-step index, sizes, and the position after."""

    micro: int
    sizes: tuple[int, ...]
    after: Position


class GlobalBatchSampler:
    """Yields this worker's index lists, one per micro-step (use as a DataLoader batch_sampler)."""

    def __init__(
        self,
        dataset_len: int,
        rank: int,
        world_size: int,
        sizes: Sequence[int],
        *,
        accum_steps: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise InputError(
                f"rank {rank} is not in [0, {world_size})", "ranks go from 0 to world_size - 1"
            )
        if accum_steps < 1:
            raise InputError(f"accum_steps={accum_steps} < 1", "use >= 1")
        self.dataset_len = dataset_len
        self.rank = rank
        self.world_size = world_size
        self.accum_steps = accum_steps
        self.seed = seed
        self.shuffle = shuffle
        self._schedule: list[tuple[int, tuple[int, ...]]] = []
        self._pos = Position(0, 0, 0)
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None
        self._issued: dict[int, MicroBatchInfo] = {}
        self.set_sizes(0, sizes)

    # --- schedule ----------------------------------------------------------------------------

    def _check_sizes(self, sizes: Sequence[int]) -> tuple[int, ...]:
        out = tuple(int(b) for b in sizes)
        if len(out) != self.world_size or any(b < 1 for b in out):
            raise InputError(
                f"sizes {list(out)} must be {self.world_size} integers >= 1", "one per worker"
            )
        if self.accum_steps * sum(out) > self.dataset_len:
            raise InputError(
                f"a step of {self.accum_steps} x {sum(out)} samples exceeds the dataset "
                f"({self.dataset_len} samples)",
                "use a smaller global batch or a larger dataset",
            )
        return out

    def set_sizes(self, first_micro: int, sizes: Sequence[int]) -> None:
        """Use ``sizes`` from micro-step ``first_micro`` on (a step boundary, not yet issued)."""
        checked = self._check_sizes(sizes)
        if first_micro % self.accum_steps:
            raise InputError(
                f"sizes can change only at a step boundary; micro-step {first_micro} is inside "
                f"a step of {self.accum_steps}",
                "change sizes at a multiple of accum_steps",
            )
        if first_micro < self._pos.micro:
            raise InputError(
                f"micro-step {first_micro} was already issued (next is {self._pos.micro})",
                "change sizes from the next micro-step on",
            )
        self._schedule = [e for e in self._schedule if e[0] < first_micro]
        self._schedule.append((first_micro, checked))

    def sizes_at(self, micro: int) -> tuple[int, ...]:
        """The split in force at micro-step ``micro``."""
        current = self._schedule[0][1]
        for first, sizes in self._schedule:
            if first <= micro:
                current = sizes
        return current

    # --- position ----------------------------------------------------------------------------

    @property
    def next_micro(self) -> int:
        """Index of the next micro-step this sampler will issue."""
        return self._pos.micro

    def rewind(self, position: Position) -> None:
        """Restart from ``position`` (a resume, or dropping micro-batches prefetched ahead)."""
        if position.epoch < 0 or position.offset < 0 or position.micro < 0:
            raise InputError(
                f"invalid sampler position {position}", "rewind to a position this sampler issued"
            )
        self._pos = position
        self._issued.clear()
        current = self.sizes_at(position.micro)
        self._schedule = [(position.micro, current)] + [
            e for e in self._schedule if e[0] > position.micro
        ]

    def info(self, micro: int) -> MicroBatchInfo:
        """What micro-step ``micro`` was (once issued); forgets it and everything before."""
        found = self._issued.pop(micro)
        for old in [m for m in self._issued if m < micro]:
            del self._issued[old]
        return found

    def _order(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch or self._perm is None:
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
                self._perm = rng.permutation(self.dataset_len)
            else:
                self._perm = np.arange(self.dataset_len)
            self._perm_epoch = epoch
        return self._perm

    def __iter__(self) -> Iterator[list[int]]:
        """This worker's index lists for the rest of the current epoch."""
        epoch = self._pos.epoch
        order = self._order(epoch)
        while True:
            pos = self._pos
            sizes = self.sizes_at(pos.micro)
            total = sum(sizes)
            if pos.micro % self.accum_steps == 0 and (
                pos.offset + self.accum_steps * total > self.dataset_len
            ):
                self._pos = Position(epoch + 1, 0, pos.micro)
                return
            start = pos.offset + sum(sizes[: self.rank])
            indices = order[start : start + sizes[self.rank]].tolist()
            after = Position(epoch, pos.offset + total, pos.micro + 1)
            self._issued[pos.micro] = MicroBatchInfo(pos.micro, sizes, after)
            self._pos = after
            yield indices

    def __len__(self) -> int:
        """Micro-steps in a whole epoch at the current split."""
        per_step = self.accum_steps * sum(self.sizes_at(self._pos.micro))
        return (self.dataset_len // per_step) * self.accum_steps
