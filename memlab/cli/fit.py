"""`memlab fit`: which profiles fit a model on a card, at what micro-batch and what sequence length; predicted (no GPU
needed, nothing of the model's size is built), and with --measure checked on this GPU by probes like find-batch's.

The table's header says what every figure assumes: the sequence and micro-batch of the peak column, each profile's
optimizer, and what "fits" means (memlab.core.predict.fit)."""

from __future__ import annotations

import dataclasses
import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from memlab.cli.options import JsonFlagOpt, ModelOpt, SetOpt, json_wins, model_overrides
from memlab.core.units import gib, parse_size

if TYPE_CHECKING:
    import polars as pl

    from memlab.core.config import Experiment
    from memlab.core.predict import Card
    from memlab.core.predict.fit import Fit


# The profiles `memlab fit` tries without --profiles: full training as a user would (bf16; checkpointing; with 8-bit
# AdamW too), and the fine-tuning ones.
DEFAULT_PROFILES = ("bf16", "gradcp_bf16", "gradcp_adamw8bit", "lora", "lora_gradcp", "qlora", "qlora_gradcp", "freeze")


class FitFormat(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


ProfilesOpt = Annotated[Optional[str], typer.Option("--profiles", "-p", help="Profiles to try, comma-separated (default: bf16, gradcp_bf16, gradcp_adamw8bit, lora, lora_gradcp, qlora, qlora_gradcp, freeze).")]
CardOpt = Annotated[Optional[str], typer.Option("--gpu-memory", help="The card, e.g. 24GiB, 40GB, 48G (G/GiB = 1024^3, GB = 1000^3); default: this GPU, or an 80 GB H100 where there is none.")]
MeasureOpt = Annotated[bool, typer.Option("--measure", help="Also find each row's max micro-batch and longest sequence on this GPU (capped at --gpu-memory), and print measured beside predicted.")]
FormatOpt = Annotated[FitFormat, typer.Option("--format", "-f", help="table | markdown | csv | json")]
PlotOpt = Annotated[Optional[Path], typer.Option("--plot", help="Also draw the max micro-batch and longest sequence of each profile to this PNG.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Also write the rows to this Parquet file.")]
PredictedOpt = Annotated[Optional[Path], typer.Option("--predicted", help="With --measure: take the predicted side from this earlier `memlab fit --format json` output (predicted on another machine) instead of predicting again.")]


def fit(
    experiment: Annotated[str, typer.Option("--experiment", "-e", help="Built-in experiment name or a TOML path.")] = "gpt2s",
    model: ModelOpt = None,
    gpu_memory: CardOpt = None,
    profiles: ProfilesOpt = None,
    measure: MeasureOpt = False,
    format_: FormatOpt = FitFormat.table,
    as_json: JsonFlagOpt = False,
    plot: PlotOpt = None,
    out: OutOpt = None,
    predicted: PredictedOpt = None,
    set_: SetOpt = None,
) -> None:
    """Which profiles fit the experiment's model on a card: the predicted peak at its batch and sequence, the largest
    micro-batch at that sequence, and the longest sequence at micro-batch 1."""

    format_ = json_wins(as_json, format_, FitFormat.json, FitFormat.table)
    if gpu_memory is not None:
        parse_size(gpu_memory)
    names = _profile_names(profiles)
    overrides = model_overrides(model) + list(set_ or [])
    loaded = _resolve_all(experiment, names, overrides)

    def compute() -> None:
        _fit(experiment, names, overrides, loaded, gpu_memory, measure, format_, plot, out, predicted)

    if measure or plot or out or predicted:  # files written or a GPU asked: nothing to keep
        compute()
        return
    from memlab.cli.answers import answered
    from memlab.core.config import to_dict

    inputs = {"loaded": [(to_dict(e), to_dict(p)) for e, p in loaded], "gpu_memory": gpu_memory, "format": format_.value}
    answered("fit", inputs, compute)


def _fit(experiment: str, names: list[str], overrides: list[str], loaded: list[tuple[Experiment, Any]],
         gpu_memory: str | None, measure: bool, format_: FitFormat, plot: Path | None, out: Path | None,
         predicted: Path | None) -> None:
    """The plans' checks (torch from here), a row a profile (measured too with --measure), the table."""
    from memlab.core.errors import ConfigError
    from memlab.core.techniques import check_plan

    for e, prof in loaded:
        check_plan(e, prof)
    from memlab.core import predict as P  # torch from here: every input is known to be good
    from memlab.core.predict.fit import fit as fit_row

    cap = _measured_cap(gpu_memory) if measure else None
    card = P.card_for(gpu_memory)
    exp = loaded[0][0]
    earlier = _earlier(predicted, _for(exp, card), names)
    err = _err()
    if not earlier:
        _ahead(experiment, overrides, gpu_memory, loaded, names, card, err)
    rows, measured = [], []
    for (e, prof), name in zip(loaded, names):
        err.print(f"[dim]{name}: {'predicted earlier' if earlier else 'predicting…'}[/dim]")
        row = earlier[name] if earlier else fit_row(e, prof, card)
        rows.append(row)
        if measure:
            from memlab.cli.fit_measure import measured_row

            measured.append(measured_row(experiment, name, overrides, e, row, cap, err.print))
    frame = _frame(rows, measured)
    if not len(frame):
        raise ConfigError("no profile to fit")
    _write(frame, header(exp, card, rows[0].micro_batch), format_, out, plot, rows, _for(exp, card))


def _ahead(experiment: str, overrides: list[str], gpu_memory: str | None, loaded: list[tuple[Experiment, Any]],
           names: list[str], card: Card, err: Any) -> None:
    """A large model's rows not yet in the prediction cache, predicted several at once in child processes (each row
    then reads from the cache below); memlab.cli.fit_children says when that pays. The rows that search nothing
    (weights over the card: one trace) are predicted here meanwhile, not worth a child's start."""
    from memlab.cli.fit_children import predict_in_children, worth_children
    from memlab.core.predict.fit import fit as fit_row
    from memlab.core.predict.fit import kept, searched

    pending = [(e, prof, name) for (e, prof), name in zip(loaded, names) if kept(e, prof, card) is None]
    children = [name for e, prof, name in pending if searched(e, prof, card)]
    m = loaded[0][0].model
    if worth_children(m.n_layer, m.d_model, len(children)):
        here = [(e, prof) for e, prof, name in pending if name not in children]
        by_name = {name: (e, prof) for e, prof, name in pending}
        predict_in_children(experiment, overrides, gpu_memory, children, lambda line: err.print(f"[dim]{line}[/dim]"),
                            meanwhile=lambda: [fit_row(e, prof, card) for e, prof in here],
                            row=lambda name: fit_row(*by_name[name], card))


def _for(exp: Experiment, card: Card) -> str:
    """What a fit's rows are for: the experiment, its shape and the card (--predicted must match it)."""
    m = exp.model
    return f"{exp.name}: {getattr(m, 'source', '') or 'gpt'} {m.n_layer}L {m.d_model}d, batch {exp.train.batch_size} x {m.seq_len}, card {card.total_bytes} bytes"


def _earlier(path: Path | None, head: str, names: list[str]) -> dict[str, Fit]:
    """The rows of an earlier `memlab fit --format json` for the same experiment and card ({} without --predicted)."""
    from memlab.core.errors import ConfigError
    from memlab.core.predict.fit import Fit

    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
        rows = {r["profile"]: Fit(**r) for r in data["predicted"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--predicted {path}: not the JSON of memlab fit --format json ({type(e).__name__}: {e})") from None
    if data.get("for") != head:
        raise ConfigError(f"--predicted {path} was made for {data.get('for')!r}, not {head!r}")
    missing = [n for n in names if n not in rows]
    if missing:
        raise ConfigError(f"--predicted {path} has no row for {', '.join(missing)}; it has {', '.join(rows)}")
    return rows


def _measured_cap(gpu_memory: str | None) -> int | None:
    """--measure's probes run on this GPU under find-batch's cap (refused where it is more than the GPU has)."""
    from memlab.cli.batch import _cap_for, _require_cuda
    from memlab.core import gpu_memory as gpus

    _require_cuda("memlab fit --measure")
    return _cap_for(gpu_memory, gpus.gpu_info())


def _err() -> Any:
    from memlab.cli.console import make_console

    return make_console(stderr=True)


def _profile_names(profiles: str | None) -> list[str]:
    from memlab.core.errors import ConfigError
    if profiles is None:
        return list(DEFAULT_PROFILES)
    names = [p.strip() for p in profiles.split(",") if p.strip()]
    if not names:
        raise ConfigError("--profiles is empty; name one or more profiles, comma-separated (memlab profiles lists them)")
    if len(set(names)) != len(names):
        raise ConfigError(f"--profiles names a profile twice: {profiles}")
    return names


def _resolve_all(experiment: str, names: list[str], overrides: list[str]) -> list[tuple[Experiment, Any]]:
    """Every profile resolved before any prediction (torch-free): a bad name or --set is one line, before work."""
    from memlab.cli.options import resolve

    return [resolve(experiment, name, "cuda", overrides) for name in names]


def _frame(rows: list[Fit], measured: list[dict]) -> pl.DataFrame:
    import polars as pl

    records = []
    for i, r in enumerate(rows):
        rec = {"profile": r.profile, "trainable": r.trainable_params or None, "peak_gib": _g(r.allocated_bytes), "reserved_gib": _g(r.reserved_bytes),
               "fits": r.fits, "max_batch": r.max_batch if not r.error else None,
               "longest_seq": r.longest_seq if not r.error else None, "note": r.error or r.note}
        if measured:
            rec |= measured[i]
        records.append(rec)
    return pl.DataFrame(records)


def _g(nbytes: int) -> float | None:
    return round(nbytes / 2**30, 2) if nbytes else None


def header(exp: Experiment, card: Card, micro: int) -> str:
    from memlab.core.predict.axis import REPLAY_MARGIN

    m = exp.model
    what = f"{exp.name}" + (f" ({m.source})" if getattr(m, "family", "gpt") == "hf" else "")
    return (f"{what} on {card.where}: {gib(card.budget_bytes)} for the allocator after the CUDA context. "
            f"peak: the step's tensors at micro-batch {micro} x {m.seq_len} tokens (reserved: the allocator's reserve); "
            f"each profile's own optimizer and precision (memlab profiles); trainable: the parameters it updates; fits: the allocator replay's reserve within "
            f"the budget; max_batch and longest_seq: the largest that replay without an allocator retry with "
            f"{REPLAY_MARGIN:.0%} of what the step adds to the built model's reserve left free; max_batch at "
            f"{m.seq_len} tokens; longest_seq: the longest sequence at micro-batch 1 (a multiple of 64); 0: not even "
            f"the smallest fits")


def _write(frame: pl.DataFrame, head: str, format_: FitFormat, out: Path | None, plot: Path | None, rows: list[Fit],
           made_for: str) -> None:
    if out is not None:
        frame.write_parquet(out)
    if plot is not None:
        from memlab.cli.fit_plot import plot_fit

        plot_fit(frame, head, plot)
    if format_ is FitFormat.json:
        typer.echo(json.dumps({"header": head, "for": made_for, "rows": frame.to_dicts(),
                               "predicted": [dataclasses.asdict(r) for r in rows]}))
    elif format_ is FitFormat.csv:
        typer.echo(frame.write_csv(), nl=False)
    elif format_ is FitFormat.markdown:
        typer.echo(_markdown(frame, head))
    else:
        _rich(frame, head)


def _markdown(frame: pl.DataFrame, head: str) -> str:
    cols = frame.columns
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in frame.iter_rows()]
    return "\n".join(lines)


def _rich(frame: pl.DataFrame, head: str) -> None:
    from rich.table import Table

    from memlab.cli.console import make_console

    table = Table(title=head, title_justify="left")
    for c in frame.columns:
        table.add_column(c, justify="left" if c in ("profile", "note") else "right")
    for row in frame.iter_rows():
        table.add_row(*("" if v is None else ("yes" if v is True else "no" if v is False else str(v)) for v in row))
    make_console().print(table)


def register(app: typer.Typer) -> None:
    app.command("fit")(fit)
