"""`memlab profiles`, `memlab experiments` and `memlab env`: what is built in, and what memlab sees."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def profiles() -> None:
    """The built-in profiles, one line each, with what they change and what they need: CUDA, or an extra to install."""
    from memlab.cli.console import make_console
    from rich.table import Table
    from rich.text import Text

    from memlab.core.config import builtin_names, describe_changes, load_profile
    from memlab.core.requirements import needs

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("profile", "needs", "description", "changes"):
        table.add_column(col, overflow="fold", no_wrap=col == "needs")
    missing: dict[str, list[str]] = {}  # extra -> the profiles that need it
    for name in builtin_names("profile"):
        p = load_profile(name)
        n = needs(p)
        if n.extra:
            missing.setdefault(n.extra, []).append(name)
        table.add_row(name, Text(needs_label(n)), Text(p.description), describe_changes(p))  # Text: "memlab[liger]" is not markup
    console = make_console()
    console.print(table)
    console.print("[dim]needs CUDA: refused on the CPU backend (its technique needs a GPU); every other profile runs on both[/]")
    for extra, names in missing.items():
        console.print(Text(f"needs memlab[{extra}]: not installed here, so {', '.join(names)} would be refused: pip install 'memlab[{extra}]'", style="dim"))


def needs_label(n) -> str:
    """The `needs` cell: CUDA, a missing extra (memlab[torchao]), or both."""
    return ", ".join(x for x in ("CUDA" if n.cuda else "", f"memlab[{n.extra}]" if n.extra else "") if x)


def experiments() -> None:
    """The built-in experiments (what stays fixed in a comparison)."""
    from memlab.cli.console import make_console
    from rich.table import Table

    from memlab.core.config import builtin_names, load_experiment

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("experiment", "description", "model", "data"):
        table.add_column(col, overflow="fold")
    for name in builtin_names("experiment"):
        e = load_experiment(name)
        m = e.model
        model = f"{m.n_layer}L {m.d_model}d {m.n_head}h T={m.seq_len}" + (f" ({m.source})" if m.family == "hf" else "")
        table.add_row(name, e.description, model, f"{e.data.source} {e.data.tokenizer}")
    make_console().print(table)


def models() -> None:
    """The model families and the built-in presets (published config values; no weights are downloaded)."""
    from memlab.cli.console import make_console
    from rich.table import Table

    from memlab.core.models.presets import PRESETS
    from memlab.core.models.shape import max_positions, shape_of

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("preset", "architecture", "params", "layers", "width", "heads / kv", "ffn", "vocab", "positions", "config of"):
        table.add_column(col, overflow="fold")
    for name, preset in PRESETS.items():
        c, s = preset["config"], shape_of(preset["config"])
        table.add_row(name, c["architectures"][0], f"{preset['params'] / 1e9:.2f}B", str(s["n_layer"]), str(s["d_model"]),
                      f"{s['n_head']} / {s['n_kv_head']}", str(s["d_ff"]), f"{s['vocab_size']:,}", f"{max_positions(c):,}", preset["hub"])
    console = make_console()
    console.print("[bold]families[/]  gpt: memlab's own GPT (the default; its fused kernels and analytic estimate)  ·  "
                  "hf: any causal LM the installed transformers knows (pip install 'memlab\\[hf]')")
    console.print(table)
    console.print("[dim]use one: --experiment llama-1b (built-in), --model llama-3.2-1b, --model ./config.json or "
                  "--model ./checkpoint-folder/; --set model.n_layer=2 shrinks any of them[/]")


def env(as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False) -> None:
    """GPU, driver, torch, CUDA, flash-attn, NVML: what memlab sees."""
    from memlab.core.environment import environment

    info = environment()
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    width = max(map(len, info))
    for key, value in info.items():
        typer.echo(f"{key.ljust(width)}  {'—' if value is None else value}")


def register(app: typer.Typer) -> None:
    app.command("profiles")(profiles)
    app.command("experiments")(experiments)
    app.command("models")(models)
    app.command("env")(env)
