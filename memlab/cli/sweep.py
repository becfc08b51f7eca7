"""`memlab sweep`: run a queue of profiles headless, one child process per run, through the core supervisor."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from memlab.cli.options import DeviceOpt, ExperimentOpt, RunsDirOpt, SetOpt, StepsOpt
from memlab.core.units import gib


def sweep(
    profiles: Annotated[str, typer.Option("--profiles", help="Comma-separated profile names or TOML paths, run in this order.")],
    experiment: ExperimentOpt = "auto",
    device: DeviceOpt = "auto",
    runs_dir: RunsDirOpt = "runs",
    steps: StepsOpt = None,
    set_: SetOpt = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", help="Run each profile on N ranks through torchrun (memlab run --nproc); profiles must be ddp or fsdp.")] = None,
) -> None:
    """Train several profiles one after another, each in a fresh process; a failed run is recorded and the sweep goes on."""
    from memlab.core.config import load_profile
    from memlab.core.environment import resolve_device
    from memlab.core.runstore import ensure_runs_dir
    from memlab.core.supervisor import ChildRun, ChildSpec

    names = [p.strip() for p in profiles.split(",") if p.strip()]
    if not names:
        from memlab.core.errors import MemlabError

        raise MemlabError("--profiles is empty; give a comma-separated list, e.g. baseline,bf16,gradcp_bf16")
    for name in names:
        load_profile(name)  # fail on a typo before spending an hour on the first runs
    ensure_runs_dir(Path(runs_dir))  # and on a runs folder no child could write to
    dev = resolve_device(device)
    overrides = list(set_ or []) + ([f"train.steps={steps}"] if steps is not None else [])
    current: list[ChildRun] = []
    stopping = False

    def on_sigint(signum, frame):  # noqa: ARG001
        nonlocal stopping
        if stopping:
            return
        stopping = True
        typer.echo("\nstopping: the current run is asked to stop and keeps what it has; finished runs are kept", err=True)
        for child in current:
            child.cancel()

    previous = signal.signal(signal.SIGINT, on_sigint)
    results = []
    try:
        for i, name in enumerate(names, 1):
            if stopping:
                break
            spec = ChildSpec(profile=name, experiment=experiment, device=dev.type, runs_dir=runs_dir, overrides=overrides,
                             extra_args=["--nproc", str(nproc)] if nproc is not None else [])  # the child becomes torchrun
            t0 = time.monotonic()
            typer.echo(f"[{i}/{len(names)}] {name} ...", err=True)
            last_step: dict = {}

            def on_event(ev: dict) -> None:
                if ev["event"] == "step":
                    last_step.update(ev)

            child = ChildRun(spec, on_event)
            current[:] = [child]
            result = child.wait()
            current.clear()
            results.append((name, result))
            s = result.summary or {}
            tps = s.get("tokens_per_s")
            peak = s.get("peak_alloc_bytes") or s.get("peak_host_rss_bytes")
            detail = f"{s.get('steps', last_step.get('step', -1) + 1)} steps"
            if tps:
                detail += f" · {tps:,.0f} tok/s"
            if peak:
                detail += f" · peak {gib(peak)}"
            if s.get("val_ppl") is not None:
                detail += f" · val ppl {s['val_ppl']:.2f}"
            message = f" · {result.message}" if result.status != "finished" and result.message else ""
            typer.echo(f"[{i}/{len(names)}] {name}: {result.status} in {time.monotonic() - t0:.1f}s · {detail}{message} · {result.run_dir or 'no run folder'}", err=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    done = sum(r.status == "finished" for _, r in results)
    typer.echo(f"sweep: {done}/{len(names)} finished" + (" (stopped early)" if stopping else "") + f"; compare with: memlab table {runs_dir}", err=True)
    if stopping:
        raise typer.Exit(130)


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
