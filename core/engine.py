"""The engine: prepare(experiment, profile, device), then train(...) -> summary. No printing, no Textual: it only
emits events.

`prepare` is every refusal: the techniques' checks (memlab.core.techniques), the data, the batch against the data.
The runner calls it before it makes a run folder, so bad input is one line and leaves nothing behind. `train`
trains one profile on one experiment and measures it as DESIGN.md defines. Whatever stops the run (finished,
OOM, NaN, Ctrl-C / SIGTERM, any other error) it ends with exactly one `finished` or `failed` event carrying the
summary of what it had, so the run store always has something to write.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import datetime, timezone
from dataclasses import dataclass
from typing import Any

import torch

import memlab
from memlab.core import data as data_mod
from memlab.core import distributed
from memlab.core.config import Experiment, Profile, describe_changes, describe_overrides, to_dict
from memlab.core.environment import environment
from memlab.core.errors import MemlabError
from memlab.core.predict.analytic import peak_for_run
from memlab.core.events import Sink, make_event
from memlab.core.flops import flops_per_token, mfu, mfu_at_bf16_peak
from memlab.core.meters import (NvmlSampler, PhaseMeter, StepRecord, WallClock, host_peak_rss_bytes, host_rss_bytes,
                                nvml_index, reset_host_peak)
from memlab.core.optim import lr_at, set_lr
from memlab.core.runfolder import DiskFull, is_disk_full
from memlab.core.step import TrainStep
from memlab.core.techniques import build_step, check_techniques
from memlab.core.techniques.accumulation import micro_batch

# fp16 with a GradScaler skips steps whose gradients overflow; this many in a row means the run has diverged.
FP16_NAN_PATIENCE = 20


class Interrupted(Exception):
    """Raised in the training thread by a SIGTERM handler (SIGINT arrives as KeyboardInterrupt)."""


class Diverged(Exception):
    pass


def padded_vocab(tokenizer_vocab: int, requested: int) -> int:
    if requested:
        if requested < tokenizer_vocab:
            raise MemlabError(f"model.vocab_size ({requested}) is smaller than the tokenizer's vocabulary ({tokenizer_vocab}); use 0 (= from the tokenizer) or at least {tokenizer_vocab}")
        return requested
    return -(-tokenizer_vocab // 64) * 64  # a multiple of 64 keeps the LM head's matmul on fast tile sizes


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p90(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.9 * len(s)) - 1)]


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, autocast: Any, device: torch.device) -> float:
    """Token-weighted mean loss over the fixed validation slice."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            loss = model(x, y)
        total += loss.float().item() * y.numel()
        count += y.numel()
    model.train(was_training)
    return total / max(count, 1)


class _Run:
    """State of one training run, so the summary can be built from wherever it stopped."""

    def __init__(self, experiment: Experiment, profile: Profile, device: torch.device):
        self.experiment, self.profile, self.device = experiment, profile, device
        self.t0 = time.perf_counter()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.records: list[StepRecord] = []
        self.wall = WallClock()  # each step's wall time, between-step work included (started again in the loop)
        self.info: dict[str, Any] = {}
        self.environment: dict[str, Any] = {}  # read once the device is known (memlab.core.environment)
        self.steps_done = 0
        self.tokens = 0
        self.first_step_s: float | None = None  # from process start when the caller knows it (memlab run), else from train()
        self.first_step_engine_s: float | None = None  # from train()
        self.val_loss: float | None = None
        self.last_loss: float | None = None
        self.skipped: int | torch.Tensor = 0  # fp16: a device tensor, read once, in the summary
        self.nvml: NvmlSampler | None = None
        self.dist: distributed.DistContext | None = None  # this rank among the run's ranks (memlab.core.distributed)

    def summary(self, status: str) -> dict[str, Any]:
        """One row of figures as DESIGN.md defines them, from the steps measured so far (after warm-up)."""
        measured = [r for r in self.records if r.step >= self.experiment.train.measure_after] or self.records[-1:]
        return (self._identity(status) | self._memory(measured) | self._speed(measured) | self._quality()
                | {"torch_version": torch.__version__, "memlab_version": memlab.__version__,
                   "memlab_commit": self.info.get("memlab_commit"), "started_at": self.started_at})

    def _identity(self, status: str) -> dict[str, Any]:
        """Who ran, on what, with which techniques (as applied: the kernel that ran, not the one asked for)."""
        e, p, info = self.experiment, self.profile, self.info
        return {
            "run_id": info.get("run_id"),
            "profile": p.name,
            "experiment": e.name,
            "experiment_id": e.fingerprint(),
            "status": status,
            "device": self.device.type,
            "gpu_name": info.get("gpu_name"),
            "gpu_index": info.get("gpu_index"),
            "gpu_serial": info.get("gpu_serial"),
            "n_gpus": info.get("world_size", 1) if self.device.type == "cuda" else 0,
            "params": info.get("params"),
            "trainable_params": info.get("trainable_params"),
            "frozen_params": info.get("frozen_params"),
            "model_family": info.get("model_family", e.model.family),
            "architecture": info.get("architecture"),
            "finetune": info.get("finetune", p.finetune.method),
            "adapter_bytes": info.get("adapter_bytes"),
            "batch_size": e.train.batch_size,
            "micro_batch": info.get("micro_batch"),
            "grad_accum": p.accumulation.steps,
            "seq_len": e.model.seq_len,
            "precision": p.precision.dtype,
            "attention_kernel": info.get("kernel").name if info.get("kernel") else p.attention.kernel,
            "window": p.attention.window,
            "checkpointing": info.get("checkpointing", p.checkpointing.mode),
            "optimizer": info.get("optimizer", p.optimizer.name),
            "compile": info.get("compile", "off"),
            "kernels": info.get("kernels", "off"),
            "cuda_graph": info.get("cuda_graph", "off"),
            "overrides": describe_overrides(p),
            "loss_kernel": info.get("loss_kernel", "full logits"),
            "steps": self.steps_done,
            "tokens": self.tokens,
        }

    def _memory(self, measured: list[StepRecord]) -> dict[str, Any]:
        cuda = self.device.type == "cuda"

        def peak(phase: str) -> int | None:
            vals = [r.peak[phase] for r in measured if r.peak[phase] is not None]
            return max(vals) if vals else None

        phase_peaks = [peak(ph) for ph in ("fwd", "bwd", "opt")]
        known = [v for v in phase_peaks if v is not None]
        reserved = [r.peak_reserved for r in measured if r.peak_reserved is not None]
        stats = torch.cuda.memory_stats(self.device) if cuda else {}
        return {
            "peak_alloc_fwd_bytes": phase_peaks[0],
            "peak_alloc_bwd_bytes": phase_peaks[1],
            "peak_alloc_opt_bytes": phase_peaks[2],
            "peak_alloc_bytes": max(known) if known else None,
            "peak_reserved_bytes": max(reserved) if reserved else None,
            "peak_nvml_bytes": self.nvml.peak_used_bytes if self.nvml and self.nvml.available else None,
            "peak_nvml_process_bytes": self.nvml.peak_process_bytes if self.nvml and self.nvml.available else None,
            "peak_host_rss_bytes": host_peak_rss_bytes(),
            "alloc_retries": stats.get("num_alloc_retries") if cuda else None,
            "ooms": stats.get("num_ooms") if cuda else None,
            "estimate_peak_bytes": self.info.get("estimate_peak_bytes"),
            "max_batch": self.info.get("max_batch"),
            "gpu_memory_cap_bytes": self.info.get("gpu_memory_cap_bytes"),
            "allocator_budget_bytes": self.info.get("allocator_budget_bytes"),
        }

    def _speed(self, measured: list[StepRecord]) -> dict[str, Any]:
        p, info = self.profile, self.info
        step_ms = [r.step_ms for r in measured]
        tps = info.get("tokens_per_step", 0) / (statistics.median(step_ms) / 1000.0) if step_ms and step_ms[0] > 0 else None
        fpt = info.get("flops_per_token")
        gpu, world = info.get("gpu_name"), info.get("world_size", 1)
        on_gpu = self.device.type == "cuda" and fpt
        compile_s = None
        if p.compile.enabled and self.first_step_engine_s is not None and step_ms:
            # the first step's time beyond a normal step, setup (data, model) excluded: what compiling cost
            compile_s = max(0.0, self.first_step_engine_s - info.get("setup_s", 0.0) - statistics.median(step_ms) / 1000.0)
        return {
            "step_ms_median": _median(step_ms),
            "step_ms_p90": _p90(step_ms),
            "fwd_ms_median": _median([r.fwd_ms for r in measured if r.fwd_ms is not None]),
            "bwd_ms_median": _median([r.bwd_ms for r in measured if r.bwd_ms is not None]),
            "opt_ms_median": _median([r.opt_ms for r in measured if r.opt_ms is not None]),
            "tokens_per_s": tps,
            "tokens_per_s_wall": self._wall_tokens_per_s(measured),
            "flops_per_token": fpt,
            "mfu": mfu(tps, fpt, gpu, p.precision.dtype, world) if on_gpu else None,
            "mfu_bf16_peak": mfu_at_bf16_peak(tps, fpt, gpu, world) if on_gpu else None,
            "time_to_first_step_s": self.first_step_s,
            "compile_s": compile_s,
            "total_s": time.perf_counter() - self.t0,
        }

    def _wall_tokens_per_s(self, measured: list[StepRecord]) -> float | None:
        """Tokens over the measured steps' wall time (their laps: the gaps between steps included, evals not)."""
        laps = [self.wall.laps[r.step] for r in measured if r.step in self.wall.laps]
        seconds = sum(laps)
        return self.info.get("tokens_per_step", 0) * len(laps) / seconds if laps and seconds > 0 else None

    def _quality(self) -> dict[str, Any]:
        return {
            "final_loss": self.last_loss,
            "val_loss": self.val_loss,
            "val_ppl": math.exp(self.val_loss) if self.val_loss is not None and self.val_loss < 700 else None,
            "skipped_steps": self._skipped_steps() if self.profile.precision.dtype == "fp16" else None,
        }

    def _skipped_steps(self) -> int | None:
        try:
            return int(self.skipped)  # the one read of the device's count
        except Exception:  # noqa: BLE001 (a device in an error state: the summary still gets written)
            return None


@dataclass
class Prepared:
    """What `prepare` found: the run can start. Everything a user could get wrong has been checked."""

    experiment: Experiment
    profile: Profile
    device: torch.device
    tokens: data_mod.TokenData
    vocab_size: int  # the model's: the tokenizer's, padded
    world: int  # ranks (1 outside torchrun)
    micro_batch: int  # sequences per forward on one rank
    total_steps: int
    val: list  # the fixed validation slice, in micro-batches


def prepare(experiment: Experiment, profile: Profile, device: torch.device | str = "cpu", world: int | None = None) -> Prepared:
    """Every refusal a run can meet, as a one-line MemlabError, before a run folder or any event exists."""
    e, device = experiment, torch.device(device)
    world = world or distributed.world_size()
    check_techniques(e, profile, device, world)
    tokens = _load_tokens(e)
    vocab = padded_vocab(tokens.vocab_size, e.model.vocab_size)
    micro = micro_batch(e, profile, world)
    per_epoch = data_mod.steps_per_epoch(len(tokens.train), e.train.batch_size, e.model.seq_len)  # corpus >= one batch
    total_steps = e.train.steps or max(1, math.ceil(e.train.epochs * per_epoch))
    val = data_mod.val_batches(tokens.val, micro_batch=micro, seq_len=e.model.seq_len)  # val slice >= one window
    return Prepared(e, profile, device, tokens, vocab, world, micro, total_steps, val)


def _load_tokens(e: Experiment) -> data_mod.TokenData:
    """The experiment's tokens. A cold cache is filled by a child process first: training the tokenizer and
    tokenizing would leave modules and heap in this process, and its host memory would then depend on whether the
    cache was warm. Should the child fail, loading here raises the error as one line."""
    import dataclasses
    import json
    import subprocess
    import sys

    if data_mod.is_cached(e.data):  # else checks that the cache can be written: one line, not the child's traceback
        return data_mod.load_tokens(e.data)
    code = ("import json, sys; from memlab.core.config import experiment_from_dict; from memlab.core.data import "
            "load_tokens; load_tokens(experiment_from_dict(json.loads(sys.argv[1])).data)")
    subprocess.run([sys.executable, "-c", code, json.dumps(to_dict(e))], capture_output=True, check=False)
    return dataclasses.replace(data_mod.load_tokens(e.data), cache_hit=False)


def train(
    experiment: Experiment,
    profile: Profile,
    sink: Sink,
    *,
    device: torch.device | str = "cpu",
    run_id: str | None = None,
    meters: bool = True,
    extra_info: dict[str, Any] | None = None,
    prepared: Prepared | None = None,
) -> dict[str, Any]:
    """Train `profile` on `experiment`, emitting events to `sink`; returns the summary (its "status" says how it ended).

    Without `prepared`, prepares first (a refusal then raises MemlabError, before any event); after that nothing
    raises: every failure becomes a `failed` event and the summary's status."""
    prepared = prepared or prepare(experiment, profile, device)
    run = _Run(experiment, profile, prepared.device)
    run.info.update(run_id=run_id, **(extra_info or {}))
    try:
        _train(run, prepared, sink, meters)
    except torch.OutOfMemoryError as e:
        _fail(run, sink, "oom", f"CUDA out of memory in {run.info.get('phase', 'setup')}: {str(e).splitlines()[0]}")
    except Diverged as e:
        _fail(run, sink, "nan", str(e))
    except (KeyboardInterrupt, Interrupted):
        # Count the steps steps.parquet holds: the last step run is measured one step late and never published.
        run.steps_done = len(run.records)
        run.tokens = run.steps_done * run.info.get("tokens_per_step", 0)
        _fail(run, sink, "interrupted", f"stopped after step {run.steps_done}")
    except Exception as e:  # noqa: BLE001 (any other failure still leaves a readable run)
        if _is_oom(e):
            _fail(run, sink, "oom", f"out of memory in {run.info.get('phase', 'setup')}: {str(e).splitlines()[0]}")
        elif is_disk_full(e):  # the run store's DiskFull names the file and the folder; anything else says what it can
            _fail(run, sink, "error", str(e) if isinstance(e, DiskFull) else f"disk full: {str(e).splitlines()[0]}")
        else:
            _fail(run, sink, "error", f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            run.info["exception"] = e
    finally:
        if run.nvml:
            run.nvml.stop()
        if run.dist:
            run.dist.close()  # ends the one-process group made for ddp/fsdp outside torchrun
    return run.info["summary"]


def _is_oom(e: BaseException) -> bool:
    text = str(e)
    return any(s in text for s in ("CUDNN_STATUS_ALLOC_FAILED", "CUBLAS_STATUS_ALLOC_FAILED", "out of memory"))


def _final_summary(run: _Run, status: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run's summary; distributed, rank 0 gathers every rank's and the event carries one row per rank."""
    summary = run.summary(status)
    if run.dist is None:
        return summary, {}
    summary, ranks = run.dist.finish(summary)
    return summary, ({"ranks": ranks} if ranks is not None else {})


def _fail(run: _Run, sink: Sink, reason: str, message: str) -> None:
    summary, ranks = _final_summary(run, reason)
    run.info["summary"] = summary
    try:
        sink.emit(make_event("failed", reason=reason, message=message, step=run.steps_done, summary=summary, **ranks))
    except Exception:  # noqa: BLE001 (e.g. the disk is full: the failure is already the run's outcome)
        pass


# ---------------------------------------------------------------------------------------------- one run, in order


def _train(run: _Run, prepared: Prepared, sink: Sink, meters: bool) -> None:
    reset_host_peak()  # host memory counts from here: data preparation (tokenizing, on a cold cache) is not the run's
    step = _build(run, prepared)
    _start_sampler(run, sink, meters)
    _emit_started(run, prepared, step, sink)
    _train_loop(run, prepared, step, sink, meters)
    _eval(run, prepared, step, sink, run.steps_done)  # the final validation, always
    summary, ranks = _final_summary(run, "finished")  # distributed: gathered on rank 0, one row per rank
    run.info["summary"] = summary
    sink.emit(make_event("finished", summary=summary, **ranks))


def _build(run: _Run, prepared: Prepared) -> TrainStep:
    """The ranks, then the step with every technique applied; what the summary needs to know about them."""
    e, p = run.experiment, run.profile
    run.dist = dctx = distributed.setup(p, prepared.device)  # rank, world size; a one-process group for ddp/fsdp alone
    run.device = dctx.device
    run.environment = environment(run.device, dctx.world_size)  # one read per run: it asks git and NVML
    run.info.update(world_size=dctx.world_size, rank=dctx.rank, micro_batch=prepared.micro_batch,
                    tokens_per_step=e.train.batch_size * e.model.seq_len, phase="model")
    torch.manual_seed(e.train.seed)
    step = build_step(e, p, run.device, prepared.vocab_size, dist=dctx)
    n_params, m = step.model.num_params(), e.model
    run.info.update(
        kernel=step.kernel,
        params=n_params,
        model_family=step.model.family,
        architecture=step.model.architecture,
        flops_per_token=flops_per_token(step.model.flops_params(), m.n_layer, m.d_model, m.seq_len, step.kernel.window),
        gpu_name=run.environment["gpu_name"] if run.device.type == "cuda" else None,
        gpu_index=run.environment["gpu_index"] if run.device.type == "cuda" else None,
        gpu_serial=run.environment["gpu_serial"] if run.device.type == "cuda" else None,
        memlab_commit=run.environment["git_sha"],
        **step.applied,
    )
    if e.model.family == "gpt":  # the analytic estimate is memlab's GPT's (memlab.core.estimate)
        run.info.setdefault("estimate_peak_bytes", peak_for_run(e, p, vocab_size=prepared.vocab_size, micro_batch=prepared.micro_batch, device=run.device.type, world_size=dctx.world_size))
    return step


def _start_sampler(run: _Run, sink: Sink, meters: bool) -> None:
    if run.device.type == "cuda" and meters:
        run.nvml = NvmlSampler(nvml_index(run.device), on_sample=lambda s: sink.emit(make_event("gpu_sample", **s))).start()


def _emit_started(run: _Run, prepared: Prepared, step: TrainStep, sink: Sink) -> None:
    e, p, tokens = run.experiment, run.profile, prepared.tokens
    sink.emit(
        make_event(
            "started",
            run_id=run.info.get("run_id"),
            run_dir=run.info.get("run_dir"),
            started_at=run.started_at,
            device=run.device.type,
            profile=to_dict(p),
            experiment=to_dict(e),
            experiment_id=e.fingerprint(),
            changes=describe_changes(p),
            environment=run.environment,
            params=run.info["params"],
            vocab_size=prepared.vocab_size,
            total_steps=prepared.total_steps,
            micro_batch=prepared.micro_batch,
            grad_accum=step.accumulation,
            world_size=run.info["world_size"],  # ranks (processes, GPUs on CUDA); micro_batch is per rank
            distributed=run.info.get("distributed", "none"),
            tokens_per_step=run.info["tokens_per_step"],
            data={"source": tokens.source, "tokenizer": tokens.tokenizer, "train_tokens": int(len(tokens.train)), "val_tokens": int(len(tokens.val)), "cache_hit": tokens.cache_hit},
            attention_kernel=step.kernel.name,
            nvml=run.nvml.available if run.nvml else False,
        )
    )


def _batches(run: _Run, prepared: Prepared):
    e, p = run.experiment, run.profile
    return data_mod.batch_iterator(
        prepared.tokens.train,
        batch_size=e.train.batch_size,
        micro_batches=p.accumulation.steps,
        seq_len=e.model.seq_len,
        seed=e.train.seed,
        steps=prepared.total_steps,
        rank=run.dist.rank,  # each rank takes a disjoint slice of the same global batch
        world_size=run.dist.world_size,
        pin_memory=p.loader.pin_memory,
        workers=p.loader.workers,
    )


def _train_loop(run: _Run, prepared: Prepared, step: TrainStep, sink: Sink, meters: bool) -> None:
    e, total = run.experiment, prepared.total_steps
    meter = PhaseMeter(run.device, enabled=meters)
    publisher = _StepPublisher(run, sink, step, total)
    step.train_model.train()
    run.info["setup_s"] = time.perf_counter() - run.t0

    def on_phase(name: str) -> None:
        run.info["phase"] = name

    run.wall.restart()
    for i, micro_batches in enumerate(_batches(run, prepared)):  # the loader's time falls in this step's lap
        publisher.lr[i] = lr = lr_at(i, e.train, total)
        set_lr(step.optimizer, lr)
        meter.start_step(i)
        result = step.run(micro_batches, meter, on_phase)
        run.skipped += result.skipped
        done = meter.finish_step(run.dist.reduce_loss(result.loss_sum), result.grad_norm)  # read one step late
        _count_step(run, i)
        _after_step(run, step, i)
        if done is not None:
            publisher.publish(done)
        run.wall.lap(i)
        if e.train.eval_every and (i + 1) % e.train.eval_every == 0 and i + 1 < total:
            publisher.publish(meter.flush())
            _eval(run, prepared, step, sink, i + 1)
            run.wall.restart()  # evaluating is not training
    publisher.publish(meter.flush())


def _after_step(run: _Run, step: TrainStep, i: int) -> None:
    """The techniques' checks after a step (the memory cap measures the grown CUDA context again); what they
    revise in their summary lines reaches the run's record."""
    for check in step.after_step:
        check(i)
    if step.after_step:
        run.info.update(step.applied)


def _count_step(run: _Run, i: int) -> None:
    run.steps_done = i + 1
    run.tokens += run.info["tokens_per_step"]
    if i == 0:
        if run.device.type == "cuda":
            torch.cuda.synchronize()
        run.first_step_engine_s = time.perf_counter() - run.t0
        start = run.info.get("process_start")
        run.first_step_s = time.time() - start if start else run.first_step_engine_s


def _eval(run: _Run, prepared: Prepared, step: TrainStep, sink: Sink, at_step: int) -> None:
    run.info["phase"] = "eval"
    run.val_loss = evaluate(step.train_model, prepared.val, step.autocast, run.device)
    sink.emit(make_event("eval", step=at_step, val_loss=run.val_loss, val_ppl=math.exp(min(run.val_loss, 700))))


class _StepPublisher:
    """Turns each measured StepRecord into a `step` event; stops the run when the loss has diverged."""

    def __init__(self, run: _Run, sink: Sink, step: TrainStep, total_steps: int):
        self.run, self.sink, self.total_steps = run, sink, total_steps
        self.fp16 = step.scaler is not None
        self.bad_in_a_row = 0
        self.lr: dict[int, float] = {}

    def publish(self, rec: StepRecord | None) -> None:
        if rec is None:
            return
        loss = self.run.dist.read_loss(rec.loss)  # the mean over ranks; raises StopRequested on every rank alike
        # floats from here: the run keeps every record, and a tensor each (pinned host memory on CUDA) would add up
        rec.loss = loss
        rec.grad_norm = rec.grad_norm.item() if isinstance(rec.grad_norm, torch.Tensor) else rec.grad_norm
        self._check_finite(loss, rec.step)
        self.run.records.append(rec)
        self.sink.emit(self._event(rec))

    def _check_finite(self, loss: float | None, step: int) -> None:
        if loss is not None and math.isfinite(loss):
            self.bad_in_a_row = 0
            self.run.last_loss = loss
            return
        self.bad_in_a_row += 1  # fp16: the GradScaler skips such steps; only a long streak means divergence
        if not self.fp16 or self.bad_in_a_row >= FP16_NAN_PATIENCE:
            raise Diverged(f"loss is {loss} at step {step}" + (f" ({self.bad_in_a_row} steps in a row)" if self.fp16 else ""))

    def _event(self, rec: StepRecord) -> dict:
        tokens = self.run.info["tokens_per_step"]
        return make_event(
            "step",
            step=rec.step,
            total_steps=self.total_steps,
            loss=rec.loss,
            lr=self.lr[rec.step],
            grad_norm=rec.grad_norm,
            step_ms=rec.step_ms,
            fwd_ms=rec.fwd_ms,
            bwd_ms=rec.bwd_ms,
            opt_ms=rec.opt_ms,
            tokens=tokens,
            tokens_per_s=tokens / (rec.step_ms / 1000.0) if rec.step_ms > 0 else None,
            peak_alloc_fwd_bytes=rec.peak["fwd"],
            peak_alloc_bwd_bytes=rec.peak["bwd"],
            peak_alloc_opt_bytes=rec.peak["opt"],
            peak_reserved_bytes=rec.peak_reserved,
            host_rss_bytes=host_rss_bytes(),
            measured=rec.step >= self.run.experiment.train.measure_after,
        )
