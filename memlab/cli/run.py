"""`memlab run`: train one profile headless, in this process, into a run folder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memlab.cli.options import DeviceOpt, ExperimentOpt, RunsDirOpt, SetOpt, StepsOpt, data_overrides, resolve

EXIT_BY_STATUS = {"finished": 0, "interrupted": 130, "oom": 1, "nan": 1, "error": 1}


def run(
    profile: Annotated[str, typer.Option("--profile", "-p", help="Built-in profile name (memlab profiles) or a TOML file.")],
    experiment: ExperimentOpt = "auto",
    device: DeviceOpt = "auto",
    runs_dir: RunsDirOpt = "runs",
    steps: StepsOpt = None,
    set_: SetOpt = None,
    batch_size: Annotated[Optional[str], typer.Option("--batch-size", help="Effective batch (train.batch_size), or 'max': find the largest micro-batch that fits and lower accumulation to match.")] = None,
    data: Annotated[Optional[str], typer.Option("--data", help="stdlib | a file or folder | hf:NAME[:CONFIG]")] = None,
    text_field: Annotated[Optional[str], typer.Option("--text-field", help="Field holding the text (json/parquet/csv/hf).")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="bpe:N | path/to/tokenizer.json | hf:NAME")] = None,
    streaming: Annotated[Optional[bool], typer.Option("--streaming/--no-streaming", help="Stream an hf: dataset.")] = None,
    max_docs: Annotated[Optional[int], typer.Option("--max-docs", help="Read at most this many documents (0 = all).")] = None,
    epochs: Annotated[Optional[float], typer.Option("--epochs", help="Train for this many epochs (sets train.steps = 0).")] = None,
    events: Annotated[Optional[str], typer.Option("--events", help="Stream events as JSON lines: '-' for stdout, or a file path.")] = None,
    no_meters: Annotated[bool, typer.Option("--no-meters", help="Turn off per-phase memory resets and the NVML sampler (to measure the meters' cost).")] = False,
) -> None:
    """Train one technique profile and measure it (memory by phase, speed, quality)."""
    from memlab.core.environment import resolve_device
    from memlab.core.errors import MemlabError
    from memlab.core.events import JsonLinesSink
    from memlab.core.runner import configure_allocator, run_profile

    from memlab.cli.console import ConsoleSink, print_summary

    dev = resolve_device(device)
    overrides = list(set_ or []) + data_overrides(data, text_field, tokenizer, streaming, max_docs, epochs, steps)
    max_batch = None
    if batch_size is not None:
        if batch_size == "max":
            from memlab.cli.batch import resolve_max_batch  # issue 5: find-batch

            exp, prof = resolve(experiment, profile, dev.type, overrides)
            max_batch, accum = resolve_max_batch(exp, prof, dev, profile_ref=profile, experiment_ref=experiment, overrides=overrides)
            overrides.append(f"accumulation.steps={accum}")
        else:
            try:
                value = int(batch_size)
            except ValueError:
                raise MemlabError(f"--batch-size {batch_size!r}: expected a positive integer or 'max'") from None
            overrides.append(f"train.batch_size={value}")
    exp, prof = resolve(experiment, profile, dev.type, overrides)
    configure_allocator(prof)

    sinks = []
    if events == "-":
        sinks.append(JsonLinesSink(stream=sys.stdout))
    else:
        if events:
            sinks.append(JsonLinesSink(path=events))
        sinks.append(ConsoleSink())
    summary, run_dir = run_profile(exp, prof, runs_dir=Path(runs_dir), device=dev, sinks=tuple(sinks), meters=not no_meters, extra_info={"max_batch": max_batch, "process_start": _process_start()})
    if events != "-":
        print_summary(summary, run_dir)
    for sink in sinks:
        sink.close()
    raise typer.Exit(EXIT_BY_STATUS.get(summary["status"], 1))


def _process_start() -> float | None:
    """When this process started (so time to first step includes imports, as a user waits for them)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001
        return None


def register(app: typer.Typer) -> None:
    app.command("run")(run)
