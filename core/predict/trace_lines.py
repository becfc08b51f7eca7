"""A step's fake trace as lines in the micro-batch, for the allocator replay's max-batch search.

The step allocates the same storages in the same order at every micro-batch, each of a size a + b x micro-batch
(activations grow with it; weights and optimizer state do not), or a kernel's rule (`Sized`: a reduction's staging
buffer, the embedding backward's blocks) at such a shape. So three traces, made canonical (`canonical`: ids
renumbered, as a fake storage's id is its address), give every other where they agree on all but those sizes and
the sizes lie on lines: `StepTraces.at` then builds the trace at any micro-batch without running the step. A trace
costs about a second even on the tiny experiment, and `memlab estimate`'s max-batch search asks for thirty or more.

Where the events change with the micro-batch (a chunked loss's chunk count; a staging buffer a reduction takes only
above some size), the traces disagree and the step is traced at each batch until three agree. Where lines fit there
but not at the batches the search ends on, `lines_hold` (those batches traced for real, compared event by event)
says so, and the caller searches again on real traces (allocation_trace.replayed_max_batch).
"""

from __future__ import annotations

from typing import Callable

Event = tuple  # as allocation_trace.Event: (action, id, bytes, where)


class Sized(int):
    """A block's bytes as a function of a shape, `rule(*constants, *shape)`: a kernel's own block (a reduction's
    staging buffer, the embedding backward's partial sums) rounds to its launch shape, so its size is not affine in
    the micro-batch where the shape it comes from is. StepTraces fits lines through the shape and asks the rule."""

    rule: Callable[..., int]
    constants: tuple
    shape: tuple[int, ...]

    def __new__(cls, rule: Callable[..., int], constants: tuple, shape: tuple[int, ...]) -> Sized:
        self = super().__new__(cls, rule(*constants, *shape))
        self.rule, self.constants, self.shape = rule, constants, tuple(shape)
        return self

    def __getnewargs__(self) -> tuple:  # pickle and copy build it again from its rule, not from its value
        return self.rule, self.constants, self.shape


def canonical(events: list[Event]) -> list[Event]:
    """`events` with each allocation's id replaced by its serial number among the allocations (a free names the
    serial of the live allocation it frees; one of a storage made before the trace, None, which the allocator model
    ignores as it ignores an unknown id), and each run of frees in serial order: two traces of the same step then
    compare equal event for event. Storages that die together (a dict of tensors dropped) go in an order set by
    their addresses, which differs from trace to trace; the allocator model ends a run of frees in the same state
    whatever their order (it merges neighbours and releases nothing on a free)."""
    live: dict[object, int] = {}
    made = 0
    out: list[Event] = []
    for event in events:
        action, ident = event[0], event[1]
        if action == "alloc":
            live[ident], made = made, made + 1
            out.append((action, live[ident], *event[2:]))
        elif action == "free":
            out.append((action, live.pop(ident, None), *event[2:]))
        else:
            out.append(event)
    return _frees_in_order(out)


def _frees_in_order(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    run: list[Event] = []
    for event in events + [("end",)]:
        if event[0] == "free":
            run.append(event)
            continue
        out.extend(sorted(run, key=lambda e: -1 if e[1] is None else e[1]))
        run = []
        out.append(event)
    return out[:-1]


class StepTraces:
    """The step's canonical traces by micro-batch (`at`): traced, each remembered, until lines through the three
    largest traced so far fit (`fit`, tried after each new trace), then off the lines; `lines_hold` checks them."""

    def __init__(self, trace: Callable[[int], list[Event]]) -> None:
        self._trace = trace
        self._traced: dict[int, list[Event]] = {}
        self._lines: list[tuple[Event, list[tuple[int, int]] | None]] | None = None  # each event, its lines (fit)
        self._failed = 0  # how many times lines failed lines_hold: after two, no more are fitted
        self._unfit: list[int] = []  # the last three batches lines did not fit through: not compared again

    def traced_at(self, b: int) -> list[Event]:
        if b not in self._traced:
            self._traced[b] = canonical(self._trace(b))
        return self._traced[b]

    def fit(self, batches: tuple[int, int, int]) -> bool:
        """Lines through the traces at three distinct micro-batches, if they agree on every event but its size and
        every size is affine in the micro-batch there, with whole bytes per sample."""
        (b1, b2, b3), self._lines = sorted(batches), None
        t1, t2, t3 = (self.traced_at(b) for b in (b1, b2, b3))
        if not len(t1) == len(t2) == len(t3):
            return False
        lines = []
        for e1, e2, e3 in zip(t1, t2, t3):
            if not _alike(e1, e2) or not _alike(e1, e3):
                return False
            if e1[0] != "alloc":
                lines.append((e1, None))
                continue
            sizes = (e1[2], e2[2], e3[2])
            if any(isinstance(size, Sized) for size in sizes):
                if not _one_rule(sizes):
                    return False
                points = tuple(zip(*(size.shape for size in sizes)))  # a line through each of the shape's numbers
            else:
                points = (sizes,)
            through = [_line((b1, b2, b3), values) for values in points]
            if None in through:
                return False
            lines.append((e1, through))
        self._lines = lines
        return True

    def at(self, b: int) -> list[Event]:
        """The trace at `b`: off the lines where they fit, else traced (then lines tried through the largest three)."""
        if self._lines is not None:
            return [e if through is None else (e[0], e[1], _size_at(e[2], through, b), *e[3:]) for e, through in self._lines]
        trace = self.traced_at(b)
        largest = sorted(self._traced)[-3:]
        if self._failed < 2 and len(largest) == 3 and largest != self._unfit and not self.fit(tuple(largest)):
            self._unfit = largest
        return trace

    @property
    def fitted(self) -> bool:
        return self._lines is not None

    def lines_hold(self, batches: list[int]) -> bool:
        """Whether every trace `at` gave was the step's own: no lines in use, or at each of `batches` they give the
        trace itself, event for event. Where they do not, they are dropped, and `at` traces until lines through the
        largest three traced fit again (those batches among them: a staging buffer a reduction takes only above
        some size is then in all three); after a second failure, it traces for good."""
        if self._lines is None:
            return True
        if all([self.at(b) == self.traced_at(b) for b in batches]):  # a list: every one traced, for the next fit
            return True
        self._lines, self._failed = None, self._failed + 1
        return False


def _alike(e1: Event, e2: Event) -> bool:
    """The same event but for its size."""
    return len(e1) == len(e2) and e1[:2] == e2[:2] and e1[3:] == e2[3:]


def _one_rule(sizes: tuple) -> bool:
    """Whether three sizes are one rule's, with the same constants, at shapes of one length."""
    first = sizes[0]
    return all(isinstance(size, Sized) and size.rule is first.rule and size.constants == first.constants
               and len(size.shape) == len(first.shape) for size in sizes)


def _line(batches: tuple[int, int, int], values: tuple[int, int, int]) -> tuple[int, int] | None:
    """(value at micro-batch 0, per sample) of the line through three points, if they lie on one with a whole
    number per sample."""
    (b1, b2, b3), (v1, v2, v3) = batches, values
    per_sample, rest = divmod(v2 - v1, b2 - b1)
    if rest or v3 != v1 + per_sample * (b3 - b1):
        return None
    return v1 - per_sample * b1, per_sample


def _size_at(traced: int, through: list[tuple[int, int]], b: int) -> int:
    """A block's bytes at micro-batch b: off its line, or its rule's at its shape's (Sized)."""
    values = [base + per_sample * b for base, per_sample in through]
    return traced.rule(*traced.constants, *values) if isinstance(traced, Sized) else values[0]
