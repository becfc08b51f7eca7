"""`memlab study`: every profile's max batch, a run of each at the common batch (and at its own max), and the report."""

from __future__ import annotations

import os
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memlab.cli.options import (DeviceOpt, GpusOpt, SetOpt, StepsOpt, check_token_cache, data_overrides, profile_list,
                                refuse_flag_and_set)

if TYPE_CHECKING:
    from memlab.core.study import Options, StudyState


def study(
    out: Annotated[str, typer.Option("--out", "-o", help="The study folder: study.json (state), runs/, report.md, report.html, comparison.parquet, commands.txt. Run again with the same --out to resume.")],
    profiles: Annotated[Optional[str], typer.Option("--profiles", help="Comma-separated profile names or TOML paths; all = every built-in single-GPU profile. Required for a new study; resuming, profiles not yet in it are added (it keeps the ones it has).")] = None,
    experiment: Annotated[Optional[str], typer.Option("--experiment", "-e", help="Built-in experiment or a TOML path; auto = gpt2s on CUDA, tiny on CPU.")] = None,
    recipe: Annotated[Optional[str], typer.Option("--recipe", help="One of the seeds' setups (seed-so-posts, seed-plwiki, seed-shopping); instead of --experiment.")] = None,
    gpu_memory: Annotated[Optional[str], typer.Option("--gpu-memory", help="Study as on a card of this size, e.g. 24GiB: on CUDA the max-batch probes and the runs are capped at it; on the CPU the predicted max batch assumes it.")] = None,
    batch: Annotated[Optional[str], typer.Option("--batch", help="Common effective batch: experiment (its train.batch_size), baseline-max (the largest batch the baseline fits) or a number.")] = None,
    at_max: Annotated[Optional[bool], typer.Option("--at-max/--no-at-max", help="Also train each profile at its own max micro-batch (another optimisation: perplexity not comparable).")] = None,
    steps: StepsOpt = None,
    set_: SetOpt = None,
    device: DeviceOpt = "auto",
    data: Annotated[Optional[str], typer.Option("--data", help="Replace the corpus: stdlib | a file or folder | hf:NAME[:CONFIG].")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="Replace the tokenizer: bpe:N | tokenizer.json | hf:NAME.")] = None,
    redo: Annotated[Optional[str], typer.Option("--redo", help="Comma-separated profiles of this study (or all) to measure again (after a fix): their max batch and runs are forgotten, their run folders moved to superseded/.")] = None,
    redo_max: Annotated[Optional[str], typer.Option("--redo-max", help="Comma-separated profiles of this study (or all) whose max batch to measure again (after a fix to find-batch); the runs at a batch taken from it are redone too, the rest kept.")] = None,
    lanes: Annotated[int, typer.Option("--lanes", help="Search the max batch of N profiles at once on each GPU, each capped at --gpu-memory (N caps must fit the card); training runs stay one at a time on a GPU, so no timing is shared.")] = 1,
    gpus: GpusOpt = None,
) -> None:
    """The whole comparison in one resumable command: max batch per profile, training at a common batch, the report.

    On CUDA the max micro-batch is measured (find-batch's probes, under --gpu-memory).
    On the CPU it is not measured: the estimator's prediction is shown, labelled as such.
    Several GPUs (--gpus, default every visible one): searches and runs go one at a time on each, the next to
    whichever GPU is free; each run records the GPU it ran on. A resumed study uses the GPUs it is given now.
    Ctrl-C (or SIGTERM) keeps what is done; the same command, or just --out, resumes.
    Exit status: 0 when every run finished, 1 when any did not, 2 for bad input, 130 when stopped.
    """
    _refuse_names_early(profiles, experiment)
    from memlab.core import study as st
    from memlab.core.lanes import plan_lanes

    refuse_flag_and_set(set_, steps=steps, data=data, tokenizer=tokenizer)
    out_path = Path(out)
    st.check_out(out_path)
    stored = st.load_state(out_path) if out_path.is_dir() else None
    options = _options(stored, profiles, experiment, recipe, gpu_memory, batch, at_max, steps, list(set_ or []) + data_overrides(data, None, tokenizer, None, None, None, None), device)
    plan = st.make_plan(options)
    plan.lanes = st.check_lanes(lanes, plan)
    gpu_lanes = plan_lanes(gpus, options.device)  # this invocation's GPUs: not part of the study's identity
    identity = options.identity(plan.experiment.fingerprint())
    if stored is not None:
        st.check_same_study(stored, identity, out_path)
    redone = _redo_list(redo, options, stored)
    redone_max = _redo_list(redo_max, options, stored, flag="--redo-max")
    st.check_reachable(plan.experiment, _args(options, out, offline=True))
    check_token_cache([plan.experiment.data])
    added = [p for p in options.profiles if stored is not None and p not in stored.options.profiles]
    if added:
        typer.echo(f"study: adding {', '.join(added)} to this study's profiles ({', '.join(stored.options.profiles)})", err=True)
    state = stored or st.StudyState(options, identity)
    state.options = options
    state.invocations.append(st.stamp(_invocation(options, out, redone, redone_max, lanes, gpus)))
    out_path.mkdir(parents=True, exist_ok=True)
    for folder in state.redo(redone, out_path) + state.redo(redone_max, out_path, max_only=True):
        typer.echo(f"redo: {folder} (kept, out of the report)", err=True)
    state.save(out_path)
    runner = st.Study(plan, state, out_path, lambda line: typer.echo(line, err=True), gpu_lanes)
    _run_stoppable(runner)
    st.write_report(state, out_path, plan.baseline)
    _finish(state, out_path, runner.stopping)


def _invocation(options: Options, out: str, redone: list[str], redone_max: list[str], lanes: int, gpus: str | None) -> str:
    """This invocation as the study records it (commands.txt): its options, and the flags that were one-off."""
    return ("memlab study " + _args(options, out) + (f" --redo {','.join(redone)}" if redone else "")
            + (f" --redo-max {','.join(redone_max)}" if redone_max else "")
            + (f" --lanes {lanes}" if lanes > 1 else "") + (f" --gpus {gpus}" if gpus is not None else ""))


def _refuse_names_early(profiles: str | None, experiment: str | None) -> None:
    """A mistyped profile or experiment, refused before the study's machinery (polars, torch) is imported: the
    message make_plan would give, in a fraction of the time. Everything else is checked where it was."""
    from memlab.core.config import load_experiment, load_profile

    if experiment is not None and experiment != "auto" and not (experiment.endswith(".toml") or "/" in experiment):
        load_experiment(experiment)  # a path: its message names the resolved path (see _options), so it waits
    if profiles is not None and profiles.strip() != "all":
        for name in (p.strip() for p in profiles.split(",") if p.strip()):
            load_profile(name)


def _redo_list(redo: str | None, options: Options, stored: StudyState | None, flag: str = "--redo") -> list[str]:
    """--redo's (or --redo-max's) profiles: each must be one this study has already begun (else nothing would be
    redone); all = every such profile."""
    from memlab.core.errors import ConfigError

    begun = sorted({i.profile for i in stored.items.values() if i.status != "pending"}) if stored is not None else []
    valid = [p for p in begun if p in options.profiles]
    names = valid if (redo or "").strip() == "all" else [p.strip() for p in (redo or "").split(",") if p.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ConfigError(f"{flag} {','.join(unknown)}: not a profile this study has run; valid: {', '.join(valid) or 'none yet: nothing has run'}")
    return names


def _options(stored: StudyState | None, profiles, experiment, recipe, gpu_memory, batch, at_max, steps, overrides, device) -> Options:
    """The options of this invocation: what is given, else what the stored study had."""
    from memlab.core.environment import device_type
    from memlab.core.errors import ConfigError
    from memlab.core.study import Options, check_recipe

    if recipe is not None and experiment is not None:
        raise ConfigError("--recipe and --experiment both name the experiment; give one")
    old = stored.options if stored is not None else None
    if profiles is None and old is None:
        raise ConfigError("--profiles is required for a new study (e.g. --profiles baseline,bf16,gradcp_bf16, or all)")
    names = _profile_names(profiles, old.profiles if old is not None else None)
    dev = device_type(device) if device != "auto" or old is None else old.device
    if recipe is not None:
        exp_ref = check_recipe(recipe)
    elif experiment is not None:
        exp_ref = experiment if experiment != "auto" else ("gpt2s" if dev == "cuda" else "tiny")
        exp_ref = str(Path(exp_ref).resolve()) if exp_ref.endswith(".toml") or "/" in exp_ref else exp_ref
    else:
        exp_ref = old.experiment if old is not None else ("gpt2s" if dev == "cuda" else "tiny")
    keep = old is not None and recipe is None and experiment is None
    return Options(
        profiles=names, experiment=exp_ref, device=dev, recipe=recipe or (old.recipe if keep else None),
        gpu_memory=gpu_memory if gpu_memory is not None else (old.gpu_memory if old else None),
        batch=batch if batch is not None else (old.batch if old else "experiment"),
        at_max=at_max if at_max is not None else (old.at_max if old else False),
        steps=steps if steps is not None else (old.steps if old else None),
        overrides=overrides if overrides or old is None else old.overrides,
    )


def _profile_names(profiles: str | None, studied: list[str] | None) -> list[str]:
    """--profiles for a new study; on a resumed one, the profiles it has and then any new ones (a study never drops
    what it measured: its runs stay in the report; another --out starts a study of other profiles)."""
    from memlab.core.study import single_gpu_profiles

    if profiles is None:
        return list(studied or [])
    given = sorted(single_gpu_profiles(), key=lambda n: n != "baseline") if profiles.strip() == "all" else profile_list(profiles)
    return list(studied or []) + [p for p in given if p not in (studied or [])]


def _args(o: Options, out: str, offline: bool = False) -> str:
    """The study's command line: exact (commands.txt), or for the offline hint without the Hub's data and tokenizer."""
    args = ["--recipe", o.recipe] if o.recipe else ["--experiment", o.experiment]
    args += ["--profiles", ",".join(o.profiles), "--out", out, "--device", o.device, "--batch", o.batch]
    args += (["--gpu-memory", o.gpu_memory] if o.gpu_memory else []) + (["--at-max"] if o.at_max else [])
    args += ["--steps", str(o.steps)] if o.steps is not None else []
    for item in o.overrides:
        if not (offline and item.split("=")[0] in ("data.source", "data.tokenizer")):
            args += ["--set", item]
    return shlex.join(args)


def _run_stoppable(runner) -> None:
    """Run the study; the first Ctrl-C (or SIGTERM, e.g. from `timeout`) stops it: the current run keeps what it
    has, finished work is kept, and the same command resumes. A second one quits at once (see _on_signal)."""
    on_signal = _on_signal(runner, lambda line: typer.echo(line, err=True))
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        runner.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _on_signal(runner, say, quit_now=os._exit):
    """The first signal asks the study to stop between items; the second quits now, for what cannot be cut short
    (the report, or a probe's child that does not stop). Every finished item is already saved
    (study.json is written after each, atomically), the children stop when their parent is gone, and the report
    is written by the next invocation."""
    def on_signal(signum, frame):  # noqa: ARG001
        if runner.stopping:
            say("\nquitting now: finished items are saved; the report is written when the same command resumes")
            quit_now(130)
            return
        say("\nstopping: the current run is asked to stop; finished work is kept; the same command resumes (again to quit now)")
        runner.stop()
    return on_signal


def _finish(state: StudyState, out: Path, stopped: bool) -> None:
    runs = [i for i in state.items.values() if i.kind != "max" and i.profile in state.options.profiles]
    done = sum(i.status == "finished" for i in runs)
    typer.echo(f"study: {done}/{len(runs)} runs finished" + (" (stopped; run the same command to resume)" if stopped else "")
               + f"; report: {out / 'report.md'} and {out / 'report.html'}", err=True)
    if stopped:
        raise typer.Exit(130)
    if done < len(runs):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("study")(study)
