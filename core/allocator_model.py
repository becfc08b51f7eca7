"""A model of PyTorch's CUDA caching allocator at its default settings (c10/cuda/CUDACachingAllocator.cpp), for
replaying an allocation trace: how much memory the allocator *reserves* for a given sequence of tensor allocations
and frees, which is what bounds the batch that fits (issue 17: fragmentation reached 20-31% of reserved memory on
logits-heavy shapes, where the estimator assumes 5%).

What it models, as the allocator's source describes it:
- sizes round up to 512 bytes; requests up to 1 MiB come from the small pool, in 2 MiB segments; larger ones from
  the large pool, in 20 MiB segments below 10 MiB and in segments of their own size (rounded to 2 MiB) above;
- a request takes the smallest free block of its pool that fits (best fit), split when the rest is at least 512
  bytes (small pool) or more than 1 MiB (large pool); a freed block merges with free neighbours of its segment;
- under a cap (set_per_process_memory_fraction, memlab's --gpu-memory), a new segment that would pass it first
  releases every wholly free segment (one allocator retry) and fails (out of memory) if it still does not fit.
What it leaves out: streams (one stream), max_split_size and the other PYTORCH_CUDA_ALLOC_CONF settings,
expandable segments, and real addresses (ties between equal free blocks go to the older segment).

Used by `memlab estimate --method fake` (memlab.core.allocation_trace: one step's trace on fake tensors, replayed
here). Checked against the H100's own reserved memory by bench/allocator_replay.py --against-h100.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIB = 1 << 20
MIN_BLOCK = 512  # kMinBlockSize: every size rounds up to a multiple of this
SMALL = 1 * MIB  # kSmallSize: the small pool's largest request
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer
LARGE_SEGMENT = 20 * MIB  # kLargeBuffer: the segment for a request between 1 and 10 MiB
MIN_OWN_SEGMENT = 10 * MIB  # kMinLargeAlloc: from here a request gets a segment of its own size
ROUND_OWN_SEGMENT = 2 * MIB  # kRoundLarge


def rounded(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_bytes(size: int) -> int:
    """The segment cudaMalloc'd for a request of `size` (rounded) bytes when no free block fits it."""
    if size <= SMALL:
        return SMALL_SEGMENT
    if size < MIN_OWN_SEGMENT:
        return LARGE_SEGMENT
    return -(-size // ROUND_OWN_SEGMENT) * ROUND_OWN_SEGMENT


class OutOfMemory(Exception):
    """A new segment would pass the cap even after every wholly free segment was released."""


@dataclass(eq=False)
class Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    prev: Block | None = None
    next: Block | None = None

    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass
class Allocator:
    cap: int | None = None  # the allocator's budget in bytes; None: as much as it asks for
    reserved: int = 0
    peak_reserved: int = 0
    allocated: int = 0
    peak_allocated: int = 0
    retries: int = 0
    _segments: int = 0
    _live: dict = field(default_factory=dict)  # id -> Block
    _pools: dict = field(default_factory=lambda: {True: [], False: []})  # small? -> free blocks sorted by key

    def malloc(self, ident: object, nbytes: int) -> None:
        size = rounded(nbytes)
        small = size <= SMALL
        block = self._best_fit(size, small)
        if block is None:
            block = self._new_segment(size, small, ident)
        else:
            self._unlist(block)
        self._split(block, size)
        block.free = False
        self._live[ident] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, ident: object) -> None:
        block = self._live.pop(ident, None)
        if block is None:
            return  # allocated before the trace began
        self.allocated -= block.size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free:
                self._unlist(neighbour)
                block = self._merge(block, neighbour)
        self._list(block)

    def _best_fit(self, size: int, small: bool) -> Block | None:
        pool = self._pools[small]
        i = bisect.bisect_left(pool, ((size, -1, -1),))
        return pool[i][1] if i < len(pool) else None

    def _new_segment(self, size: int, small: bool, ident: object) -> Block:
        grow = segment_bytes(size)
        if self.cap is not None and self.reserved + grow > self.cap:
            self.retries += 1
            self._release_free_segments()
            if self.reserved + grow > self.cap:
                raise OutOfMemory(f"{ident}: {size:,} bytes with {self.reserved:,} reserved under a cap of {self.cap:,}")
        self._segments += 1
        self.reserved += grow
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return Block(self._segments, 0, grow, small)

    def _split(self, block: Block, size: int) -> None:
        rest = block.size - size
        if rest >= MIN_BLOCK if block.small else rest > SMALL:
            tail = Block(block.segment, block.offset + size, rest, block.small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._list(tail)

    @staticmethod
    def _merge(block: Block, neighbour: Block) -> Block:
        first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _release_free_segments(self) -> None:
        for small, pool in self._pools.items():
            whole = [entry for entry in pool if entry[1].prev is None and entry[1].next is None]
            self.reserved -= sum(b.size for _, b in whole)
            self._pools[small] = [entry for entry in pool if not (entry[1].prev is None and entry[1].next is None)]

    def _list(self, block: Block) -> None:
        bisect.insort(self._pools[block.small], (block.key(), block))

    def _unlist(self, block: Block) -> None:
        pool = self._pools[block.small]
        pool.pop(bisect.bisect_left(pool, (block.key(),)))


def replay(events: list[tuple], cap: int | None = None) -> Allocator:
    """Run ("alloc", id, bytes, ...) / ("free", id, ...) events through the model; raises OutOfMemory under `cap`."""
    model = Allocator(cap)
    for action, ident, nbytes, *_ in events:
        if action == "alloc":
            model.malloc(ident, nbytes)
        else:
            model.free(ident)
    return model
