"""Options shared by commands that pick an experiment and a profile (run, sweep, find-batch, estimate)."""

from __future__ import annotations

from typing import Annotated, Callable, Optional

import typer

from memlab.core.config import Experiment, Profile, apply_overrides, load_experiment, load_profile

ExperimentOpt = Annotated[str, typer.Option("--experiment", "-e", help="Built-in experiment name or a TOML path; auto = gpt2s on CUDA, tiny on CPU.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cuda | cpu")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a knob: section.key=value (repeatable).")]


def _positive_steps(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise typer.BadParameter(f"must be at least 1, got {value} (to train by epochs, use --epochs or --set train.steps=0)")
    return value


def _nonempty_folder(value: str) -> str:
    if not value.strip():
        raise typer.BadParameter("is empty; give a folder, e.g. --runs-dir runs")
    return value


GpusOpt = Annotated[Optional[str], typer.Option("--gpus", help="GPUs to run on, one lane each, e.g. 0,1,2,3 (default: every visible GPU; 0 for one); each run is pinned with CUDA_VISIBLE_DEVICES; --nproc N takes N GPUs a run.")]
StepsOpt = Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps (overrides train.steps).", callback=_positive_steps)]
RunsDirOpt = Annotated[str, typer.Option("--runs-dir", help="Where run folders go.", callback=_nonempty_folder)]


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
