"""A knob's text field: it takes only the characters its value can hold, and lets every other key act as it does
anywhere else (r runs the queue, q quits, z zooms): a field that swallowed them trapped the user in the Knobs."""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class KnobInput(Input):
    def __init__(self, value: str = "", *, takes: str, **kwargs) -> None:
        super().__init__(value, **kwargs)
        self.takes = frozenset(takes)

    def check_consume_key(self, key: str, character: str | None) -> bool:
        """Only the field's own characters: the key bindings of the panels above see (and the footer shows) the rest."""
        return character is not None and character in self.takes

    async def _on_key(self, event: events.Key) -> None:
        if event.is_printable and event.character not in self.takes:
            event.prevent_default()  # not Input's to type or swallow: it bubbles on to the app's key bindings
