"""Which item a free lane takes next: the study's items in their order, each handed out once, and only once the
items it needs have ended (a run needs its profile's max-batch search: the common batch is split within the max
micro-batch it measured; `needs` may drop a need as a search goes, and is asked again every WAIT_S). A lane that
finds nothing ready waits for an item to end, rather than the whole study waiting for its slowest search before
any run starts."""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from memlab.core.study.state import Item

WAIT_S = 0.2  # how often a waiting lane asks whether it should give up (a stop, its GPU out)


class ReadyItems:
    def __init__(self, items: Sequence[Item], needs: Callable[[Item], list[str]]):
        self._left = list(items)
        self._needs = needs
        self._todo = {i.key for i in items}  # a need outside these (final before this pass) is met already
        self._ended: set[str] = set()
        self._cond = threading.Condition()

    def take(self, give_up: Callable[[], bool]) -> Item | None:
        """The first item whose needs have ended, waiting for one; None when none is left or `give_up()`."""
        with self._cond:
            while self._left and not give_up():
                item = next((i for i in self._left if self._ready(i)), None)
                if item is not None:
                    self._left.remove(item)
                    return item
                self._cond.wait(WAIT_S)
            return None

    def ended(self, item: Item) -> None:
        """`item`'s work is over, however it went: the items that need it may start (a run after a failed search
        goes at the common batch, as it always did)."""
        with self._cond:
            self._ended.add(item.key)
            self._cond.notify_all()

    @property
    def left(self) -> list[Item]:
        with self._cond:
            return list(self._left)

    def _ready(self, item: Item) -> bool:
        return all(key not in self._todo or key in self._ended for key in self._needs(item))
