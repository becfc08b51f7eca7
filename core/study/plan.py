"""A study's plan: the options checked and resolved (experiment, profiles, device, memory cap), before any work.

Every bad input is a one-line MemlabError raised here, before the study folder is written: an unknown recipe or
profile, an --out that is a file or cannot be written, --gpu-memory above the card, --batch not understood.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

from memlab.core.config import Experiment, Profile, apply_overrides, load_experiment, load_profile
from memlab.core.errors import ConfigError, DeviceError, MemlabError
from memlab.core.study.state import Options
from memlab.core.units import gib, parse_size

BATCH_MODES = ("experiment", "baseline-max")
CPU_MEMORY = "80GiB"  # what the CPU's predicted max batch assumes without --gpu-memory: an 80 GB H100


@dataclass
class Plan:
    options: Options
    experiment: Experiment  # with the overrides, at the experiment's own batch
    profiles: dict[str, Profile]
    baseline: str  # `baseline` when studied, else the first profile
    cap_bytes: int | None  # --gpu-memory
    gpu_name: str | None

    @property
    def on_cuda(self) -> bool:
        return self.options.device == "cuda"

    def run_overrides(self) -> list[str]:
        return run_items(self.options)


def check_out(out: Path) -> None:
    """--out must be a folder this process can write (it is created when missing)."""
    if out.exists() and not out.is_dir():
        raise MemlabError(f"--out {out} is a file; give a folder for the study")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not probe.is_dir():
        raise MemlabError(f"--out {out}: {probe} is a file, so the folder cannot be made; give another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise MemlabError(f"--out {out}: {probe} is not writable; give a folder you can write")


def check_batch(batch: str) -> str:
    if batch in BATCH_MODES or (batch.isdigit() and int(batch) > 0):
        return batch
    raise ConfigError(f"--batch {batch!r}: expected experiment, baseline-max or a positive number")


def single_gpu_profiles() -> list[str]:
    """`--profiles all`: every built-in profile that trains on one GPU (distributed.mode = none)."""
    from memlab.core.config import builtin_names

    return [n for n in builtin_names("profile") if load_profile(n).distributed.mode == "none"]


def make_plan(options: Options) -> Plan:
    if not options.profiles:
        raise ConfigError("--profiles is empty; give a comma-separated list, e.g. baseline,bf16,gradcp_bf16 (or all)")
    check_batch(options.batch)
    exp = load_experiment(options.experiment)
    profiles = {}
    for name in options.profiles:
        prof = load_profile(name)
        # the same items every child gets (validated once, here); on a copy: a profile's [overrides] are its own
        apply_overrides(copy.deepcopy(exp), prof, run_items(options))
        profiles[name] = prof
    apply_overrides(exp, load_profile("baseline"), run_items(options))
    baseline = "baseline" if "baseline" in profiles else options.profiles[0]
    if options.batch == "baseline-max" and "baseline" not in profiles:
        raise ConfigError("--batch baseline-max trains at the largest batch the baseline fits: add baseline to --profiles")
    cap = parse_size(options.gpu_memory) if options.gpu_memory else None
    gpu_name = _check_card(cap, options.gpu_memory) if options.device == "cuda" else None
    return Plan(options, exp, profiles, baseline, cap, gpu_name)


def run_items(options: Options) -> list[str]:
    return list(options.overrides) + ([f"train.steps={options.steps}"] if options.steps is not None else [])


def _check_card(cap: int | None, text: str | None) -> str | None:
    from memlab.core.batchfind import gpu_info

    gpu = gpu_info()
    if gpu is None:
        return None
    if cap is not None and cap > gpu.total_bytes:
        raise DeviceError(f"--gpu-memory {text} ({gib(cap)}) is more than this GPU has ({gpu.name}: {gib(gpu.total_bytes)})")
    return gpu.name
