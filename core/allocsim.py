"""A simplified model of PyTorch's CUDA caching allocator, to turn a step's sequence of tensor allocations and frees
(recorded on fake tensors, memlab.core.memsnapshot.fake_trace) into the allocator's *reserved* peak: what a run
without allocator retries must keep under its budget (memlab find-batch counts a probe that needed a retry as not
fitting). Written from the behaviour of c10/cuda/CUDACachingAllocator.cpp (torch 2.x defaults), simplified:

- requests round up to 512 B; <= 1 MiB is the small pool (2 MiB segments), larger the large pool: requests under
  10 MiB get a 20 MiB segment, larger ones a segment of their size rounded up to 2 MiB;
- a request takes the smallest free cached block of its pool that holds it, split when the remainder is worth
  keeping (small pool: >= 512 B; large pool: > 1 MiB);
- a freed block merges with free neighbours of its segment; segments are never released (no retries, one stream);
- expandable segments (allocator.expandable_segments): one segment per pool that grows at its end in 2 MiB pages,
  so a request that no free block holds maps only what the segment's free tail lacks.

Reserved = the sum of the segments' sizes; it only grows, so its peak is its final value.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

KIB, MIB = 1 << 10, 1 << 20
MIN_BLOCK = 512
SMALL_SIZE = 1 * MIB  # the largest request of the small pool
SMALL_BUFFER = 2 * MIB  # a small pool's segment
LARGE_BUFFER = 20 * MIB  # a large pool's segment for requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB
PAGE = 2 * MIB  # an expandable segment grows by whole pages


def round_size(n: int) -> int:
    return MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK


def segment_size(n: int) -> int:
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-n // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class _Block:
    addr: int
    size: int
    small: bool
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class _Pool:
    small: bool
    free: list[tuple[int, int, _Block]] = field(default_factory=list)  # (size, addr, block), sorted: best fit first
    tail: _Block | None = None  # expandable: the last block of the one segment

    def add(self, b: _Block) -> None:
        bisect.insort(self.free, (b.size, b.addr, b), key=lambda e: (e[0], e[1]))

    def remove(self, b: _Block) -> None:
        i = bisect.bisect_left(self.free, (b.size, b.addr), key=lambda e: (e[0], e[1]))
        del self.free[i]

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.free, (size, -1), key=lambda e: (e[0], e[1]))
        return self.free[i][2] if i < len(self.free) else None


class CachingAllocator:
    """alloc(key, nbytes) / free(key), with `allocated`, `reserved` and their peaks in bytes."""

    def __init__(self, expandable: bool = False):
        self.expandable = expandable
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.live: dict[object, _Block] = {}
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self._next_addr = 0

    def alloc(self, key: object, nbytes: int) -> None:
        size = round_size(nbytes)
        pool = self.pools[size <= SMALL_SIZE]
        b = pool.best_fit(size)
        if b is not None:
            pool.remove(b)
        else:
            b = self._grow(pool, size)
        self._split(pool, b, size)
        b.free = False
        self.live[key] = b
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: object) -> None:
        b = self.live.pop(key, None)
        if b is None:
            return
        self.allocated -= b.size
        b.free = True
        pool = self.pools[b.small]
        for n in (b.prev, b.next):
            if n is not None and n.free:
                pool.remove(n)
                self._merge(b, n)
        pool.add(b)

    def _grow(self, pool: _Pool, size: int) -> _Block:
        """A new segment, or (expandable) the free tail of the pool's segment grown to hold `size`."""
        if self.expandable:
            tail = pool.tail
            if tail is not None and tail.free:
                pool.remove(tail)
                extra = -(-(size - tail.size) // PAGE) * PAGE
                tail.size += extra
                self._reserve(extra)
                return tail
            seg = -(-size // PAGE) * PAGE
            b = _Block(self._take_addr(seg), seg, pool.small, prev=tail)
            if tail is not None:
                tail.next = b
            pool.tail = b
        else:
            seg = segment_size(size)
            b = _Block(self._take_addr(seg), seg, pool.small)
        self._reserve(seg)
        return b

    def _split(self, pool: _Pool, b: _Block, size: int) -> None:
        rest = b.size - size
        if rest < MIN_BLOCK if pool.small else rest <= SMALL_SIZE:
            return  # the block is handed out whole
        r = _Block(b.addr + size, rest, pool.small, prev=b, next=b.next)
        if b.next is not None:
            b.next.prev = r
        elif pool.tail is b:
            pool.tail = r
        b.next, b.size = r, size
        pool.add(r)

    def _merge(self, b: _Block, n: _Block) -> None:
        """Fold free neighbour `n` into `b` (either side)."""
        pool = self.pools[b.small]
        if n is b.prev:
            b.addr, b.prev = n.addr, n.prev
            if n.prev is not None:
                n.prev.next = b
        else:
            b.next = n.next
            if n.next is not None:
                n.next.prev = b
            if pool.tail is n:
                pool.tail = b
        b.size += n.size

    def _take_addr(self, seg: int) -> int:
        a = self._next_addr
        self._next_addr += seg + (1 << 40 if not self.expandable else 0)  # segments never touch: no merging across
        return a

    def _reserve(self, n: int) -> None:
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)


def replay(events: list[tuple[str, object, int]], *, expandable: bool = False) -> CachingAllocator:
    """Run ("alloc", key, nbytes) / ("free", key, 0) events through a fresh allocator."""
    a = CachingAllocator(expandable)
    for kind, key, n in events:
        if kind == "alloc":
            a.alloc(key, n)
        else:
            a.free(key)
    return a
