"""`memlab find-batch` (the largest micro-batch that fits, measured) and `memlab estimate` (the peak, predicted),
and `resolve_max_batch` behind `memlab run --batch-size max`."""

from __future__ import annotations


import dataclasses
import json
import time
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from memlab.cli.options import GpusOpt, JsonFormatOpt, SetOpt, wants_json
from memlab.core.units import gib, gib_number, parse_size

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from memlab.core.batchfind import ProbeResult
    from memlab.core.gpu_memory import GpuInfo
    from memlab.core.config import Experiment, Profile
    from memlab.core.predict import Card, MaxBatch, Prediction
    from memlab.core.predict.analytic import Estimate

FRAGMENTATION_HINT = 0.10

ExperimentOpt = Annotated[str, typer.Option("--experiment", "-e", help="Built-in experiment name or a TOML path; auto = gpt2s (the GPU default, wherever this runs).")]
ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="Built-in profile name (memlab profiles) or a TOML file.")]
_SIZES = "e.g. 24GiB, 40GB, 48G or bytes (G/GiB = 1024^3, GB = 1000^3)"
GpuMemoryOpt = Annotated[Optional[str], typer.Option("--gpu-memory", help=f"Memory to fit in, {_SIZES}. find-batch caps each probe at it (set_per_process_memory_fraction) to emulate a smaller card.")]
EstimateMemoryOpt = Annotated[Optional[str], typer.Option("--gpu-memory", help=f"The card to predict the largest micro-batch for, {_SIZES}; default: this GPU, or an 80 GB H100 where there is none.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (bytes) instead of a table.")]


def _err_console() -> Console:
    from memlab.cli.console import make_console

    return make_console(stderr=True)


def _load(experiment: str, profile: str, overrides: list[str]) -> tuple[Experiment, Profile]:
    """auto = gpt2s: both commands are about a GPU, wherever they run."""
    from memlab.cli.options import resolve

    exp, prof = resolve("gpt2s" if experiment == "auto" else experiment, profile, "cuda", overrides)
    from memlab.core.techniques import check_plan  # torch: only once the names and values are known to be good

    check_plan(exp, prof)
    return exp, prof


# ---------------------------------------------------------------------------------------------- estimate


def estimate(
    profile: ProfileOpt,
    experiment: ExperimentOpt = "auto",
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="Effective batch (train.batch_size, over all ranks); the micro-batch is it divided by accumulation.steps x --nproc.")] = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", help="World size: predict one GPU's peak among N ranks (memlab run --nproc N); the profile's distributed.mode (ddp, fsdp, cpu_offload) says what is sharded.")] = None,
    gpu_memory: EstimateMemoryOpt = None,
    method: Annotated[str, typer.Option("--method", help="auto (trace; with --nproc above 1, analytic) | trace (alias fake: one step of the real TrainStep on fake tensors, and the allocator replay: seconds, no GPU, no memory) | analytic (the GPT formula: instant, tensors and a fragmentation margin).")] = "auto",
    longest_seq: Annotated[bool, typer.Option("--longest-seq", help="Also search the longest sequence (a multiple of 64) that fits at this micro-batch, by the same method.")] = False,
    as_json: JsonOpt = False,
    format_: JsonFormatOpt = None,
    set_: SetOpt = None,
) -> None:
    """Predict the peak GPU memory of a training step, by component, and the largest micro-batch that fits."""
    from memlab.cli.options import refuse_flag_and_set
    from memlab.core.errors import ConfigError

    if method not in ESTIMATE_METHODS:
        raise ConfigError(f"--method {method!r} is not valid; choose one of: {', '.join(ESTIMATE_METHODS)}")
    as_json = wants_json(as_json, format_)
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive integer, got {batch_size}")
    refuse_flag_and_set(set_, batch_size=batch_size)
    if gpu_memory is not None:
        parse_size(gpu_memory)  # refused before the checks that import torch
    overrides = list(set_ or []) + ([f"train.batch_size={batch_size}"] if batch_size is not None else [])
    from memlab.cli.answers import answered
    from memlab.cli.options import resolve
    from memlab.core.config import to_dict

    exp, prof = resolve("gpt2s" if experiment == "auto" else experiment, profile, "cuda", overrides)
    inputs = {"experiment": to_dict(exp), "profile": to_dict(prof), "nproc": nproc, "gpu_memory": gpu_memory,
              "method": method, "longest_seq": longest_seq, "json": as_json}
    answered("estimate", inputs, lambda: _estimate(exp, prof, nproc, gpu_memory, method, longest_seq, as_json))


def _estimate(exp: Experiment, prof: Profile, nproc: int | None, gpu_memory: str | None, method: str,
              longest_seq: bool, as_json: bool) -> None:
    """The estimate itself: the plan's checks (torch from here), the prediction, the max-batch search, the page."""
    from memlab.core.errors import ConfigError
    from memlab.core.techniques import check_plan

    check_plan(exp, prof)
    from memlab.core import predict as P  # torch from here: the names and values are known to be good
    from memlab.core.predict.analytic import vocab_for
    from memlab.core.predict.prediction import family_of
    from memlab.core.predict.trace import traces_kept

    world = _world(exp, prof, nproc)
    # auto is the trace wherever it can run: one process (the analytic formula alone speaks for several ranks)
    traced = method in ("fake", "trace") or (method == "auto" and (world == 1 or family_of(exp) != "gpt"))
    if traced and world > 1:
        raise ConfigError(f"--method {method} measures one process; with --nproc use --method analytic")
    card = P.card_for(gpu_memory)
    with traces_kept():  # the peaks' trace serves the max-batch search too
        result = P.predict(exp, prof, card=card, method="trace" if traced else "analytic", world_size=world)
        traced = traced and result.method == "trace"  # the gpt family's formula where the trace refuses (FSDP2)
        analytic = P.predict(exp, prof, card=card, method="analytic") if traced and family_of(exp) == "gpt" else None
        # the allocator replay's max batch is the one never above what fits
        found = P.max_batch(exp, prof, card, replay=traced, world_size=world, at=result.micro_batch)
        longest = P.longest_sequence(exp, prof, card, result.micro_batch, result.method) if longest_seq else None
    vocab_from = vocab_for(exp)[1]
    if as_json:
        typer.echo(json.dumps(_estimate_json(result, analytic, found, card, vocab_from, world, traced)
                              | ({"max_seq_len": longest} if longest_seq else {})))
        return
    from memlab.core.predict.maxbatch import guards

    _print_estimate(result, analytic, found, card, vocab_from, world, prof.distributed.mode, guards(exp, prof))
    if longest_seq:
        typer.echo(f"longest sequence at micro-batch {result.micro_batch} in {gib(card.total_bytes)} ({card.where}): "
                   f"{longest} tokens ({result.method}, a multiple of 64)")
    if traced:
        _print_replayed(found.replayed, found.not_replayed, card.where, family_of(exp), result.outside_bytes)


ESTIMATE_METHODS = ("auto", "analytic", "trace", "fake")


def _world(exp: Experiment, prof: Profile, nproc: int | None) -> int:
    """--nproc, checked: the combinations `memlab run --nproc` refuses are refused here too."""
    from memlab.core.errors import ConfigError
    from memlab.core.techniques import check_plan

    world = 1 if nproc is None else nproc
    if world < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}")
    if nproc is not None or prof.distributed.mode != "none":
        check_plan(exp, prof, world)
    return world


def _estimate_json(result: Prediction, analytic: Prediction | None, found: MaxBatch, card: Card, vocab_from: str,
                   world: int, replay_too: bool) -> dict:
    """One object: the prediction (bytes), one max_batch (the one to plan for), the others named for what they are."""
    out = result.to_dict() | {"memory_bytes": card.total_bytes, "memory": card.where, "max_batch": found.max_batch,
                              "max_batch_at_least": found.at_least, "analytic_max_batch": found.analytic_bound,
                              "vocab_from": vocab_from, "world_size": world}
    if analytic is not None:
        out["analytic_total_bytes"] = analytic.total_bytes
    if replay_too:
        out["replayed"] = dataclasses.asdict(found.replayed) if found.replayed else {"refused": found.not_replayed}
    return out


def _outside(outside: int) -> str:
    return f" and {gib(outside)} a process group's NCCL holds outside the allocator" if outside else ""


def _print_replayed(r, no_replay: str, where: str, family: str = "gpt", outside: int = 0) -> None:
    if r is None:
        typer.echo(f"allocator replay: {no_replay}")
        return
    mode = "expandable_segments:True" if r.expandable_segments else "default settings"
    typer.echo(f"allocator replay (CUDA's caching allocator, {mode}, over this step's trace): {gib(r.reserved_bytes)} reserved at "
               f"micro-batch {r.micro_batch}, {r.fragmentation:.1%} of it no tensor's; max micro-batch {'at least ' if r.limit_reached else ''}{r.max_batch} without an allocator retry in "
               f"{gib(r.budget_bytes)} for the allocator ({where} less the CUDA context{_outside(outside)}), {r.margin:.0%} of what the step adds to the built model's reserve left free")
    typer.echo(f"  traced here by {r.traced_by}; find-batch on a GPU traces again with that machine's releases"
               + (" (a compiled step's buffer plan is Inductor's, and another release's can differ)" if r.compiled else ""))
    checked = "hf" if family == "hf" else "compiled" if r.compiled else "blocks" if r.blocks else r.expandable_segments
    typer.echo(f"  {REPLAY_CHECKED[checked]}")


REPLAY_CHECKED = {  # what each mode of the allocator model was checked against, by expandable_segments (or compiled)
    False: "checked against the GPU: reserved within 0.1% in 11 H100 runs; max batch never "
           "above find-batch's and within 5.5% in 16 H100 searches, exact in 4 held out (the deep and long shapes)",
    True: "expandable segments as torch 2.11's allocator source has them, followed to the byte by its allocator on hand-made and "
          "random traces; max batch within 3.4% of find-batch's in 6 held-out searches (one 102 for 101)",
    "compiled": "a compiled step: Inductor's own buffers, from its wrapper code for CUDA traced on fake tensors; on the H100 the seed "
                "shape's compile and compile_budget reserved 3.94 / 3.60 GiB replayed against 3.93 / 3.63 measured at micro-batch 64, max "
                "batch 398 / 430 against find-batch's 400 / 432 (seen while it was written: not held out); float8's with torchao's own "
                "Float8Linear in the graphs: on the H100 none of six searches above find-batch's, the five that finished within 5.1% as traced "
                "under the run's torch (a trace by another torch release can differ: -23% "
                "on the seq-8192 shape traced by torch 2.13)",
    "blocks": "per-op checkpointing as a GPU runs it, each block's compiled graphs: on the H200, max batch none above "
              "find-batch's in 13 searches, all within 7% (5 held out from every rule); at the largest batch that fit, allocated peaks within 0.05% and reserves "
              "-0.3% to +1.9% on ten GPT shapes (bench/results/prediction-check/sac-compiled)",
    "hf": "a transformers model, checked on the H100: peaks of Llama-3.2-1B's and Qwen2.5-1.5B's steps (full, LoRA, QLoRA, DoRA, "
          "checkpointed, per-op checkpointed as compiled blocks, compiled) within 0.1% (bench/results/hf-h100/predicted.md); "
          "memlab fit's max batch exact in 8 GPU searches, its longest sequence -4.4% to 0.0% (bench/results/fit-8b-h200, "
          "fit-heldout-h200: Qwen2.5-1.5B held out, -3.0% and -2.8%); max batch under 24 GiB on an H200 none above, 9 of 10 "
          "exact (bench/results/hf-heldout-h200); held out on GPT-2 and Gemma-2's layers, 3 of 10 above until CUDA's autocast "
          "lists and Inductor's padding were modelled, none above since (bench/results/heldout-arch-h200)",
}


def _cuda_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _print_estimate(result: Prediction, analytic: Prediction | None, found: MaxBatch, card: Card, vocab_from: str,
                    world: int = 1, mode: str = "none", guarded: bool = False) -> None:
    from memlab.cli.console import make_console
    from rich.table import Table

    from memlab.core.predict.analytic import COMPONENTS
    from memlab.core.predict.maxbatch import SEARCH_TOKENS

    console = make_console()
    console.print(f"[bold]{result.profile}[/] · {result.experiment} · micro-batch {result.micro_batch} x {result.accumulation} accumulation · {result.method} estimate"
                  + (f" · {mode} x{world}, per GPU" if mode != "none" else ""))
    t = Table(header_style="bold", box=None, pad_edge=False)
    t.add_column("component")
    t.add_column("GiB", justify="right")
    t.add_column("bytes", justify="right")
    for c in COMPONENTS:
        t.add_row(c.replace("_", " "), gib_number(result.components[c]), f"{result.components[c]:,}")
    t.add_row("[bold]total (peak)[/]", f"[bold]{gib_number(result.total_bytes)}[/]", f"[bold]{result.total_bytes:,}[/]")
    console.print(t)
    console.print(f"peak at: {result.peak_phase} · {result.params / 1e6:.1f}M parameters · vocabulary {result.vocab_size:,} (from {vocab_from})")
    if analytic is not None:
        diff = (analytic.total_bytes - result.total_bytes) / max(result.total_bytes, 1)
        console.print(f"analytic estimate: {gib(analytic.total_bytes)} ({diff:+.1%} against the fake-tensor measurement)")
    if found.max_batch:
        figure = f"at least {found.max_batch}" if found.at_least else str(found.max_batch)
        console.print(f"predicted max micro-batch in {gib(card.total_bytes)} ({card.where}): [bold]{figure}[/] (the one to plan for)")
        if found.at_least:
            console.print(f"  [dim]a lower bound: the search stops at {SEARCH_TOKENS:,} tokens a micro-batch, and that fits[/]")
        if found.replayed is None:  # the analytic figure assumes a fragmentation margin; --method trace replays the allocator
            console.print("  [dim]tensors and a fragmentation margin: an upper estimate where large transient blocks (logits and their "
                          "gradients) fragment the allocator; --method trace replays CUDA's caching allocator over the step[/]")
        else:
            guard = (f", no more than the analytic upper bound ({found.analytic_bound}) with the plain 5% fragmentation margin"
                     if guarded else "")
            console.print(f"  [dim]the allocator replay's{guard}; find-batch and the study on a GPU start there[/]")
    else:
        console.print(f"predicted: not even micro-batch 1 fits in {gib(card.total_bytes)} ({card.where})")
    for n in result.notes:
        console.print(f"  [dim]{n}[/]")



# ---------------------------------------------------------------------------------------------- find-batch


def _require_cuda(what: str) -> None:
    from memlab.core.errors import DeviceError

    if not _cuda_visible():
        raise DeviceError(
            f"{what} needs CUDA: it trains real steps on the GPU until one runs out of memory, and no CUDA GPU is "
            "visible here. What works without one: memlab estimate --profile NAME (predicted peak and max batch)"
        )


def _cap_for(gpu_memory: str | None, gpu: GpuInfo | None) -> int | None:
    from memlab.core.errors import DeviceError

    if gpu_memory is None:
        return None
    from memlab.core.predict.analytic import card_size

    cap = card_size(gpu_memory)
    if gpu is not None and cap > gpu.total_bytes:
        raise DeviceError(f"--gpu-memory {gpu_memory} ({gib(cap)}) is more than this GPU has ({gpu.name}: {gib(gpu.total_bytes)})")
    return cap


def _probe_line(i: int, r: ProbeResult) -> str:
    frag = f"{r.fragmentation:.1%}" if r.fragmentation is not None else "—"
    return (
        f"probe {i}: micro-batch {r.batch} {r.verdict} · peak {gib(r.peak_alloc_bytes)} · reserved {gib(r.peak_reserved_bytes)}"
        f" · fragmentation {frag} · retries {r.alloc_retries if r.alloc_retries is not None else '—'} · {r.seconds:.1f} s"
    )


def _probe_failed(error: Exception, seen: list[ProbeResult]) -> None:
    """A probe that neither fit nor ran out of memory: one line, with what the probes before it measured.
    Exit 2 when the profile itself was refused and nothing could be measured; 1 otherwise."""
    from memlab.core.batchfind import ProbeRejected

    fits = [p.batch for p in seen if p.fits]
    known = f" (measured before it: micro-batch {max(fits)} fits)" if fits else ""
    typer.echo(f"memlab: error: {error}{known}", err=True)
    raise typer.Exit(2 if isinstance(error, ProbeRejected) and not seen else 1)


def _allocator_advice(probes: list[ProbeResult], max_batch: int, expandable: bool) -> str | None:
    best = next((p for p in reversed(probes) if p.fits and p.batch == max_batch), None)
    if best is None or expandable:
        return None
    retries, frag = best.alloc_retries or 0, best.fragmentation or 0.0
    if retries or frag > FRAGMENTATION_HINT:
        return (
            f"at micro-batch {max_batch} the allocator retried {retries} time(s) and {frag:.0%} of reserved memory held no "
            "tensors: expandable segments may fit more and avoid a later OOM: --set allocator.expandable_segments=true "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
        )
    return None


def _start_from_estimate(exp: Experiment, prof: Profile, memory: int, on_gpu: bool, capped: bool) -> tuple[int, int | None]:
    """Where the doubling starts, and the estimator's prediction it starts from (on a GPU, the allocator replay's where
    it is smaller)."""
    from memlab.core import batchfind as bf
    from memlab.core.predict import predicted_max_batch

    pred = predicted_max_batch(exp, prof, memory, replay=on_gpu, capped=capped)
    return bf.start_below(pred), pred


def find_batch(
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Built-in profile name (memlab profiles) or a TOML file.")] = None,
    experiment: ExperimentOpt = "auto",
    gpu_memory: GpuMemoryOpt = None,
    steps: Annotated[int, typer.Option("--steps", "-k", help="Full training steps per probe (forward, backward, optimizer).")] = 3,
    start: Annotated[Optional[int], typer.Option("--start", help="First micro-batch to try (default: a power of two under the estimator's prediction).")] = None,
    max_: Annotated[Optional[int], typer.Option("--max", help="Largest micro-batch to try.")] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore cached answers for this experiment, profile, GPU and cap.")] = False,
    allow_retries: Annotated[bool, typer.Option("--allow-retries", help="Count a probe that finished only after allocator retries (cache flushed: it fits only just, and slowly) as a fit.")] = False,
    as_json: JsonOpt = False,
    format_: JsonFormatOpt = None,
    set_: SetOpt = None,
    profiles: Annotated[Optional[str], typer.Option("--profiles", help="Several profiles, comma-separated: one search each, one at a time on each GPU (--gpus); instead of --profile.")] = None,
    gpus: GpusOpt = None,
    seq_len: Annotated[Optional[str], typer.Option("--seq-len", help="max: search the longest sequence (a multiple of 64) that fits at --batch-size, instead of the largest micro-batch.")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="With --seq-len max: the micro-batch the sequence is searched at (default 1).")] = None,
) -> None:
    """Find the largest micro-batch that completes k full training steps: grow, then bisect; one process per probe.
    With --profiles a,b,c the searches are spread over the GPUs (--gpus), one at a time on each."""
    from memlab.core.errors import ConfigError

    if (profile is None) == (profiles is None):
        raise ConfigError("give --profile NAME, or --profiles a,b,c for several searches over the GPUs")
    as_json = wants_json(as_json, format_)
    _check_sequence_search(seq_len, batch_size, profiles)
    if seq_len is not None:
        _find_longest_sequence(profile, experiment, gpu_memory, steps, list(set_ or []), batch_size or 1, as_json)
        return
    if profiles is not None:
        _find_batches(profiles, experiment, gpu_memory, steps, start, max_, refresh, allow_retries, as_json, list(set_ or []), gpus)
        return
    exp, prof = _checked_find_args(experiment, profile, gpu_memory, steps, start, max_, list(set_ or []))
    from memlab.core.batchfind import ProbeError  # polars and torch from here: the input is known to be good
    from memlab.core.lanes import plan_lanes

    lane = plan_lanes(gpus, "cuda")[0] if gpus is not None else None  # --gpus 2: this one search on GPU 2
    args = _FindArgs(experiment, gpu_memory, steps, start, max_, refresh, allow_retries, list(set_ or []))
    err = _err_console()
    try:
        found = _search_one(profile, exp, prof, args, lane, err.print)
    except ProbeError as e:  # one line, with what the probes before it measured
        _probe_failed(e, getattr(e, "seen", []))
    if as_json:
        typer.echo(json.dumps(found.json()))
        return
    _print_found(found.result, found.report, found.memory_view, found.flipped, found.flip)


def _check_sequence_search(seq_len: str | None, batch_size: int | None, profiles: str | None) -> None:
    from memlab.core.errors import ConfigError

    if seq_len is not None and seq_len != "max":
        raise ConfigError(f"--seq-len {seq_len!r}: find-batch takes --seq-len max (the longest sequence that fits); "
                          "set a length to search the micro-batch at with --set model.seq_len=N")
    if batch_size is not None and seq_len is None:
        raise ConfigError("--batch-size is the micro-batch of a sequence search: give it with --seq-len max")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be a positive integer, got {batch_size}")
    if seq_len is not None and profiles is not None:
        raise ConfigError("--seq-len max searches one profile: give --profile NAME")


def _find_longest_sequence(profile: str, experiment: str, gpu_memory: str | None, steps: int, overrides: list[str],
                           micro: int, as_json: bool) -> None:
    """The longest sequence that fits at `micro`, measured: probes from the predicted length outwards."""
    exp, prof = _checked_find_args(experiment, profile, gpu_memory, steps, None, None, overrides)
    from memlab.cli.fit_measure import measured_longest_seq
    from memlab.core import gpu_memory as gpus
    from memlab.core.predict import card_for
    from memlab.core.predict.maxbatch import longest_sequence

    err = _err_console()
    predicted = longest_sequence(exp, prof, card_for(gpu_memory), micro)
    err.print(f"[dim]predicted: {predicted} tokens at micro-batch {micro}; probing from there[/dim]")
    cap = _cap_for(gpu_memory, gpus.gpu_info())
    found = measured_longest_seq(profile, experiment, overrides, exp, micro, predicted, cap, err.print)
    if as_json:
        typer.echo(json.dumps({"profile": profile, "experiment": experiment, "micro_batch": micro,
                               "max_seq_len": found, "predicted_max_seq_len": predicted}))
        return
    typer.echo(f"longest sequence at micro-batch {micro}: {found} tokens (a multiple of 64; predicted {predicted})")


@dataclasses.dataclass
class _FindArgs:
    """What every search of one find-batch invocation shares."""

    experiment: str
    gpu_memory: str | None
    steps: int
    start: int | None
    max_: int | None
    refresh: bool
    allow_retries: bool
    overrides: list[str]


@dataclasses.dataclass
class _Found:
    """One search's answer, and what find-batch prints or writes as JSON about it."""

    result: Any
    report: dict[str, Any]
    memory_view: dict[str, Any]
    flipped: Any
    flip: bool
    profile: str
    experiment: str
    args: _FindArgs

    def json(self) -> dict:
        return _found_json(self.result, self.report, self.memory_view, self.flipped, self.flip, self.profile, self.experiment,
                           self.args.steps, self.args.allow_retries)


def _search_one(profile: str, exp: Experiment, prof: Profile, a: _FindArgs, lane: Any, say) -> _Found:
    """One profile's search (its probes pinned to `lane`'s GPU, if any), then the probe with the allocator setting
    flipped. A ProbeError is raised with `.seen`: the probes measured before it."""
    from memlab.core import batchfind as bf
    from memlab.core import gpu_memory as gpus
    from memlab.core import predict as P

    gpu = gpus.gpu_info(lane.indices[0] if lane is not None and lane.indices else 0)
    cap = _cap_for(a.gpu_memory, gpu)
    gpu_name = gpu.name if gpu else "unknown GPU"
    memory = cap or (gpu.total_bytes if gpu else 0)
    key = bf.cache_key(exp, prof, gpu_name, cap, steps=a.steps, allow_retries=a.allow_retries)
    fit, oom = (0, None) if a.refresh else bf.cached_bounds(key)[:2]
    hint, predicted = _start_from_estimate(exp, prof, memory, P.card.cuda_here(), cap is not None) if memory else (1, None)
    env = lane.env if lane is not None else {}
    exp_ref = "gpt2s" if a.experiment == "auto" else a.experiment
    where = f" · {lane.name}" if lane is not None and lane.indices else ""
    say(f"find-batch: {prof.name} on {exp.name} · {gpu_name}{where}" + (f" capped at {gib(cap)}" if cap else "") + f" · {a.steps} steps a probe"
        + (f" · cached: fits {fit}" + (f", OOM at {oom}" if oom else "") if fit or oom else ""))
    if predicted and (note := P.valid_for(gpu_name).note()):
        say(f"the prediction it starts from (micro-batch {predicted}) is {note}")
    probe = bf.ChildProbe(profile, exp_ref, a.overrides, seq_len=exp.model.seq_len, steps=a.steps, cap_bytes=cap,
                          allow_retries=a.allow_retries, env=env)
    seen: list[ProbeResult] = []

    def on_probe(r: ProbeResult) -> None:
        seen.append(r)
        say(_probe_line(len(seen), r))

    meta = {"experiment": exp.name, "profile": prof.name, "gpu": gpu_name, "cap_bytes": cap, "steps": a.steps}
    t0 = time.monotonic()
    try:
        result = bf.search_recorded(probe, key, meta, known=(fit, oom), on_probe=on_probe, start=a.start or hint, limit=a.max_)
    except bf.ProbeError as e:
        e.seen = seen
        raise
    finally:
        probe.close()
    flip = not prof.allocator.expandable_segments
    flipped = _flipped_allocator_probe(profile, exp_ref, exp, a.overrides, a.steps, cap, flip, result.max_batch, a.allow_retries, env)
    say(f"probe {len(seen) + 1}: micro-batch {result.max_batch} with expandable_segments:{flip}: {_flip_summary(result.probes, flipped)}")
    memory_view = {"device_total_bytes": memory or None, "allocator_budget_bytes": _budget(result.probes)}
    report = {"seconds": time.monotonic() - t0, "predicted": predicted, "cap": cap, "gpu_name": gpu_name,
              "advice": _allocator_advice(result.probes, result.max_batch, prof.allocator.expandable_segments), "max": a.max_,
              "lane": lane.name if lane is not None and lane.indices else None}
    return _Found(result, report, memory_view, flipped, flip, prof.name, exp.name, a)


def _find_batches(profiles: str, experiment: str, gpu_memory: str | None, steps: int, start: int | None, max_: int | None,
                  refresh: bool, allow_retries: bool, as_json: bool, overrides: list[str], gpus: str | None) -> None:
    """find-batch --profiles a,b,c: every profile checked first, then one search at a time on each GPU lane; a
    search that fails is reported and the others go on. Exit 1 when any failed."""
    from memlab.core.batchfind import ProbeError
    from memlab.core.errors import ConfigError
    from memlab.core.lanes import map_on_lanes, plan_lanes
    from rich.markup import escape

    names = [p.strip() for p in profiles.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise ConfigError(f"--profiles {profiles!r}: give each profile once, comma-separated, e.g. baseline,bf16,gradcp_bf16")
    lanes = plan_lanes(gpus, "cuda")
    loaded = {n: _checked_find_args(experiment, n, gpu_memory, steps, start, max_, overrides) for n in names}
    args = _FindArgs(experiment, gpu_memory, steps, start, max_, refresh, allow_retries, overrides)
    err = _err_console()

    def search(name: str, lane: Any) -> _Found | str:
        try:
            return _search_one(name, *loaded[name], args, lane, lambda line: err.print(escape(f"[{lane.name} {name}] ") + line))
        except ProbeError as e:
            return f"{e}"

    found = map_on_lanes(search, names, lanes)
    if as_json:
        typer.echo(json.dumps([f.json() if isinstance(f, _Found) else {"profile": n, "error": f} for n, f in zip(names, found)]))
    else:
        for n, f in zip(names, found):
            typer.echo(f"{n}: max micro-batch {f.result.max_batch} ({f.report['gpu_name']}, {f.report['lane'] or 'cpu'}, "
                       f"{len(f.result.probes)} probes, {f.report['seconds']:.1f} s)" if isinstance(f, _Found) else f"{n}: failed: {f}")
    if not all(isinstance(f, _Found) for f in found):
        raise typer.Exit(1)


def _found_json(result, report: dict, memory_view: dict, flipped, flip: bool, profile: str, experiment: str, steps: int, allow_retries: bool) -> dict:
    """find-batch --json: the search, the memory it assumed, and what the flipped allocator setting changed."""
    from memlab.core import batchfind as bf

    return bf.result_dict(result) | memory_view | {
        "profile": profile, "experiment": experiment, "gpu": report["gpu_name"], "memory_cap_bytes": report["cap"], "steps": steps,
        "predicted_max_batch": report["predicted"], "cached": not result.probes, "seconds": report["seconds"],
        "advice": report["advice"], "allow_retries": allow_retries,
        "expandable_segments": {"setting": flip, "probe": bf.probe_dict(flipped)},
    }


def _checked_find_args(experiment: str, profile: str, gpu_memory: str | None, steps: int, start: int | None,
                       max_: int | None, overrides: list[str]) -> tuple[Experiment, Profile]:
    """Every refusal find-batch can meet, before the first probe: bad numbers, a bad size, no GPU, and whatever
    the probes' own technique checks would refuse."""
    from memlab.core.errors import ConfigError

    for name, v in (("--start", start), ("--max", max_)):
        if v is not None and v < 1:
            raise ConfigError(f"{name} must be a positive integer, got {v}")
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}")
    if gpu_memory is not None:
        parse_size(gpu_memory)  # bad input is reported before anything else
    exp, prof = _load(experiment, profile, overrides)
    _require_cuda("find-batch")
    import torch

    from memlab.core.techniques import check_techniques

    check_techniques(exp, prof, torch.device("cuda"))  # what the probes would refuse, refused once, here
    return exp, prof


def _budget(probes: list[ProbeResult]) -> int | None:
    """The allocator budget the probes measured and set under --gpu-memory (None: not capped, or not told)."""
    return next((p.allocator_budget_bytes for p in reversed(probes) if p.allocator_budget_bytes), None)


def _flipped_allocator_probe(profile_ref: str, exp_ref: str, exp: Experiment, overrides: list[str], steps: int,
                             cap: int | None, expandable: bool, batch: int, allow_retries: bool = False,
                             lane_env: dict[str, str] | None = None) -> ProbeResult:
    """One more probe at the found batch, with allocator.expandable_segments the other way (in the child's env):
    what that setting would change. A probe that fails is reported in its message, never raised."""
    from memlab.core import batchfind as bf

    probe = bf.ChildProbe(profile_ref, exp_ref, overrides, seq_len=exp.model.seq_len, steps=steps, cap_bytes=cap,
                          env=(lane_env or {}) | bf.expandable_probe_env(expandable), allow_retries=allow_retries)
    try:
        return probe(batch)
    except bf.ProbeError as e:
        return bf.ProbeResult(batch, False, message=f"failed: {e}")
    finally:
        probe.close()


def _print_found(result: Any, report: dict[str, Any], memory_view: dict[str, Any], flipped: ProbeResult, expandable: bool) -> None:
    cap, total, budget = report["cap"], memory_view["device_total_bytes"], memory_view["allocator_budget_bytes"]
    exact = f"{result.min_oom} runs out of memory" if result.min_oom else f"the limit {report['max']} fits: the true maximum may be larger"
    typer.echo(f"max micro-batch: {result.max_batch} ({exact})")
    typer.echo(f"probes: {len(result.probes)}" + (" (answer from the cache)" if not result.probes else "") + f" · time {report['seconds']:.1f} s · {report['gpu_name']}" + (f" · cap {gib(cap)}" if cap else ""))
    if cap:
        outside = f"{gib(total - budget)} outside it (the driver's reserve, the CUDA context, workspaces), measured through NVML" if budget else "not reported by the probes"
        typer.echo(f"memory: a card of {gib(total)} in total assumed (--gpu-memory) · allocator budget {gib(budget)} ({outside})")
    elif total:
        typer.echo(f"memory: the whole card, {gib(total)} · allocator not capped")
    typer.echo(f"with expandable_segments:{expandable} at micro-batch {result.max_batch}: " + _flip_summary(result.probes, flipped))
    if report["predicted"]:
        typer.echo(f"estimator predicted: {report['predicted']} ({(report['predicted'] - result.max_batch) / result.max_batch:+.1%})")
    if report["advice"]:
        typer.echo(f"note: {report['advice']}")


def _flip_summary(probes: list[ProbeResult], flipped: ProbeResult) -> str:
    """What the other allocator setting changed at the found batch, against the search's own probe there."""
    if flipped.retried or flipped.message.startswith("failed: "):
        return flipped.message
    if not flipped.fits:
        return "out of memory"
    base = next((p for p in reversed(probes) if p.fits and p.batch == flipped.batch), None)
    frag = f"{flipped.fragmentation:.0%}" if flipped.fragmentation is not None else "—"
    line = f"fits · reserved {gib(flipped.peak_reserved_bytes)} · fragmentation {frag} · retries {flipped.alloc_retries if flipped.alloc_retries is not None else '—'}"
    if base is not None and base.peak_reserved_bytes and flipped.peak_reserved_bytes:
        line += f" (reserved {(flipped.peak_reserved_bytes - base.peak_reserved_bytes) / base.peak_reserved_bytes:+.1%} against the search's probe)"
    return line


# ---------------------------------------------------------------------------------------------- run --batch-size max


def resolve_max_batch(
    exp: Experiment,
    prof: Profile,
    dev: torch.device,
    *,
    profile_ref: str,
    experiment_ref: str,
    overrides: list[str],
) -> tuple[int, int]:
    """(micro-batch, accumulation steps) for `memlab run --batch-size max`: the largest divisor of the effective
    batch (train.batch_size) that fits, measured by probes (cached); accumulation = batch / micro, so the
    optimisation is exactly the experiment's. When accumulation remains, the pick is verified with two
    micro-batches a step (gradients alive while the second runs), stepping down a divisor if that runs out."""
    import os

    from memlab.core import batchfind as bf
    from memlab.core import gpu_memory

    if dev.type != "cuda":
        from memlab.core.errors import DeviceError

        raise DeviceError("--batch-size max measures what fits on the GPU and needs CUDA; on CPU give a number (memlab estimate --profile NAME predicts the max batch)")
    B = exp.train.batch_size
    cands = bf.divisors(B)
    gpu = gpu_memory.gpu_info(dev.index or 0)
    gpu_name = gpu.name if gpu else "unknown GPU"
    raw_cap = os.environ.get(gpu_memory.MEMORY_ENV)
    cap = parse_size(raw_cap, gpu_memory.MEMORY_ENV) if raw_cap else None
    err = _err_console()
    meta = {"experiment": exp.name, "profile": prof.name, "gpu": gpu_name, "cap_bytes": cap, "steps": 3}
    t0 = time.monotonic()
    n_probes = 0

    def on_probe(r: ProbeResult) -> None:
        nonlocal n_probes
        n_probes += 1
        err.print("--batch-size max: " + _probe_line(n_probes, r))

    key = bf.cache_key(exp, prof, gpu_name, cap, steps=3)
    fit, oom, _ = bf.cached_bounds(key)
    probe = bf.ChildProbe(profile_ref, experiment_ref, overrides, seq_len=exp.model.seq_len, steps=3, cap_bytes=cap)
    try:
        result = bf.search_max_batch(probe, start=B, candidates=cands, known_fit=fit, known_oom=oom, on_probe=on_probe)
        bf.record_bounds(key, *bf.outcome_lists(result.probes), meta)
        # verify with accumulation: the gradients of the first micro-batch are alive during the second
        key2 = bf.cache_key(exp, prof, gpu_name, cap, steps=3, accumulation=2)
        verify = bf.ChildProbe(profile_ref, experiment_ref, overrides, seq_len=exp.model.seq_len, steps=3, accumulation=2, cap_bytes=cap)
        try:
            micro = _fits_with_accumulation(result.max_batch, B, verify, key2, meta, on_probe, prof.name)
        finally:
            verify.close()
    finally:
        probe.close()
    accum = B // micro
    err.print(f"--batch-size max: micro-batch {micro} x {accum} accumulation = batch {B} (largest divisor of {B} that fits"
              + (f", {n_probes} probes, {time.monotonic() - t0:.1f} s" if n_probes else ", from the cache") + ")")
    return micro, accum


def _fits_with_accumulation(micro: int, batch: int, verify, key: str, meta: dict, on_probe, profile: str) -> int:
    """The largest divisor of `batch` from `micro` down that also fits with two micro-batches a step (cached);
    `micro` itself when no accumulation remains."""
    from memlab.core import batchfind as bf

    cands = bf.divisors(batch)
    while batch // micro > 1:
        fit, oom, _ = bf.cached_bounds(key)
        if fit >= micro:
            break
        if oom is None or micro < oom:
            r = verify(micro)
            on_probe(r)
            bf.record_bounds(key, *bf.outcome_lists([r]), meta)
            if r.fits:
                break
        smaller = [d for d in cands if d < micro]
        if not smaller:
            raise bf.DoesNotFitError(f"micro-batch 1 with gradient accumulation runs out of memory ({profile})")
        micro = smaller[-1]
    return micro


# ---------------------------------------------------------------------------------------------- memory snapshot


def print_memory_report(result: dict[str, Any] | None, est: Estimate | None, console: Console | None = None) -> None:
    """`memlab run --memory-snapshot`: the measured breakdown at the peak beside the estimate's."""
    from memlab.cli.console import make_console
    from rich.table import Table

    from memlab.core.memsnapshot import CATEGORIES, estimate_categories

    console = console or make_console()
    if not result:
        console.print("memory snapshot: nothing recorded")
        return
    predicted = estimate_categories(est) if est is not None else {}
    console.print(f"[bold]memory at the peak[/], measured by the allocator ({result.get('when', '')})")
    t = Table(header_style="bold", box=None, pad_edge=False)
    for col, just in (("category", "left"), ("measured GiB", "right"), ("estimate GiB", "right"), ("diff", "right")):
        t.add_column(col, justify=just)
    for c in CATEGORIES:
        m, e = result["categories"].get(c, 0), predicted.get(c)
        diff = f"{(e - m) / m:+.0%}" if e is not None and m else "—"
        t.add_row(c.replace("_", " "), gib_number(m), gib_number(e), diff)
    total_e = est.total_bytes if est is not None else None
    t.add_row("[bold]total[/]", f"[bold]{gib_number(result['peak_bytes'])}[/]", "—" if total_e is None else f"[bold]{gib_number(total_e)}[/]",
              f"{(total_e - result['peak_bytes']) / result['peak_bytes']:+.1%}" if total_e and result["peak_bytes"] else "—")
    console.print(t)
    console.print(f"snapshot: {result.get('snapshot')} (open it at https://pytorch.org/memory_viz)")


def register(app: typer.Typer) -> None:
    app.command("find-batch")(find_batch)
    app.command("estimate")(estimate)
