"""A few common knobs for the runs that start from now on: experiment, steps, batch size (a number or `max`).

A field takes only the characters its value can hold (digits; digits or `max`); any other key acts as it does
anywhere (r runs, q quits, z zooms), and escape or enter leave the Knobs for the panel the user came from. A value that is still not right (`0`, `ma`) is the panel's `problem`, and the app starts no run until it
is fixed or cleared: the runs never quietly fall back to the defaults."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.validation import Function, Integer
from textual.widgets import Input, Label, Select

from memlab.core.config import builtin_names, load_experiment
from memlab.core.errors import MemlabError
from memlab.core.models.shape import architecture
from memlab.tui.widgets.knob_input import KnobInput


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


STEPS_CHARS = r"[0-9]*"
BATCH_CHARS = r"[0-9]*|m|ma|max"
DIGITS = "0123456789"


class SettingsPanel(Vertical):
    """Each change is posted as `SettingsPanel.Changed`: the settings as they last parsed, and the problem (a line
    naming the field and what it takes) while a field holds a value that does not parse, else None. Escape, or
    enter in a field, posts `SettingsPanel.Done`: the screen gives focus back to the panel the user came from."""

    BINDINGS = [Binding("escape", "done", "Done", key_display="esc", tooltip="Leave the Knobs, back to the panel you came from")]

    @dataclass
    class Changed(Message):
        settings: Settings
        problem: str | None = None

    class Done(Message):
        pass

    def __init__(self, settings: Settings, experiments: list[str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        names = ["auto", *experiments]
        if settings.experiment not in names:
            names.append(settings.experiment)  # a path given with --experiment
        self._experiments = names
        self.problems: dict[str, str] = {}  # field id -> what is wrong with it

    @property
    def problem(self) -> str | None:
        return "; ".join(self.problems.values()) or None

    def compose(self) -> ComposeResult:
        s = self.settings
        with Horizontal(classes="knob"):
            yield Label("experiment", classes="knob-label")
            yield Select([(_experiment_label(n), n) for n in self._experiments], value=s.experiment, allow_blank=False, compact=True, id="knob-experiment")
        with Horizontal(classes="knob"):
            yield Label("steps", classes="knob-label")
            yield KnobInput(
                "" if s.steps is None else str(s.steps), takes=DIGITS, placeholder="default", compact=True, id="knob-steps", restrict=STEPS_CHARS,
                validators=[Integer(minimum=1, failure_description="a positive integer")], valid_empty=True,
            )
        with Horizontal(classes="knob"):
            yield Label("batch", classes="knob-label")
            yield KnobInput(
                s.batch or "", takes=DIGITS + "max", placeholder="default or max", compact=True, id="knob-batch", restrict=BATCH_CHARS,
                validators=[Function(_batch_ok, "a positive integer or max")], valid_empty=True,
            )

    def _on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        if isinstance(event.value, str):
            self._set(experiment=event.value)

    def _on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        field = event.input.id or ""
        if event.validation_result is not None and not event.validation_result.is_valid:
            what = "a positive integer" if field == "knob-steps" else "a positive integer or max"
            self.problems[field] = f"knob {field.removeprefix('knob-')} = {event.value!r} is not {what}"
            self.post_message(self.Changed(self.settings, self.problem))
            return
        had_problem = self.problems.pop(field, None) is not None
        value = event.value.strip()
        if had_problem:
            self.post_message(self.Changed(self.settings, self.problem))
        if field == "knob-steps":
            self._set(steps=int(value) if value else None)
        elif event.input.id == "knob-batch":
            self._set(batch=value or None)

    def _on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Done())

    def action_done(self) -> None:
        self.post_message(self.Done())

    def _set(self, **fields) -> None:
        new = Settings(**{**self.settings.__dict__, **fields})
        if new != self.settings:
            self.settings = new
            self.post_message(self.Changed(new, self.problem))


def _experiment_label(name: str) -> str:
    """A transformers experiment names its architecture in the picker (`llama-1b · Llama`); memlab's own
    GPT experiments keep their bare names."""
    if name not in builtin_names("experiment"):
        return name
    try:
        model = load_experiment(name).model
    except MemlabError:
        return name
    short = architecture(model).removesuffix("ForCausalLM").removesuffix("LMHeadModel")  # LlamaForCausalLM -> Llama
    return f"{name} · {short}" if model.family == "hf" else name
