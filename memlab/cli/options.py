"""Options shared by commands that pick an experiment and a profile (run, sweep, find-batch, estimate)."""

from __future__ import annotations

from typing import Annotated, Any, Callable, Optional

import typer

from memlab.core.config import Experiment, Profile, apply_overrides, load_experiment, load_profile
from memlab.core.errors import ConfigError

ExperimentOpt = Annotated[str, typer.Option("--experiment", "-e", help="Built-in experiment name or a TOML path; auto = gpt2s on CUDA, tiny on CPU.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cuda | cpu")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a knob: section.key=value (repeatable).")]


def _positive_steps(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise typer.BadParameter(f"must be at least 1, got {value} (to train by epochs, use --epochs or --set train.steps=0)")
    return value


def _positive_epochs(value: float | None) -> float | None:
    if value is not None and not value > 0:  # NaN too
        raise typer.BadParameter(f"must be positive, got {value:g} (e.g. --epochs 1 or --epochs 0.5)")
    return value


def docs_cap(value: int | None) -> int | None:
    if value is not None and value < 0:
        raise typer.BadParameter(f"must be 0 (= every document) or more, got {value}")
    return value


def _nonempty_folder(value: str) -> str:
    if not value.strip():
        raise typer.BadParameter("is empty; give a folder, e.g. --runs-dir runs")
    return value


GpusOpt = Annotated[Optional[str], typer.Option("--gpus", help="GPUs to run on, one lane each, e.g. 0,1,2,3 (default: every visible GPU; 0 for one); each run is pinned with CUDA_VISIBLE_DEVICES; --nproc N takes N GPUs a run.")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps (overrides train.steps).", callback=_positive_steps)]
EpochsOpt = Annotated[Optional[float], typer.Option("--epochs", help="Train for this many epochs (sets train.steps = 0).", callback=_positive_epochs)]
MaxDocsOpt = Annotated[Optional[int], typer.Option("--max-docs", help="Read at most this many documents (0 = all).", callback=docs_cap)]
RunsDirOpt = Annotated[str, typer.Option("--runs-dir", help="Where run folders go.", callback=_nonempty_folder)]

# Each command that prints JSON takes both spellings: estimate and find-batch print one object (--json), fit and table
# choose among several formats (--format); a newcomer who types the other one's is understood, not refused.
JsonFlagOpt = Annotated[bool, typer.Option("--json", help="The same as --format json.")]
JsonFormatOpt = Annotated[Optional[str], typer.Option("--format", "-f", help="table | json (the same as --json).")]


def wants_json(as_json: bool, format_: str | None) -> bool:
    """estimate's and find-batch's --format: table or json, else a one-line refusal."""
    if format_ not in (None, "table", "json"):
        raise ConfigError(f"--format {format_!r} is not valid here; choose table or json (memlab fit and table also write "
                          "markdown and csv)")
    return as_json or format_ == "json"


def json_wins(as_json: bool, format_: Any, json_value: Any, default: Any) -> Any:
    """fit's and table's --json: the same as --format json; beside another --format, a one-line refusal."""
    if not as_json:
        return format_
    if format_ not in (default, json_value):
        raise ConfigError(f"--json and --format {format_.value} ask for two formats; give one")
    return json_value


def data_overrides(data: str | None, text_field: str | None, tokenizer: str | None, streaming: bool | None, max_docs: int | None, epochs: float | None, steps: int | None) -> list[str]:
    """Turn the convenience flags into --set items (so they are validated the same way)."""
    from memlab.core.errors import ConfigError

    if epochs is not None and steps is not None:
        raise ConfigError(f"--steps {steps} and --epochs {epochs:g} both set the run's length; give one of them")
    items = []
    if data is not None:
        # another corpus: how the experiment read its own (a Hub split, streamed) goes back to the defaults unless
        # given again, e.g. a recipe's streamed hf: source replaced by --data stdlib, which has one split on disk
        items += ['data.split="train"', "data.streaming=false"]
    for key, value in (("data.source", data), ("data.text_field", text_field), ("data.tokenizer", tokenizer)):
        if value is not None:
            items.append(f"{key}={_toml_string(value)}")
    if streaming is not None:
        items.append(f"data.streaming={'true' if streaming else 'false'}")
    if max_docs is not None:
        items.append(f"data.max_docs={max_docs}")
    if epochs is not None:
        items += [f"train.epochs={float(epochs)}", "train.steps=0"]
    if steps is not None:
        items.append(f"train.steps={steps}")
    return items


ModelOpt = Annotated[Optional[str], typer.Option("--model", help="A transformers model: a preset (memlab models), a config.json, or a checkpoint folder (config.json + *.safetensors [+ tokenizer.json]); its shape replaces the experiment's.")]


def model_overrides(model: str | None) -> list[str]:
    """--model X: the hf family built from X, as --set items (validated the same way)."""
    if model is None:
        return []
    from pathlib import Path

    path = Path(model).expanduser()
    source = str(path.resolve()) if path.exists() else model  # a folder stays the same folder in child processes
    return ['model.family="hf"', f"model.source={_toml_string(source)}"]


# The knobs each convenience flag sets (as --set items): the same knob in --set too would leave one of them unheard.
FLAG_KNOBS = {
    "--steps": ("train.steps",), "--epochs": ("train.epochs", "train.steps"), "--batch-size": ("train.batch_size",),
    "--data": ("data.source",), "--text-field": ("data.text_field",), "--tokenizer": ("data.tokenizer",),
    "--max-docs": ("data.max_docs",), "--streaming": ("data.streaming",),
}


def refuse_flag_and_set(set_items: list[str] | None, **flags: object) -> None:
    """A flag and a --set item for the same knob (`--steps 4 --set train.steps=6`): which one the user meant is a
    guess, so neither wins; one line naming both. `flags` by option name without dashes (batch_size=8)."""
    from memlab.core.config import parse_set
    from memlab.core.errors import ConfigError

    by_knob = {}
    for item in set_items or []:
        section, key, _ = parse_set(item)
        by_knob[f"{section}.{key}"] = item
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        for knob in FLAG_KNOBS[flag] if value is not None else ():
            if knob in by_knob:
                given = (flag if value else flag.replace("--", "--no-", 1)) if isinstance(value, bool) else f"{flag} {value}"
                raise ConfigError(f"{given} and --set {by_knob[knob]} both set {knob}; give one of them")


def profile_list(text: str, flag: str = "--profiles") -> list[str]:
    """`a,b,c` -> names; an empty name (`baseline,,bf16`) or one listed twice is refused: each is one run of a
    comparison, and a silently dropped or doubled entry would be a different comparison than the one asked for."""
    from memlab.core.errors import ConfigError

    names = [p.strip() for p in text.split(",")]
    if not any(names):
        raise ConfigError(f"{flag} is empty; give a comma-separated list, e.g. baseline,bf16,gradcp_bf16")
    if not all(names):
        raise ConfigError(f"{flag} {text!r} has an empty name between commas; list each profile once, e.g. baseline,bf16")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{flag} {text!r} lists {', '.join(twice)} more than once; list each profile once")
    return names


def check_token_cache(datas: list) -> None:
    """For a command that starts runs in children (sweep, study): a token cache they could not write (MEMLAB_CACHE a
    file, a read-only mount) is one line now, not a rejected child per run; a corpus already cached is only read."""
    from memlab.core.data import is_cached
    from memlab.core.errors import MemlabError

    for i, data in enumerate(datas):
        if data in datas[:i]:  # runs of one sweep mostly share their data: each corpus is looked up once
            continue
        try:
            is_cached(data)
        except MemlabError:
            raise
        except Exception:  # noqa: BLE001 (the corpus cannot be looked up from here: each run says why, as before)
            continue


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def experiment_ref(experiment: str, device_type: str) -> str:
    """What `--experiment auto` stands for on this device (run, sweep and data prepare all ask here)."""
    if experiment == "auto":
        return "gpt2s" if device_type == "cuda" else "tiny"
    return experiment


def resolve(experiment: str, profile: str, device_type: str, overrides: list[str]) -> tuple[Experiment, Profile]:
    exp = load_experiment(experiment_ref(experiment, device_type))
    prof = load_profile(profile)
    apply_overrides(exp, prof, overrides)
    return exp, prof


def refuse_early(experiment: str, check: Callable[[str], object]) -> None:
    """Run `check(device_type)` (a resolve() of the command's input) before torch is imported, so that a mistyped
    name or a bad --set is refused in a fraction of a second, with the message the command's own resolve() gives.
    `--experiment auto` means gpt2s on CUDA and tiny on the CPU, which takes torch to know: its input is refused
    here only where both would refuse it alike; otherwise the command's own check, on its device, decides."""
    from memlab.core.errors import MemlabError

    refusals = []
    for device_type in ("cpu", "cuda") if experiment == "auto" else ("cpu",):
        try:
            check(device_type)
        except MemlabError as e:
            refusals.append(e)
        else:
            return
    if len({str(e) for e in refusals}) == 1:
        raise refusals[0]
