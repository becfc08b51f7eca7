"""A deep model's step trace made from a shallow one's. A decoder stack repeats one block, so the allocations of a
step on SHALLOW blocks, cut block by block, hold everything the step on the model's own depth allocates: the first
two blocks' and the last two's as they are, and one middle block's repeated for every block in between, each copy
under keys of its own. Tracing 5 blocks instead of an 8B model's 32 is what makes `memlab fit` seconds, not minutes.

Each event belongs to a block's run or to none: in forward and backward, to the block whose forward or backward is
running (the trace's BLOCK marks, from hooks on the blocks); before the steps, a block's parameters and buffers to
their block; elsewhere (the optimizer, casts of the weights), an allocation to the block of the tensors it was made
from (for a list op, the tensor at its own place in the list), a free to the block of what it frees. Consecutive runs
of blocks 0, 1, ..., SHALLOW - 1 (or down) are one stretch of the step; each is rebuilt at the model's depth.

Nothing is assumed: the middle blocks must allocate the same sizes in the same order, and the middle block and its
successor must free the same of their neighbours', or `deepened` answers None and the step is traced at its depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memlab.core.predict.allocator import PHASE

BLOCK = "block"  # (BLOCK, i, 0, ""): block i's forward or backward runs from here (the trace's hooks)
SHALLOW = 5  # blocks traced: 0 and 1 as they are, 2 the middle one repeated (checked against 3), 3 and 4 as the last
MIDDLE = 2
BURST_BLOCKS = 3  # frees of this many blocks' tensors at once are no one block's (_frees_in_block_order)
refusal = [""]  # why the last `deepened` answered None (bench/deepen_check.py prints it)


@dataclass
class _Item:
    block: int | None  # whose run the event is in (None: no block's)
    event: tuple
    canon: tuple = ()  # the event with its keys relative to `block`: ("alloc", bytes, op, n) / ("free", ref)
    grows: int = 0  # bytes more for each block added (a stack of every block's tensors: clipping's norms)


@dataclass(frozen=True)
class Owners:
    """What the trace knew about the keys: `params` each block's parameters' and buffers' keys (block index) as the
    steps begin, `sources` an allocation's event index -> the keys of the tensors it was made from."""

    params: dict[Any, int]
    sources: dict[int, tuple]
    steps_at: int  # the index of the event where the steps begin (before it: the model's build)


def deepened(events: list[tuple], owners: Owners, depth: int) -> list[tuple] | None:
    """`events` (a trace on SHALLOW blocks, with BLOCK marks) at `depth` blocks, the marks gone; None where the
    blocks do not repeat as the rebuilding needs."""
    refusal[0] = ""
    items = _owned(events, owners)
    if items is None:
        return None
    out: list[tuple] = []
    for stretch in _stretches(items):
        made = _rebuilt(stretch, depth)
        if made is None:
            return None
        out += made
    if not _consistent(out):
        refusal[0] = "the made trace frees a key that is not live"
        return None
    return out


def _owned(events: list[tuple], owners: Owners) -> list[_Item] | None:
    """Each event with the block whose run it is in and its canonical form (keys named by block and ordinal)."""
    built = _built_blocks(events, owners)
    live: dict[Any, tuple[int | None, int, int]] = {}  # key -> (its block, its ordinal among the block's, its bytes)
    counts: dict[int, int] = {}
    marked: int | None = None  # the block whose forward or backward runs now
    previous: int | None = None
    items: list[_Item] = []
    for i, ev, burst_of_many in _frees_in_block_order(events, live):
        action = ev[0]
        if action == BLOCK:
            marked = ev[1]
            continue
        if action == PHASE:  # a phase's start ends any block's run
            marked = None
        if action == "alloc":
            block = _made_for(i, marked, previous, built, owners, live)
            n = counts.get(block, 0) if block is not None else -1
            if block is not None:
                counts[block] = n + 1
            if ev[1] in live:
                refusal[0] = f"event {i}: a live key made again"
                return None
            grows = _grows(i, ev, marked, owners, live)
            if grows is None:
                refusal[0] = f"event {i}: {ev[3]} made from many blocks' tensors, not their sum"
                return None
            live[ev[1]] = (block, n, ev[2])
            items.append(_Item(block, ev, ("alloc", ev[2], ev[3], n), grows))
        elif action == "free":
            if ev[1] not in live:
                refusal[0] = f"event {i}: a key freed that is not live"
                return None
            owner, n, _ = live.pop(ev[1])
            block = _freed_in(owner, marked, previous, burst_of_many)
            ref = ("global", ev[1]) if owner is None else ("block", owner - block, n)
            items.append(_Item(block, ev, ("free", ref)))
        else:
            items.append(_Item(None, ev))
        previous = items[-1].block if action in ("alloc", "free") else None
    return items


def _freed_in(owner: int | None, marked: int | None, previous: int | None, burst_of_many: bool) -> int | None:
    """The run a free belongs to: the running block's (forward, backward), else the freed block's own, or the next
    block's where it frees the last block's temporaries as that block's work begins (a per-parameter loop)."""
    if burst_of_many or marked is None:
        return previous if owner is not None and previous == owner + 1 and not burst_of_many else owner
    return marked


def _frees_in_block_order(events: list[tuple], live: dict) -> Any:
    """(index, event, whether it is in a burst of frees of BURST_BLOCKS blocks or more), in order, but each run of
    consecutive frees sorted by the block and ordinal of what it frees (`live`, as _owned fills it): the allocator
    ends a run of frees in the same state in any order, and autocast frees its cast weights, all blocks' at once,
    in its hash table's order. Such a burst is no block's work: each free goes to the run of the block it frees."""
    i = 0
    while i < len(events):
        if events[i][0] != "free":
            yield i, events[i], False
            i += 1
            continue
        end = i
        while end < len(events) and events[end][0] == "free":
            end += 1
        burst = sorted(range(i, end), key=lambda j: _block_order(live.get(events[j][1])))
        many = len({_block_order(live.get(events[j][1]))[0] for j in burst} - {-1}) >= BURST_BLOCKS
        yield from ((j, events[j], many) for j in burst)
        i = end


def _block_order(owned: tuple[int | None, int, int] | None) -> tuple[int, int]:
    block, n, _ = owned if owned is not None else (None, 0, 0)
    return (-1 if block is None else block, n)


def _built_blocks(events: list[tuple], owners: Owners) -> dict[int, int]:
    """Before the steps, each allocation's block: a block's parameters' and buffers' last, and, back from them,
    what each was made from (peft's adapter, made then cast to bf16: the cast is the parameter)."""
    latest: dict[Any, int] = {}  # key -> the index of its allocation now live
    made_from: dict[int, list[int]] = {}
    for i, ev in enumerate(events[:owners.steps_at]):
        if ev[0] == "alloc":
            made_from[i] = [latest[k] for k in owners.sources.get(i, ()) if k in latest]
            latest[ev[1]] = i
    built = {i: owners.params[key] for key, i in latest.items() if key in owners.params}
    for i in reversed(range(owners.steps_at)):
        for j in made_from.get(i, []) if i in built else []:
            built.setdefault(j, built[i])
    return built


def _grows(i: int, ev: tuple, marked: int | None, owners: Owners, live: dict) -> int | None:
    """What an allocation made from BURST_BLOCKS blocks' tensors or more (outside a block's run) grows by for each
    block added: the middle block's share where it is their concatenation (torch.stack of every parameter's norm);
    None where it is something else, which the making cannot scale."""
    made_from = [live[k] for k in owners.sources.get(i, ()) if k in live] if marked is None else []
    if len({block for block, _, _ in made_from} - {None}) < BURST_BLOCKS:
        return 0
    if ev[2] != sum(nbytes for _, _, nbytes in made_from):
        return None
    return sum(nbytes for block, _, nbytes in made_from if block == MIDDLE)


def _made_for(i: int, marked: int | None, previous: int | None, built: dict[int, int], owners: Owners,
              live: dict) -> int | None:
    if marked is not None:
        return marked
    if i in built:
        return built[i]
    known = [live[k][0] for k in owners.sources.get(i, ()) if k in live]  # (a view's base, freed, is not)
    if known:
        return next((block for block in known if block is not None), None)
    return previous  # made from no traced tensor (a fresh scalar, a constant lifted): the run it is made in


def _stretches(items: list[_Item]) -> list[list[_Item]]:
    """The events cut where the block sequence stops stepping by one: each piece is a no-block run or a stretch of
    consecutive blocks' runs (up or down)."""
    pieces: list[list[_Item]] = []
    step = 0  # +1 or -1 within a stretch of blocks
    for item in items:
        here = pieces[-1][-1].block if pieces else None
        if pieces and item.block == here:
            pieces[-1].append(item)
            continue
        if here is not None and item.block is not None and item.block - here in (1, -1) \
                and step in (0, item.block - here):
            step = item.block - here
            pieces[-1].append(item)
            continue
        step = 0
        pieces.append([item])
    return pieces


def _rebuilt(stretch: list[_Item], depth: int) -> list[tuple] | None:
    """One stretch at `depth` blocks: a no-block run as it is; blocks 0, 1 as they are, SHALLOW - 2 and SHALLOW - 1
    as the last two, MIDDLE repeated for every block between."""
    if stretch[0].block is None:
        return [item.event for item in stretch]
    runs: dict[int, list[_Item]] = {}
    order: list[int] = []
    for item in stretch:
        if item.block not in runs:
            order.append(item.block)
            runs[item.block] = []
        runs[item.block].append(item)
    if MIDDLE in runs and not _repeats(runs):
        refusal[0] = f"blocks {order}: the middle block does not repeat"
        return None
    out: list[tuple] = []
    for block in order:
        if block == MIDDLE:
            middle = range(MIDDLE, depth - SHALLOW + MIDDLE + 1)
            for m in middle if order[0] < order[-1] else reversed(middle):
                out += _made_as(runs[MIDDLE], m, depth, copy=True)
        else:
            out += _made_as(runs[block], _at_depth(block, depth), depth, copy=False)
    return out


def _at_depth(block: int, depth: int) -> int:
    """Where a traced block other than the middle one sits at `depth` blocks: the first ones first, the last last."""
    return block if block < MIDDLE else depth - SHALLOW + block


def _repeats(runs: dict[int, list[_Item]]) -> bool:
    """The middle block and its neighbours allocate alike, and the middle block frees what its successor frees,
    each relative to itself: then every block between repeats the middle one."""
    if not all(b in runs for b in (MIDDLE - 1, MIDDLE, MIDDLE + 1)):
        return False
    made = {b: [it.canon for it in runs[b] if it.canon[0] == "alloc"] for b in (MIDDLE - 1, MIDDLE, MIDDLE + 1)}
    same_made = made[MIDDLE - 1] == made[MIDDLE] == made[MIDDLE + 1]
    return same_made and [it.canon for it in runs[MIDDLE]] == [it.canon for it in runs[MIDDLE + 1]]


def _made_as(run: list[_Item], at: int, depth: int, copy: bool) -> list[tuple]:
    """A block's run as block `at`'s: its allocations keyed ("deep", at, n), its frees keyed to match: a copy of
    the middle block frees its neighbours' as the middle block does (relative to itself), a traced block frees the
    middle block's neighbour to itself and any other traced block's where that block sits at `depth`."""
    out = []
    for item in run:
        if item.canon[0] == "alloc":
            _, nbytes, op, n = item.canon
            out.append(("alloc", ("deep", at, n), nbytes + item.grows * (depth - SHALLOW), op))
            continue
        ref = item.canon[1]
        if ref[0] == "global":
            out.append(("free", ref[1], *item.event[2:]))
            continue
        _, delta, n = ref
        owner = item.block + delta
        target = at + delta if copy or owner == MIDDLE else _at_depth(owner, depth)
        out.append(("free", ("deep", target, n), *item.event[2:]))
    return out


def _consistent(events: list[tuple]) -> bool:
    """Every free frees a live block and no live key is made again (a rebuilt stretch that referred past the
    model's ends would not be)."""
    live: set = set()
    for ev in events:
        if ev[0] == "alloc":
            if ev[1] in live:
                return False
            live.add(ev[1])
        elif ev[0] == "free":
            if ev[1] not in live:
                return False
            live.discard(ev[1])
    return True
