"""Two traces of a step compared event for event (bench/one_step_check.py, tests/test_allocator_model.py): each
allocation renumbered in order, as a fake storage's id is its address."""

from __future__ import annotations

Event = tuple  # as memlab.core.predict.trace.Event: (action, id, bytes, where)


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
