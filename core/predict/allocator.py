"""A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.11), at its default
settings or with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, for replaying an allocation trace: how much memory
the allocator *reserves* for a given sequence of tensor allocations and frees, which is what bounds the batch that
fits (fragmentation reached 20-31% of reserved memory on logits-heavy shapes, where the estimator assumes 5%).

Both modes, as the allocator's source describes them:
- sizes round up to kMinBlockSize (512 bytes); requests up to kSmallSize (1 MiB) come from the small pool, larger
  ones from the large pool; a request takes the smallest free block of its pool that fits (best fit, get_free_block);
  a freed block merges with the free neighbours of its segment (free_block, try_merge_blocks);
- under a cap (set_per_process_memory_fraction, memlab's --gpu-memory), alloc_block refuses when the reserved bytes
  plus get_allocation_size(size) would pass it: kSmallBuffer (2 MiB) for a small request, kLargeBuffer (20 MiB) below
  kMinLargeAlloc (10 MiB), else the size rounded up to kRoundLarge (2 MiB). The allocator then releases its cached
  memory (release_cached_blocks) and asks once more: one retry (num_alloc_retries), then out of memory.

Default mode (`Allocator`): a request that no free block fits gets a segment of its own from cudaMalloc, of
get_allocation_size(size) bytes; the rest of a block is split off when it is at least kMinBlockSize (small pool) or
more than kSmallSize (large pool); the retry frees every wholly free segment (release_blocks).

Expandable mode (`ExpandableAllocator`, Note [Expandable Segments]): each pool has one segment (per stream; one stream
here) that reserves virtual address space and maps physical memory into it in pages of the segment's
`segment_size_`: kSmallBuffer (2 MiB) in the small pool, kLargeBuffer (20 MiB) in the large pool; `reserved` is the
mapped memory. A request that no free block fits (try_allocate_expandable_block) takes the lowest-addressed run of
free and unmapped space that holds it (find_expandable_block: in practice the free block at the segment's end, if
any, and the unmapped space after it) and maps only the whole pages the request still lacks (map_block), merged with
the free block before them. Every split keeps a rest of kMinBlockSize or more (should_split, in both pools), and best
fit passes over a free block that borders unmapped space when a larger one does not (get_free_block: such a block is
sized as what it could grow to). The retry unmaps every whole free page (release_blocks -> unmap_block), wherever it
lies in the segment, and the next growth maps the lowest unmapped gap that, with the free blocks around it, holds
the request.

What it leaves out: streams (one stream: one segment per pool), max_split_size, roundup_power2_divisions,
garbage_collection_threshold and the other PYTORCH_CUDA_ALLOC_CONF settings, release_available_cached_blocks (it does
nothing at the default max_split_size), CUDA graphs' private pools, cudaMalloc or cuMemCreate failing below the cap
(the cap is the only limit), the expandable segment's bound on its address space (numSegments(totalGlobalMem +
totalGlobalMem / 8) pages: taken as unbounded, so a pool never needs a second segment), and real addresses. Best fit
breaks a tie between equal free blocks by address; here, in the large pool, the newer segment wins (the driver
placed each large segment below the ones before it: 2,277 of 2,278 pairs of segments over 20 MiB in one H100 trace,
989 of 990 in another, bench/snapshot_events.py), then the lower offset; in the small pool the older segment.
Older-first had replayed one H100 trace 1.85 GiB short (square gradcp_every2 at 59) and another 1.6% short (long
cce); newer-first replays both to the allocator's own peak and changes no other committed trace.

Used by `memlab estimate --method fake` (memlab.core.predict.trace: one step's trace on fake tensors, replayed
here). Both modes follow torch 2.11's allocator to the byte on hand-made and random traces (bench/allocator_replay.py
--against-cuda, on a GPU); the default mode is also checked against the H100's reserved memory and find-batch's
answers on real training steps (--against-h100). No constant here was fitted to a measurement.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

MIB = 1 << 20
MIN_BLOCK = 512  # kMinBlockSize: every size rounds up to a multiple of this
SMALL = 1 * MIB  # kSmallSize: the small pool's largest request
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer; in expandable mode the small pool's page (segment_size_)
LARGE_SEGMENT = 20 * MIB  # kLargeBuffer: the segment for a request between 1 and 10 MiB; the large pool's page
MIN_OWN_SEGMENT = 10 * MIB  # kMinLargeAlloc: from here a request gets a segment of its own size
ROUND_OWN_SEGMENT = 2 * MIB  # kRoundLarge
UNBOUNDED = 1 << 62  # an expandable segment's address space (the card's memory and an eighth, taken as unbounded)


def rounded(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_bytes(size: int) -> int:
    """get_allocation_size: the segment cudaMalloc'd for a request of `size` (rounded) bytes when no free block fits
    it, and in both modes what the cap check adds to the reserved bytes."""
    if size <= SMALL:
        return SMALL_SEGMENT
    if size < MIN_OWN_SEGMENT:
        return LARGE_SEGMENT
    return -(-size // ROUND_OWN_SEGMENT) * ROUND_OWN_SEGMENT


def page_bytes(small: bool) -> int:
    """An expandable segment's mapping granularity (find_expandable_block's segment_size)."""
    return SMALL_SEGMENT if small else LARGE_SEGMENT


class OutOfMemory(Exception):
    """A request would pass the cap even after the allocator released what it had cached."""


@dataclass(eq=False)
class Block:
    segment: int
    offset: int
    size: int
    small: bool
    free: bool = True
    mapped: bool = True  # False: address space of an expandable segment with no memory behind it
    prev: Block | None = None
    next: Block | None = None

    def key(self) -> tuple[int, int, int]:
        """Best fit's order: size, then address (a newer large segment lies lower: see the module's note)."""
        return (self.size, self.segment if self.small else -self.segment, self.offset)


@dataclass
class Allocator:
    cap: int | None = None  # the allocator's budget in bytes; None: as much as it asks for
    reserved: int = 0
    peak_reserved: int = 0
    allocated: int = 0
    peak_allocated: int = 0
    retries: int = 0
    steps_reserved: int = 0  # the reserve where the steps began (STEPS): the built model's segments
    _segments: int = 0
    _live: dict = field(default_factory=dict)  # id -> Block
    _pools: dict = field(default_factory=lambda: {True: [], False: []})  # small? -> free mapped blocks sorted by key

    def malloc(self, ident: object, nbytes: int) -> None:
        size = rounded(nbytes)
        small = size <= SMALL
        block = self._best_fit(size, small)
        if block is None:
            self._make_room(size, ident)
            block = self._new_memory(size, small)
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
        self._list(self._merge_free_neighbours(block))

    def _best_fit(self, size: int, small: bool) -> Block | None:
        pool = self._pools[small]
        i = bisect.bisect_left(pool, ((size, -UNBOUNDED, -1),))
        return pool[i][1] if i < len(pool) else None

    def _make_room(self, size: int, ident: object) -> None:
        """alloc_block's cap check; past the cap, release_cached_blocks and one retry, then out of memory."""
        if self.cap is None or self.reserved + segment_bytes(size) <= self.cap:
            return
        self.retries += 1
        self._release_cached()
        if self.reserved + segment_bytes(size) > self.cap:
            raise OutOfMemory(f"{ident}: {size:,} bytes with {self.reserved:,} reserved under a cap of {self.cap:,}")

    def _new_memory(self, size: int, small: bool) -> Block:
        """A new cudaMalloc'd segment, wholly free and not in the pool."""
        grow = segment_bytes(size)
        self._segments += 1
        self._add_reserved(grow)
        return Block(self._segments, 0, grow, small)

    def _add_reserved(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _split_rest(self, block: Block, rest: int) -> bool:
        return rest >= MIN_BLOCK if block.small else rest > SMALL

    def _split(self, block: Block, size: int) -> None:
        """should_split, then alloc_found_block: the rest goes back to the pool as a free block."""
        if self._split_rest(block, block.size - size):
            self._list(self._cut(block, size))

    @staticmethod
    def _cut(block: Block, size: int) -> Block:
        """Leave `block` its first `size` bytes and return the rest, a block in the same state, linked after it."""
        tail = Block(block.segment, block.offset + size, block.size - size, block.small, block.free, block.mapped,
                     prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = tail
        block.next, block.size = tail, size
        return tail

    def _merge_free_neighbours(self, block: Block) -> Block:
        """try_merge_blocks with both neighbours: only a free one in the same state (mapped or not) merges."""
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free and neighbour.mapped == block.mapped:
                self._unlist(neighbour)
                block = self._merge(block, neighbour)
        return block

    @staticmethod
    def _merge(block: Block, neighbour: Block) -> Block:
        first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        return first

    def _release_cached(self) -> None:
        """release_blocks: cudaFree every wholly free segment."""
        for small, pool in self._pools.items():
            whole = [entry for entry in pool if entry[1].prev is None and entry[1].next is None]
            self.reserved -= sum(b.size for _, b in whole)
            self._pools[small] = [entry for entry in pool if not (entry[1].prev is None and entry[1].next is None)]

    def _list(self, block: Block) -> None:
        bisect.insort(self._pools[block.small], (block.key(), block))

    def _unlist(self, block: Block) -> None:
        pool = self._pools[block.small]
        pool.pop(bisect.bisect_left(pool, (block.key(),)))


@dataclass
class ExpandableAllocator(Allocator):
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: one growable segment per pool, mapped page by page."""

    _unmapped: dict = field(default_factory=lambda: {True: [], False: []})  # small? -> unmapped blocks by address

    def _best_fit(self, size: int, small: bool) -> Block | None:
        """get_free_block: the smallest free block that fits, but a block that borders unmapped space is sized as what
        it could grow to, so the next larger block is taken instead while its own reach is smaller."""
        pool = self._pools[small]
        i = bisect.bisect_left(pool, ((size, -UNBOUNDED, -1),))
        if i == len(pool):
            return None
        while i + 1 < len(pool) and _reach(pool[i + 1][1]) < _reach(pool[i][1]):
            i += 1
        return pool[i][1]

    def _split_rest(self, block: Block, rest: int) -> bool:
        return rest >= MIN_BLOCK  # should_split: with expandable segments on, the small pool's rule in both pools

    def _new_memory(self, size: int, small: bool) -> Block:
        """try_allocate_expandable_block: map pages after the chosen free space until one free block holds `size`."""
        block = self._free_address_space(size, small)
        if not block.mapped:
            block = self._map(block, min(block.size, size))
        while block.size < size:
            block = self._map(block.next, min(size - block.size, block.next.size))
        self._unlist(block)
        return block

    def _free_address_space(self, size: int, small: bool) -> Block:
        """find_expandable_block: the lowest unmapped gap which, from the free block before it (if any) through the
        free and unmapped blocks after it, spans `size`; the first request of a pool reserves its segment."""
        for _, gap in self._unmapped[small]:
            start = gap.prev if gap.prev is not None and gap.prev.free else gap
            if _spans(start, size):
                return start
        self._segments += 1
        segment = Block(self._segments, 0, UNBOUNDED, small, mapped=False)
        self._list(segment)
        return segment

    def _map(self, block: Block, nbytes: int) -> Block:
        """map_block: whole pages from the start of an unmapped block (the rest stays unmapped), merged with the free
        blocks beside them."""
        page = page_bytes(block.small)
        mapped = -(-nbytes // page) * page
        self._unlist(block)
        if mapped < block.size:
            self._list(self._cut(block, mapped))
        block.mapped = True
        self._add_reserved(mapped)
        block = self._merge_free_neighbours(block)
        self._list(block)
        return block

    def _release_cached(self) -> None:
        """release_blocks -> unmap_block: every whole page inside a free block is unmapped (a wholly unmapped segment
        is released too, which changes nothing here: a pool's next request would reserve the same space again)."""
        for small in (False, True):
            for _, block in list(self._pools[small]):
                self._unmap_whole_pages(block)

    def _unmap_whole_pages(self, block: Block) -> None:
        page = page_bytes(block.small)
        begin = -(-block.offset // page) * page
        end = (block.offset + block.size) // page * page
        if end <= begin:
            return
        self._unlist(block)
        if end < block.offset + block.size:
            self._list(self._cut(block, end - block.offset))  # the free part of the last page stays mapped
        if begin > block.offset:
            before, block = block, self._cut(block, begin - block.offset)  # and so does the first page's
            self._list(before)
        block.mapped = False
        self.reserved -= block.size
        self._list(self._merge_free_neighbours(block))

    def _list(self, block: Block) -> None:
        if block.mapped:
            super()._list(block)
        else:
            bisect.insort(self._unmapped[block.small], ((block.segment, block.offset), block))

    def _unlist(self, block: Block) -> None:
        if block.mapped:
            super()._unlist(block)
        else:
            pool = self._unmapped[block.small]
            pool.pop(bisect.bisect_left(pool, ((block.segment, block.offset),)))


def _reach(block: Block) -> int:
    """get_free_block's expandable_size: a free block and the unmapped space right after it."""
    return block.size + (block.next.size if block.next is not None and not block.next.mapped else 0)


def _spans(start: Block, size: int) -> bool:
    """find_expandable_block's has_available_address_space: the free or unmapped blocks from `start` span `size`."""
    total, block = 0, start
    while total < size and block is not None and block.free:
        total, block = total + block.size, block.next
    return total >= size


CAPTURE = "capture"  # an event marking where a CUDA graph's capture begins (cuda_graph.enabled)
PHASE = "phase"  # an event marking where a step's phase begins (trace.fake_trace's `phases`): no allocation
STEPS = "steps"  # where the training steps begin: a run's meters reset the peaks there (the model is built)
EMPTY_CACHE = "empty_cache"  # torch.cuda.empty_cache(): every wholly free segment released


@dataclass
class GraphedAllocator:
    """The general pool and, from a CUDA graph's capture on, the graph's private pool, under one cap. Capturing
    (memlab.core.techniques.cuda_graph) first empties the general pool's cache; what the captured step allocates
    then comes from the private pool, which cannot use the general pool's free blocks nor lend it its own, and which
    the graph keeps. What was allocated before is freed into the pool it came from. The private pool uses the
    ordinary segments with expandable segments on too: as we read CUDACachingAllocator.cpp, expandable segments are
    not used for a private pool."""

    main: Allocator
    graph: Allocator | None = None
    peak_allocated: int = 0
    peak_reserved: int = 0

    def capture(self) -> None:
        self.main._release_cached()
        self.graph = Allocator(None if self.main.cap is None else self.main.cap - self.main.reserved)
        self.peak_allocated, self.peak_reserved = self.main.peak_allocated, self.main.peak_reserved

    def malloc(self, ident: object, nbytes: int) -> None:
        (self.graph or self.main).malloc(ident, nbytes)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, ident: object) -> None:
        owner = self.graph if self.graph is not None and ident in self.graph._live else self.main
        owner.free(ident)

    def _pools(self) -> list[Allocator]:
        return [self.main] + ([self.graph] if self.graph is not None else [])

    @property
    def reserved(self) -> int:
        return sum(a.reserved for a in self._pools())

    @property
    def allocated(self) -> int:
        return sum(a.allocated for a in self._pools())

    @property
    def retries(self) -> int:
        return sum(a.retries for a in self._pools())

    @property
    def steps_reserved(self) -> int:
        return self.main.steps_reserved


def replay(events: list[tuple], cap: int | None = None, expandable: bool = False) -> Allocator | GraphedAllocator:
    """Run ("alloc", id, bytes, ...) / ("free", id, ...) events through the model, with expandable segments or
    without; raises OutOfMemory under `cap`. The model's `retries` counts the requests that needed a release. A
    CAPTURE event moves what follows into a CUDA graph's private pool (GraphedAllocator)."""
    model: Any = ExpandableAllocator(cap) if expandable else Allocator(cap)
    for event in events:
        if event[0] == CAPTURE:
            model = GraphedAllocator(model)
            model.capture()
        else:
            replayed(model, event)
    return model


def replayed(model: Allocator, event: tuple) -> None:
    """One event of a trace through the allocator model (any but CAPTURE, which replaces the model)."""
    action, ident, nbytes = event[:3]
    if action == "alloc":
        model.malloc(ident, nbytes)
    elif action == STEPS:  # the meters' torch.cuda.reset_peak_memory_stats(): the peaks are the steps' own
        model.peak_allocated, model.peak_reserved = model.allocated, model.reserved
        model.steps_reserved = model.reserved
    elif action == EMPTY_CACHE:
        model._release_cached()
    elif action != PHASE:
        model.free(ident)
