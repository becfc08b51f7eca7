"""`memlab data prepare`: tokenize a corpus once, with a progress bar, so that later runs start training at once."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from memlab.cli.options import DeviceOpt

DataOpt = Annotated[Optional[str], typer.Option("--data", help="stdlib, a file or folder (.txt .md .jsonl .json .parquet .csv), or hf:NAME[:CONFIG].")]
FieldOpt = Annotated[Optional[str], typer.Option("--text-field", help="The column that holds the text (json, parquet, csv, hf:).")]
TokenizerOpt = Annotated[Optional[str], typer.Option("--tokenizer", help="bpe:N (train on the corpus), a tokenizer.json, or hf:NAME.")]
MaxDocsOpt = Annotated[Optional[int], typer.Option("--max-docs", help="Take only the first N documents (0 = all).")]
SplitOpt = Annotated[Optional[str], typer.Option("--split", help="Dataset split, e.g. train or train[:10%].")]
StreamingOpt = Annotated[Optional[bool], typer.Option("--streaming/--no-streaming", help="Stream the dataset instead of downloading it whole.")]
ValTokensOpt = Annotated[Optional[int], typer.Option("--val-tokens", help="Size of the held-out validation slice (tokens).")]
ExperimentOpt = Annotated[str, typer.Option("--experiment", "-e", help="Start from the [data] table of this experiment (built-in name or TOML path); auto = the one `memlab run` picks: gpt2s on CUDA, tiny on CPU.")]


def prepare(
    data: DataOpt = None,
    text_field: FieldOpt = None,
    tokenizer: TokenizerOpt = None,
    max_docs: MaxDocsOpt = None,
    split: SplitOpt = None,
    streaming: StreamingOpt = None,
    val_tokens: ValTokensOpt = None,
    experiment: ExperimentOpt = "auto",
    device: DeviceOpt = "auto",
) -> None:
    """Tokenize a corpus into the token cache (a later `memlab run` with the same data reuses it)."""
    from memlab.cli.console import make_console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from memlab.cli.options import _toml_string, data_overrides, experiment_ref
    from memlab.core.config import Profile, apply_overrides, load_experiment
    from memlab.core.data import holdout_warning, load_tokens
    from memlab.core.environment import resolve_device

    # `auto` means what it means to `memlab run` on this device, so that the entry made here is the one a run reuses
    exp = load_experiment(experiment_ref(experiment, resolve_device(device).type))
    items = data_overrides(data, text_field, tokenizer, streaming, max_docs, None, None)
    if split is not None:
        items.append(f"data.split={_toml_string(split)}")
    if val_tokens is not None:
        items.append(f"data.val_tokens={val_tokens}")
    apply_overrides(exp, Profile(), items)  # validates like `memlab run --set`
    cfg = exp.data

    console = make_console(stderr=True)
    columns = (SpinnerColumn(), TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    tasks: dict[str, int] = {}
    t0 = time.perf_counter()
    with Progress(*columns, console=console, transient=True) as bar:

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                for other in tasks.values():  # a new stage means the previous ones are done
                    bar.update(other, completed=bar.tasks[other].total or bar.tasks[other].completed)
                tasks[stage] = bar.add_task(stage, total=total or None)
            bar.update(tasks[stage], completed=done, total=total or None)

        tokens = load_tokens(cfg, progress=progress)
    elapsed = time.perf_counter() - t0

    out = make_console()
    n_train, n_val = len(tokens.train), len(tokens.val)
    out.print(f"[bold]source[/]     {tokens.source}")
    out.print(f"[bold]tokenizer[/]  {tokens.tokenizer} · vocab {tokens.vocab_size:,} · EOS id {tokens.eos_id}")
    out.print(f"[bold]tokens[/]     {n_train + n_val:,} in {tokens.n_docs:,} documents · {n_train:,} train · {n_val:,} val · {tokens.dtype.name}")
    out.print(f"[bold]cache[/]      {tokens.cache_dir}")
    out.print(f"[bold]cache hit[/]  {'yes' if tokens.cache_hit else 'no'} ({elapsed:.1f} s)")
    warning = holdout_warning(n_train, n_val)
    if warning:
        console.print(f"[yellow]warning[/] {warning}")


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(
        no_args_is_help=True,
        context_settings={"help_option_names": ["-h", "--help"]},
        help="Corpora and the token cache.",
    )
    data_app.command("prepare")(prepare)
    app.add_typer(data_app, name="data")
