"""Every comparison metric, declared once: its name, type, unit, how ranks reduce it, and how views show it.

The summary schema (schema.SUMMARY_SCHEMA), the per-rank rows (schema.RANK_SCHEMA) and their reduction over ranks
(memlab.core.distributed), the table's columns (memlab.core.compare, `memlab table`) and the TUI's results view all
read `METRICS`; a new figure is one line here plus the code that measures it.

Units are in the names too (STYLE.md 6): `_bytes` is bytes, `_ms…` milliseconds, `_s` seconds, `_pct` percent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import polars as pl

Unit = Literal[
    "text", "id", "version", "timestamp", "count", "tokens", "bytes", "ms", "s", "tokens/s", "flops", "fraction",
    "nats", "perplexity", "pct", "x",
]
# How one run's figure is made from its ranks' own (memlab.core.distributed.aggregate):
#   same  - identical on every rank (identity, configuration); rank 0's is kept
#   rank0 - rank 0's own (the loss is already the mean over ranks; the clock of the run)
#   max   - the largest rank's (memory; time: the slowest rank sets the pace of a synchronous step)
#   sum   - added up over ranks (event counts)
#   pace  - rank 0's figure at the slowest rank's pace (tokens/s, MFU)
#   worst - the first rank's failure, else rank 0's (status)
Reduce = Literal["same", "rank0", "max", "sum", "pace", "worst"]
# How a cell is written (memlab.core.compare.format_value); each unit has one.
Kind = Literal["text", "int", "gib", "ms", "rate", "fraction_pct", "seconds", "ppl", "loss", "signed_pct", "times"]

KIND_OF_UNIT: dict[str, Kind] = {
    "text": "text", "id": "text", "version": "text", "timestamp": "text", "count": "int", "tokens": "int",
    "bytes": "gib", "ms": "ms", "s": "seconds", "tokens/s": "rate", "flops": "rate", "fraction": "fraction_pct",
    "nats": "loss", "perplexity": "ppl", "pct": "signed_pct", "x": "times",
}


@dataclass(frozen=True)
class Metric:
    """One figure. `table` is its column's place in the default table (None: not shown by default)."""

    name: str
    dtype: pl.DataType
    unit: Unit
    reduce: Reduce | None  # None: not in the summary (a relative column, computed by compare)
    help: str = ""
    header: str = ""  # on screen; the name when blank
    table: int | None = None
    figure: bool = False  # a measured figure: blank for runs that did not finish, column hidden when all blank
    per_rank: bool = False  # kept in each rank's row of ranks.parquet
    relative: bool = False  # against the group's baseline (memlab.core.compare), not in summary.parquet
    twin: str = ""  # a column shown only where it differs from this one by more than TWIN_TOLERANCE on some row

    def __post_init__(self) -> None:
        if not self.header:
            object.__setattr__(self, "header", self.name)

    @property
    def kind(self) -> Kind:
        return KIND_OF_UNIT[self.unit]


INT, FLOAT, STR = pl.Int64, pl.Float64, pl.String
TWIN_TOLERANCE = 0.03  # a twin column within 3 % of its sibling on every row says nothing new
_MEASURED = dict(figure=True, per_rank=True)


def _peak(name: str, header: str, table: int, help: str) -> Metric:
    return Metric(name, INT, "bytes", "max", help, header, table, **_MEASURED)


METRICS: tuple[Metric, ...] = (
    # who and what: the same on every rank
    Metric("schema_version", INT, "version", "same"),
    Metric("run_id", STR, "id", "same"),
    Metric("profile", STR, "text", "same", "technique profile", table=1),
    Metric("experiment", STR, "text", "same"),
    Metric("experiment_id", STR, "id", "same", "fingerprint of the resolved experiment: only equal ids are compared"),
    Metric("status", STR, "text", "worst", "finished, or why not: oom, nan, interrupted, crashed, error; running, incomplete (no summary)", table=2, per_rank=True),
    Metric("device", STR, "text", "same", "cuda | cpu"),
    Metric("gpu_name", STR, "text", "same"),
    Metric("gpu_index", STR, "text", "same", "the physical GPU(s) the run trained on, as NVML numbers them (lanes pin each run with CUDA_VISIBLE_DEVICES), e.g. 2 or 2,3"),
    Metric("gpu_serial", STR, "text", "same", "their serial numbers (NVML); blank where the card has none"),
    Metric("n_gpus", INT, "count", "same", "GPUs the run trained on: its world size (ranks) on CUDA, 0 on CPU; memory figures are per GPU", "GPUs", 4, figure=True),
    Metric("params", INT, "count", "same"),
    Metric("trainable_params", INT, "count", "same", "parameters the optimizer updates (all of them but under LoRA, QLoRA, DoRA or freeze); shown where some run trains fewer than it has", "trainable", 5, twin="params"),
    Metric("frozen_params", INT, "count", "same", "parameters that get no gradient and no optimizer state (a fine-tuning base)"),
    Metric("model_family", STR, "text", "same", "gpt (memlab's own) or hf (a transformers architecture)"),
    Metric("architecture", STR, "text", "same", "the model's class, e.g. LlamaForCausalLM; gpt for memlab's own"),
    Metric("finetune", STR, "text", "same", 'what trained: "full", "lora r16 alpha 32 on 112 layers (peft 0.21.2)", "qlora nf4 ... (bitsandbytes 0.48)", "freeze: last 2 of 16 blocks"'),
    Metric("adapter_bytes", INT, "bytes", "same", "the trained adapters' size on disk (safetensors): what a LoRA / DoRA run saves"),
    Metric("batch_size", INT, "count", "same", "effective batch (sequences per optimizer step)", "batch", 3),
    Metric("micro_batch", INT, "count", "same"),
    Metric("grad_accum", INT, "count", "same"),
    Metric("seq_len", INT, "tokens", "same"),
    Metric("precision", STR, "text", "same"),
    Metric("attention_kernel", STR, "text", "same", "the kernel that actually ran, e.g. sdpa:cudnn"),
    Metric("window", INT, "tokens", "same"),
    Metric("checkpointing", STR, "text", "same"),
    Metric("optimizer", STR, "text", "same"),
    Metric("compile", STR, "text", "same"),
    Metric("kernels", STR, "text", "same", 'kernels.fused / float8: "off", "fused (triton <version>)", "fused (CPU reference)", "float8 (torchao <version>, ...)"'),
    Metric("cuda_graph", STR, "text", "same", 'cuda_graph.enabled: "off", or the step captured whole (its phases then have peaks from the capture and no times)'),
    Metric("overrides", STR, "text", "same", "experiment keys the profile set for itself (its [overrides]), e.g. train.clip=0.0; part of experiment_id too"),
    Metric("loss_kernel", STR, "text", "same", 'how the loss ran: "full logits", "chunked (<rows> rows)", or a library and its version, e.g. "liger 0.8.5 fused linear CE"'),
    # how far it got
    Metric("steps", INT, "count", "rank0", "optimizer steps completed", per_rank=True),
    Metric("tokens", INT, "tokens", "rank0", "training tokens processed", per_rank=True),
    # memory
    _peak("peak_alloc_fwd_bytes", "fwd GiB", 6, "peak allocated during forward"),
    _peak("peak_alloc_bwd_bytes", "bwd GiB", 7, "peak allocated during backward"),
    _peak("peak_alloc_opt_bytes", "opt GiB", 8, "peak allocated during the optimizer step"),
    _peak("peak_alloc_bytes", "peak GiB", 9, "peak allocated over a step (max of the phases)"),
    _peak("peak_reserved_bytes", "reserved GiB", 10, "peak reserved by the caching allocator"),
    _peak("peak_nvml_bytes", "NVML GiB", 11, "device-wide peak from NVML (includes the CUDA context)"),
    Metric("peak_nvml_process_bytes", INT, "bytes", "max", "this process's peak by NVML's per-process figure (its CUDA "
           "context, allocator and workspaces, not the driver's own reserve nor other processes); blank where NVML "
           "does not list the process", "NVML process GiB", 12, twin="peak_nvml_bytes", **_MEASURED),
    _peak("peak_host_rss_bytes", "host GiB", 13, "peak resident memory of the host process"),
    Metric("alloc_retries", INT, "count", "sum", "allocator retries (cudaMalloc failed, cache flushed)", per_rank=True),
    Metric("ooms", INT, "count", "sum", "out-of-memory errors the allocator counted", per_rank=True),
    Metric("estimate_peak_bytes", INT, "bytes", "rank0", "the analytic estimate of peak allocated (memlab estimate)"),
    Metric("max_batch", INT, "count", "rank0", "largest micro-batch that completes full steps", "max batch", 14, figure=True),
    Metric("gpu_memory_cap_bytes", INT, "bytes", "same", "the emulated card's total memory (--gpu-memory); null: the whole card"),
    Metric("allocator_budget_bytes", INT, "bytes", "same", "the allocator's cap under --gpu-memory: the card's total less the driver's reserve and the CUDA context and workspaces NVML saw"),
    # speed
    Metric("step_ms_median", FLOAT, "ms", "max", "median step time over measured steps", "step ms", 15, **_MEASURED),
    Metric("step_ms_p90", FLOAT, "ms", "max", "90th percentile step time", **_MEASURED),
    Metric("fwd_ms_median", FLOAT, "ms", "max", "median forward time", **_MEASURED),
    Metric("bwd_ms_median", FLOAT, "ms", "max", "median backward time", **_MEASURED),
    Metric("opt_ms_median", FLOAT, "ms", "max", "median optimizer-step time", **_MEASURED),
    Metric("tokens_per_s", FLOAT, "tokens/s", "pace", "training throughput (step time from CUDA events: the device's)", "tokens/s", 16, **_MEASURED),
    Metric("tokens_per_s_wall", FLOAT, "tokens/s", "rank0", "training throughput by the wall clock over the measured steps (data loading, logging and everything between steps included)", "wall tokens/s", 17, twin="tokens_per_s", **_MEASURED),
    Metric("flops_per_token", FLOAT, "flops", "same"),
    Metric("mfu", FLOAT, "fraction", "pace", "model FLOPs utilisation against the GPU's dense peak for the run's compute dtype", "MFU", 18, figure=True),
    Metric("mfu_bf16_peak", FLOAT, "fraction", "pace", "model FLOPs utilisation against the GPU's bf16 dense peak, one peak for every dtype: comparable across profiles", "MFU@bf16", 19, figure=True, twin="mfu"),
    Metric("time_to_first_step_s", FLOAT, "s", "max", "from memlab's start to the first step's end (compile included)", **_MEASURED),
    Metric("compile_s", FLOAT, "s", "max", "the first step's time beyond a normal step, with torch.compile", figure=True),
    Metric("total_s", FLOAT, "s", "max", "wall time of the whole run", "total s", 20, **_MEASURED),
    # quality
    Metric("final_loss", FLOAT, "nats", "rank0", "training loss of the last step (mean over ranks)", **_MEASURED),
    Metric("val_loss", FLOAT, "nats", "rank0", "validation loss", figure=True),
    Metric("val_ppl", FLOAT, "perplexity", "rank0", "validation perplexity on the experiment's held-out tokens", "val ppl", 21, figure=True),
    Metric("skipped_steps", INT, "count", "rank0", "fp16: steps the GradScaler skipped for inf/nan gradients"),
    Metric("torch_version", STR, "version", "same"),
    Metric("memlab_version", STR, "version", "same"),
    Metric("memlab_commit", STR, "id", "same", 'the commit of memlab\'s source (a git checkout; "+dirty" when its tracked files differ): one version number spans many commits'),
    Metric("started_at", STR, "timestamp", "rank0", "UTC ISO-8601"),
    # against the baseline (memlab.core.compare)
    Metric("mem_saved_pct", FLOAT, "pct", None, "100 × (1 − peak / baseline peak)", "mem saved", 22, figure=True, relative=True),
    Metric("speedup_x", FLOAT, "x", None, "baseline step time / step time", "speed-up", 23, figure=True, relative=True),
    Metric("ppl_change_pct", FLOAT, "pct", None, "100 × (val ppl / baseline val ppl − 1)", "ppl Δ", 24, figure=True, relative=True),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
SUMMARY: tuple[Metric, ...] = tuple(m for m in METRICS if not m.relative)
RELATIVE: tuple[Metric, ...] = tuple(m for m in METRICS if m.relative)
TABLE: tuple[Metric, ...] = tuple(sorted((m for m in METRICS if m.table is not None), key=lambda m: m.table or 0))


def summary_schema() -> dict[str, pl.DataType]:
    return {m.name: m.dtype for m in SUMMARY}


def per_rank_names() -> tuple[str, ...]:
    return tuple(m.name for m in SUMMARY if m.per_rank)


def reduced_by(reduce: Reduce) -> tuple[str, ...]:
    return tuple(m.name for m in SUMMARY if m.reduce == reduce)


def figure_names() -> tuple[str, ...]:
    """Summary figures a run that did not finish leaves blank in the comparison."""
    return tuple(m.name for m in SUMMARY if m.figure)
