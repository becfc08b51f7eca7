"""`memlab data prepare`: tokenize a corpus once, with a progress bar, so that later runs start training at once."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from memlab.cli.options import DeviceOpt, docs_cap

DataOpt = Annotated[Optional[str], typer.Option("--data", help="stdlib, a file or folder (.txt .md .jsonl .json .parquet .csv), or hf:NAME[:CONFIG].")]
FieldOpt = Annotated[Optional[str], typer.Option("--text-field", help="The column that holds the text (json, parquet, csv, hf:).")]
TokenizerOpt = Annotated[Optional[str], typer.Option("--tokenizer", help="bpe:N (train on the corpus), a tokenizer.json, or hf:NAME.")]
MaxDocsOpt = Annotated[Optional[int], typer.Option("--max-docs", help="Take only the first N documents (0 = all).", callback=docs_cap)]
SplitOpt = Annotated[Optional[str], typer.Option("--split", help="Dataset split, e.g. train or train[:10%].")]
StreamingOpt = Annotated[Optional[bool], typer.Option("--streaming/--no-streaming", help="Stream the dataset instead of downloading it whole.")]
def _positive_tokens(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise typer.BadParameter(f"must be at least 1, got {value}")
    return value


ValTokensOpt = Annotated[Optional[int], typer.Option("--val-tokens", help="Size of the held-out validation slice (tokens).", callback=_positive_tokens)]
ExperimentOpt = Annotated[str, typer.Option("--experiment", "-e", help="Start from the \\[data] table of this experiment (built-in name or TOML path); auto = the one `memlab run` picks: gpt2s on CUDA, tiny on CPU.")]


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

    from memlab.cli.options import _toml_string, data_overrides, experiment_ref, refuse_early
    from memlab.core.config import Profile, apply_overrides, load_experiment
    from memlab.core.environment import check_device_name

    check_device_name(device)
    items = data_overrides(data, text_field, tokenizer, streaming, max_docs, None, None)
    if split is not None:
        items.append(f"data.split={_toml_string(split)}")
    if val_tokens is not None:
        items.append(f"data.val_tokens={val_tokens}")

    def resolved(device_type: str):
        exp = load_experiment(experiment_ref(experiment, device_type))
        apply_overrides(exp, Profile(), items)  # validates like `memlab run --set`
        return exp

    refuse_early(experiment, resolved)  # a bad name or value: one line before torch is imported
    from memlab.core.data import is_cached
    from memlab.core.environment import resolve_device

    # `auto` means what it means to `memlab run` on this device, so that the entry made here is the one a run reuses
    cfg = resolved(resolve_device(device).type).data
    is_cached(cfg)  # a token cache that cannot be written: one line before the progress bar

    console = make_console(stderr=True)
    t0 = time.perf_counter()
    tokens = _load_with_progress(cfg, console)
    _print_entry(tokens, time.perf_counter() - t0, console)


def _load_with_progress(cfg, console):
    """load_tokens with a progress bar per stage (tokenizer training, reading, encoding) on stderr."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from memlab.core.data import load_tokens

    columns = (SpinnerColumn(), TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    tasks: dict[str, int] = {}
    with Progress(*columns, console=console, transient=True) as bar:

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                for other in tasks.values():  # a new stage means the previous ones are done
                    bar.update(other, completed=bar.tasks[other].total or bar.tasks[other].completed)
                tasks[stage] = bar.add_task(stage, total=total or None)
            bar.update(tasks[stage], completed=done, total=total or None)

        return load_tokens(cfg, progress=progress)


def _print_entry(tokens, elapsed: float, console) -> None:
    """What the cache entry holds, on stdout; a held-out slice too large for the corpus as a warning on stderr."""
    from memlab.cli.console import make_console
    from memlab.core.data import holdout_warning

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


def list_entries() -> None:
    """The token cache: each entry's key, size, source and tokenizer (remove one with `memlab data rm KEY`)."""
    from rich.table import Table

    from memlab.cli.console import make_console
    from memlab.core.data import cache

    every = cache.entries()
    console = make_console()
    where = f"{cache.tokens_dir()} (set MEMLAB_CACHE to move it)"
    if not every:
        console.print(f"token cache is empty: {where}")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, justify in (("key", "left"), ("size", "right"), ("tokens", "right"), ("source", "left"), ("tokenizer", "left"), ("made", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for e in every:
        m = e.meta or {}
        tokens = f"{int(m['n_tokens']):,}" if "n_tokens" in m else "—"
        source = m.get("source", "[yellow]incomplete: rebuilt when next used[/]")
        table.add_row(e.name, disk_size(e.size_bytes), tokens, source, m.get("tokenizer", "—"), str(m.get("created", "—"))[:10])
    console.print(table)
    total = sum(e.size_bytes for e in every)
    console.print(f"[dim]{len(every)} entr{'y' if len(every) == 1 else 'ies'}, {disk_size(total)} in {where}[/]")


def disk_size(n: int) -> str:
    """Bytes on disk as people read them: 912 KiB, 37.5 MiB, 1.20 GiB."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.0f} KiB"


def remove_entries(
    keys: Annotated[Optional[list[str]], typer.Argument(help="Entry keys as `memlab data list` shows them (a unique prefix is enough).", show_default=False)] = None,
    all_: Annotated[bool, typer.Option("--all", help="Remove every entry.")] = False,
) -> None:
    """Remove token cache entries; a later run with that data tokenizes it again."""
    from memlab.core.data import cache
    from memlab.core.errors import MemlabError

    if all_ == bool(keys):
        raise MemlabError("give the keys to remove (see: memlab data list), or --all, not both" if keys else "give the keys to remove (see: memlab data list), or --all")
    chosen = cache.entries() if all_ else cache.find_entries(list(keys or []))
    for e in chosen:
        cache.remove(e)
        typer.echo(f"removed {e.name} ({disk_size(e.size_bytes)})")
    if not chosen:
        typer.echo(f"token cache is already empty: {cache.tokens_dir()}")


def register(app: typer.Typer) -> None:
    data_app = typer.Typer(
        no_args_is_help=True,
        context_settings={"help_option_names": ["-h", "--help"]},
        help="Corpora and the token cache.",
    )
    data_app.command("prepare")(prepare)
    data_app.command("list")(list_entries)
    data_app.command("rm")(remove_entries)
    app.add_typer(data_app, name="data")
