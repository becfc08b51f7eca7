"""The engine: train(experiment, profile, sink) -> summary. No printing, no Textual: it only emits events.

One call trains one profile on one experiment and measures it as DESIGN.md defines. Whatever stops the run
(finished, OOM, NaN, Ctrl-C / SIGTERM, any other error) it ends with exactly one `finished` or `failed` event
carrying the summary of what it had, so the run store always has something to write.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from datetime import datetime, timezone
from typing import Any

import torch

from memlab.core import data as data_mod
from memlab.core import distributed
from memlab.core.attention import build_attention
from memlab.core.config import Experiment, Profile, describe_changes, to_dict, validate_pair
from memlab.core.environment import environment
from memlab.core.errors import DeviceError, MemlabError
from memlab.core.estimate import peak_for_run
from memlab.core.events import Sink, make_event
from memlab.core.flops import flops_per_token, mfu
from memlab.core.meters import NvmlSampler, PhaseMeter, StepRecord, host_peak_rss_bytes, host_rss_bytes, nvml_index
from memlab.core.model import GPT, GPTConfig
from memlab.core.optim import build_optimizer, lr_at, set_lr
from memlab.core.techniques import apply_techniques

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


def check_device_support(profile: Profile, device: torch.device) -> None:
    """Knobs that need CUDA fail here, before any work, with a message that says so."""
    if device.type == "cuda":
        return
    if profile.precision.dtype == "tf32":
        raise DeviceError("precision.dtype = tf32 needs CUDA (TF32 is a tensor-core mode); use fp32 on the CPU backend")
    if profile.checkpointing.offload:
        raise DeviceError("checkpointing.offload moves activations from the GPU to the CPU and needs CUDA")
    if profile.optimizer.offload:
        raise DeviceError("optimizer.offload moves optimizer state from the GPU to the CPU and needs CUDA")
    if profile.loader.pin_memory:
        raise DeviceError("loader.pin_memory speeds host-to-GPU copies and needs CUDA; set it to false on CPU")
    if profile.allocator.expandable_segments:
        raise DeviceError("allocator.expandable_segments configures the CUDA caching allocator and needs CUDA")


def set_precision(dtype: str, device: torch.device) -> tuple[Any, torch.dtype]:
    """Global matmul precision; returns the autocast context factory and the compute dtype."""
    tf32 = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    if dtype in ("bf16", "fp16"):
        amp = torch.bfloat16 if dtype == "bf16" else torch.float16
        return (lambda: torch.autocast(device.type, dtype=amp)), amp
    return contextlib.nullcontext, torch.float32


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
        self.info: dict[str, Any] = {}
        self.steps_done = 0
        self.tokens = 0
        self.first_step_s: float | None = None  # from process start when the caller knows it (memlab run), else from train()
        self.first_step_engine_s: float | None = None  # from train()
        self.val_loss: float | None = None
        self.last_loss: float | None = None
        self.skipped = 0
        self.nvml: NvmlSampler | None = None
        self.dist: distributed.DistContext | None = None  # this rank among the run's ranks (memlab.core.distributed)

    def summary(self, status: str) -> dict[str, Any]:
        e, p, info = self.experiment, self.profile, self.info
        cuda = self.device.type == "cuda"
        measured = [r for r in self.records if r.step >= e.train.measure_after] or self.records[-1:]
        step_ms = [r.step_ms for r in measured]
        tokens_per_step = info.get("tokens_per_step", 0)
        tps = tokens_per_step / (statistics.median(step_ms) / 1000.0) if step_ms and step_ms[0] > 0 else None

        def peak(phase: str) -> int | None:
            vals = [r.peak[phase] for r in measured if r.peak[phase] is not None]
            return max(vals) if vals else None

        phase_peaks = [peak(ph) for ph in ("fwd", "bwd", "opt")]
        known = [v for v in phase_peaks if v is not None]
        reserved = [r.peak_reserved for r in measured if r.peak_reserved is not None]
        stats = torch.cuda.memory_stats(self.device) if cuda else {}
        fpt = info.get("flops_per_token")
        compile_s = None
        if p.compile.enabled and self.first_step_engine_s is not None and step_ms:
            # the first step's time beyond a normal step, setup (data, model) excluded: what compiling cost
            compile_s = max(0.0, self.first_step_engine_s - info.get("setup_s", 0.0) - statistics.median(step_ms) / 1000.0)
        return {
            "run_id": info.get("run_id"),
            "profile": p.name,
            "experiment": e.name,
            "experiment_id": e.fingerprint(),
            "status": status,
            "device": self.device.type,
            "gpu_name": info.get("gpu_name"),
            "n_gpus": info.get("world_size", 1) if cuda else 0,
            "params": info.get("params"),
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
            "steps": self.steps_done,
            "tokens": self.tokens,
            "peak_alloc_fwd_bytes": phase_peaks[0],
            "peak_alloc_bwd_bytes": phase_peaks[1],
            "peak_alloc_opt_bytes": phase_peaks[2],
            "peak_alloc_bytes": max(known) if known else None,
            "peak_reserved_bytes": max(reserved) if reserved else None,
            "peak_nvml_bytes": self.nvml.peak_used_bytes if self.nvml and self.nvml.available else None,
            "peak_host_rss_bytes": host_peak_rss_bytes(),
            "alloc_retries": stats.get("num_alloc_retries") if cuda else None,
            "ooms": stats.get("num_ooms") if cuda else None,
            "estimate_peak_bytes": info.get("estimate_peak_bytes"),
            "max_batch": info.get("max_batch"),
            "step_ms_median": _median(step_ms),
            "step_ms_p90": _p90(step_ms),
            "fwd_ms_median": _median([r.fwd_ms for r in measured if r.fwd_ms is not None]),
            "bwd_ms_median": _median([r.bwd_ms for r in measured if r.bwd_ms is not None]),
            "opt_ms_median": _median([r.opt_ms for r in measured if r.opt_ms is not None]),
            "tokens_per_s": tps,
            "flops_per_token": fpt,
            "mfu": mfu(tps, fpt, info.get("gpu_name"), p.precision.dtype, info.get("world_size", 1)) if cuda and fpt else None,
            "time_to_first_step_s": self.first_step_s,
            "compile_s": compile_s,
            "total_s": time.perf_counter() - self.t0,
            "final_loss": self.last_loss,
            "val_loss": self.val_loss,
            "val_ppl": math.exp(self.val_loss) if self.val_loss is not None and self.val_loss < 700 else None,
            "skipped_steps": self.skipped if p.precision.dtype == "fp16" else None,
            "torch_version": torch.__version__,
            "started_at": self.started_at,
        }


def train(
    experiment: Experiment,
    profile: Profile,
    sink: Sink,
    *,
    device: torch.device | str = "cpu",
    run_id: str | None = None,
    meters: bool = True,
    extra_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train `profile` on `experiment`, emitting events to `sink`; returns the summary (its "status" says how it ended)."""
    device = torch.device(device)
    run = _Run(experiment, profile, device)
    run.info.update(run_id=run_id, **(extra_info or {}))
    try:
        _train(run, sink, meters)
    except torch.OutOfMemoryError as e:
        _fail(run, sink, "oom", f"CUDA out of memory in {run.info.get('phase', 'setup')}: {str(e).splitlines()[0]}")
    except Diverged as e:
        _fail(run, sink, "nan", str(e))
    except (KeyboardInterrupt, Interrupted):
        _fail(run, sink, "interrupted", f"interrupted at step {run.steps_done}")
    except MemlabError:
        raise  # bad input found while building: the caller reports it as a one-line error
    except Exception as e:  # noqa: BLE001 (any other failure still leaves a readable run)
        if _is_oom(e):
            _fail(run, sink, "oom", f"out of memory in {run.info.get('phase', 'setup')}: {str(e).splitlines()[0]}")
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


def _train(run: _Run, sink: Sink, meters: bool) -> None:
    e, p, device = run.experiment, run.profile, run.device
    validate_pair(e, p)
    check_device_support(p, device)
    run.dist = dctx = distributed.setup(p, device)  # rank, world size; a one-process group for ddp/fsdp alone
    run.device = device = dctx.device
    dctx.check(e, p)  # e.g. the global batch must divide by ranks x accumulation.steps
    run.info.update(world_size=dctx.world_size, rank=dctx.rank)
    torch.manual_seed(e.train.seed)
    autocast, amp_dtype = set_precision(p.precision.dtype, device)

    run.info["phase"] = "data"
    tokens = data_mod.load_tokens(e.data)
    k = p.accumulation.steps
    micro = e.train.batch_size // (k * dctx.world_size)  # per rank: train.batch_size is the global batch
    run.info.update(micro_batch=micro, tokens_per_step=e.train.batch_size * e.model.seq_len)
    per_epoch = data_mod.steps_per_epoch(len(tokens.train), e.train.batch_size, e.model.seq_len)
    total_steps = e.train.steps or max(1, math.ceil(e.train.epochs * per_epoch))

    run.info["phase"] = "model"
    cfg = GPTConfig(
        n_layer=e.model.n_layer,
        n_head=e.model.n_head,
        d_model=e.model.d_model,
        d_ff=e.model.d_ff or 4 * e.model.d_model,
        vocab_size=padded_vocab(tokens.vocab_size, e.model.vocab_size),
        seq_len=e.model.seq_len,
        dropout=e.model.dropout,
    )
    kernel = build_attention(p.attention, device, amp_dtype)
    model = GPT(cfg, kernel).to(device)
    model.loss_chunk_size = p.loss.chunk_size if p.loss.chunked else 0
    n_params = model.num_params()
    flops_token = flops_per_token(n_params - model.wpe.weight.numel(), cfg.n_layer, cfg.d_model, cfg.seq_len, p.attention.window)
    train_model, applied = apply_techniques(model, p, dctx)
    optimizer = build_optimizer(model, p.optimizer, e.train, device)  # after wrapping: FSDP2 swaps in sharded parameters
    scaler = dctx.grad_scaler(device) if p.precision.dtype == "fp16" else None  # FSDP: ShardedGradScaler
    env = environment(device)
    run.info.update(
        kernel=kernel,
        params=n_params,
        flops_per_token=flops_token,
        gpu_name=env["gpu_name"] if device.type == "cuda" else None,
        optimizer=p.optimizer.name + (":fused" if p.optimizer.fused else "") + (":offload" if p.optimizer.offload else ""),
        **applied,
    )
    run.info.setdefault("estimate_peak_bytes", peak_for_run(e, p, vocab_size=cfg.vocab_size, micro_batch=micro, device=device.type, world_size=run.info.get("world_size", 1)))
    if device.type == "cuda" and meters:
        run.nvml = NvmlSampler(nvml_index(device), on_sample=lambda s: sink.emit(make_event("gpu_sample", **s))).start()

    sink.emit(
        make_event(
            "started",
            run_id=run.info.get("run_id"),
            run_dir=run.info.get("run_dir"),
            started_at=run.started_at,
            device=device.type,
            profile=to_dict(p),
            experiment=to_dict(e),
            experiment_id=e.fingerprint(),
            changes=describe_changes(p),
            environment=env,
            params=n_params,
            vocab_size=cfg.vocab_size,
            total_steps=total_steps,
            micro_batch=micro,
            grad_accum=k,
            world_size=dctx.world_size,  # ranks (processes, GPUs on CUDA); micro_batch is per rank
            distributed=run.info.get("distributed", "none"),
            tokens_per_step=run.info["tokens_per_step"],
            data={"source": tokens.source, "tokenizer": tokens.tokenizer, "train_tokens": int(len(tokens.train)), "val_tokens": int(len(tokens.val)), "cache_hit": tokens.cache_hit},
            attention_kernel=kernel.name,
            nvml=run.nvml.available if run.nvml else False,
        )
    )

    batches = data_mod.batch_iterator(
        tokens.train,
        batch_size=e.train.batch_size,
        micro_batches=k,
        seq_len=e.model.seq_len,
        seed=e.train.seed,
        steps=total_steps,
        rank=dctx.rank,  # each rank takes a disjoint slice of the same global batch
        world_size=dctx.world_size,
        pin_memory=p.loader.pin_memory,
        workers=p.loader.workers,
    )
    val = data_mod.val_batches(tokens.val, micro_batch=micro, seq_len=e.model.seq_len)
    meter = PhaseMeter(device, enabled=meters)
    # Activation offload: tensors saved for backward go to pinned host memory and come back when needed.
    offload = (lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)) if p.checkpointing.offload else contextlib.nullcontext
    bad_in_a_row = 0
    train_model.train()
    setup_s = time.perf_counter() - run.t0
    run.info["setup_s"] = setup_s

    def publish(rec: StepRecord) -> None:
        nonlocal bad_in_a_row
        loss = dctx.read_loss(rec.loss)  # the mean over ranks; raises StopRequested on every rank alike
        grad_norm = rec.grad_norm.item() if isinstance(rec.grad_norm, torch.Tensor) else rec.grad_norm
        finite = loss is not None and math.isfinite(loss)
        if not finite:
            bad_in_a_row += 1
            if scaler is None or bad_in_a_row >= FP16_NAN_PATIENCE:
                raise Diverged(f"loss is {loss} at step {rec.step}" + (f" ({bad_in_a_row} steps in a row)" if scaler else ""))
        else:
            bad_in_a_row = 0
            run.last_loss = loss
        run.records.append(rec)
        sink.emit(
            make_event(
                "step",
                step=rec.step,
                total_steps=total_steps,
                loss=loss,
                lr=rec_lr[rec.step],
                grad_norm=grad_norm,
                step_ms=rec.step_ms,
                fwd_ms=rec.fwd_ms,
                bwd_ms=rec.bwd_ms,
                opt_ms=rec.opt_ms,
                tokens=run.info["tokens_per_step"],
                tokens_per_s=run.info["tokens_per_step"] / (rec.step_ms / 1000.0) if rec.step_ms > 0 else None,
                peak_alloc_fwd_bytes=rec.peak["fwd"],
                peak_alloc_bwd_bytes=rec.peak["bwd"],
                peak_alloc_opt_bytes=rec.peak["opt"],
                peak_reserved_bytes=rec.peak_reserved,
                host_rss_bytes=host_rss_bytes(),
                measured=rec.step >= e.train.measure_after,
            )
        )

    rec_lr: dict[int, float] = {}
    for step, micro_batches in enumerate(batches):
        lr = lr_at(step, e.train, total_steps)
        rec_lr[step] = lr
        set_lr(optimizer, lr)
        meter.start_step(step)
        loss_sum = None
        for i, (x, y) in enumerate(micro_batches):
            dctx.set_grad_sync(train_model, i == k - 1)  # DDP: all-reduce in the last micro-batch's backward only
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            run.info["phase"] = "forward"
            meter.begin("fwd")
            with autocast(), offload():
                loss = train_model(x, y) / k
            meter.end("fwd")
            run.info["phase"] = "backward"
            meter.begin("bwd")
            (scaler.scale(loss) if scaler else loss).backward()
            meter.end("bwd")
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        run.info["phase"] = "optimizer"
        meter.begin("opt")
        grad_norm = None
        if scaler:
            scaler.unscale_(optimizer)
        if e.train.clip:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), e.train.clip)
        if scaler:
            scale_before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            if scaler.get_scale() < scale_before:
                run.skipped += 1
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.end("opt")
        loss_sum = dctx.reduce_loss(loss_sum)  # all-reduced on the device, read one step late (no host sync)
        done = meter.finish_step(loss_sum, grad_norm)
        run.steps_done = step + 1
        run.tokens += run.info["tokens_per_step"]
        if step == 0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            run.first_step_engine_s = time.perf_counter() - run.t0
            start = run.info.get("process_start")
            run.first_step_s = time.time() - start if start else run.first_step_engine_s
        if done is not None:
            publish(done)
        if e.train.eval_every and (step + 1) % e.train.eval_every == 0 and step + 1 < total_steps:
            last = meter.flush()
            if last is not None:
                publish(last)
            run.info["phase"] = "eval"
            run.val_loss = evaluate(train_model, val, autocast, device)
            sink.emit(make_event("eval", step=step + 1, val_loss=run.val_loss, val_ppl=math.exp(min(run.val_loss, 700))))
    last = meter.flush()
    if last is not None:
        publish(last)
    run.info["phase"] = "eval"
    run.val_loss = evaluate(train_model, val, autocast, device)
    sink.emit(make_event("eval", step=run.steps_done, val_loss=run.val_loss, val_ppl=math.exp(min(run.val_loss, 700))))
    summary, ranks = _final_summary(run, "finished")  # distributed: gathered on rank 0, one row per rank
    run.info["summary"] = summary
    sink.emit(make_event("finished", summary=summary, **ranks))
