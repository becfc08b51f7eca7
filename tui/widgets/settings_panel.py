"""A few common knobs for the runs that start from now on: experiment, steps, batch size (a number or `max`)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.validation import Function, Integer
from textual.widgets import Input, Label, Select


@dataclass(frozen=True)
class Settings:
    experiment: str = "auto"
    steps: int | None = None  # None: the experiment's own
    batch: str | None = None  # None: the experiment's own; "max": the largest that fits (memlab run --batch-size max)

    def overrides(self) -> list[str]:
        items = []
        if self.steps is not None:
            items.append(f"train.steps={self.steps}")
        if self.batch not in (None, "max"):
            items.append(f"train.batch_size={self.batch}")
        return items

    def extra_args(self) -> list[str]:
        return ["--batch-size", "max"] if self.batch == "max" else []

    def describe(self) -> str:
        return f"{self.experiment} · steps {self.steps or 'default'} · batch {self.batch or 'default'}"


def _batch_ok(value: str) -> bool:
    return value == "max" or (value.isdigit() and int(value) > 0)


class SettingsPanel(Vertical):
    """Each change that parses is posted as `SettingsPanel.Changed`; a bad value is marked and not posted."""

    @dataclass
    class Changed(Message):
        settings: Settings

    def __init__(self, settings: Settings, experiments: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        names = ["auto", *experiments]
        if settings.experiment not in names:
            names.append(settings.experiment)  # a path given with --experiment
        self._experiments = names

    def compose(self) -> ComposeResult:
        s = self.settings
        with Horizontal(classes="knob"):
            yield Label("experiment", classes="knob-label")
            yield Select([(n, n) for n in self._experiments], value=s.experiment, allow_blank=False, compact=True, id="knob-experiment")
        with Horizontal(classes="knob"):
            yield Label("steps", classes="knob-label")
            yield Input(
                "" if s.steps is None else str(s.steps), placeholder="default", compact=True, id="knob-steps",
                validators=[Integer(minimum=1, failure_description="a positive integer")], valid_empty=True,
            )
        with Horizontal(classes="knob"):
            yield Label("batch", classes="knob-label")
            yield Input(
                s.batch or "", placeholder="default or max", compact=True, id="knob-batch",
                validators=[Function(_batch_ok, "a positive integer or max")], valid_empty=True,
            )

    def _on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if isinstance(event.value, str):
            self._set(experiment=event.value)

    def _on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        if event.validation_result is not None and not event.validation_result.is_valid:
            return
        value = event.value.strip()
        if event.input.id == "knob-steps":
            self._set(steps=int(value) if value else None)
        elif event.input.id == "knob-batch":
            self._set(batch=value or None)

    def _on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.screen.focus_next()

    def _set(self, **fields) -> None:
        new = Settings(**{**self.settings.__dict__, **fields})
        if new != self.settings:
            self.settings = new
            self.post_message(self.Changed(new))
