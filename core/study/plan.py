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
from memlab.core.predict.analytic import card_size
from memlab.core.study.state import STATE_FILE, Options
from memlab.core.units import gib

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
    gpu_total_bytes: int | None = None  # the real card's memory (NVML), for --lanes
    lanes: int = 1  # max-batch searches at once (--lanes; check_lanes)

    @property
    def on_cuda(self) -> bool:
        return self.options.device == "cuda"

    def run_overrides(self) -> list[str]:
        return run_items(self.options)


def check_out(out: Path) -> None:
    """--out must be a folder this process can write (it is created when missing), new, empty or a study's."""
    if out.exists() and not out.is_dir():
        raise MemlabError(f"--out {out} is a file; give a folder for the study")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not probe.is_dir():
        raise MemlabError(f"--out {out}: {probe} is a file, so the folder cannot be made; give another --out")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise MemlabError(f"--out {out}: {probe} is not writable; give a folder you can write")
    if out.is_dir() and not (out / STATE_FILE).exists():
        held = sorted(p.name for p in out.iterdir())
        if held:  # e.g. a sweep's runs folder: a study would write its report and runs among them
            more = f" and {len(held) - 3} more" if len(held) > 3 else ""
            raise MemlabError(f"--out {out} is not empty and holds no study ({', '.join(held[:3])}{more}; no {STATE_FILE}); "
                              "give a new or empty folder, or the folder of a study to resume it")


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
    cap = card_size(options.gpu_memory) if options.gpu_memory else None
    gpu_name, gpu_total = _check_card(cap, options.gpu_memory) if options.device == "cuda" else (None, None)
    return Plan(options, exp, profiles, baseline, cap, gpu_name, gpu_total)


def check_lanes(lanes: int, plan: Plan) -> int:
    """--lanes N: N max-batch searches at once on one GPU, each capped at --gpu-memory, so N caps must fit the card
    (the training runs stay one at a time: their timings are never shared)."""
    if lanes < 1:
        raise ConfigError(f"--lanes {lanes}: give 1 or more")
    if lanes == 1:
        return lanes
    if not plan.on_cuda or plan.cap_bytes is None:
        raise ConfigError(f"--lanes {lanes} searches several profiles at once on one GPU, each under --gpu-memory: "
                          "it needs --device cuda and --gpu-memory (e.g. --gpu-memory 24GiB --lanes 3 on an 80 GB card)")
    if plan.gpu_total_bytes is not None and lanes * plan.cap_bytes > plan.gpu_total_bytes:
        most = plan.gpu_total_bytes // plan.cap_bytes
        raise ConfigError(f"--lanes {lanes} x --gpu-memory {plan.options.gpu_memory} is more than this GPU has "
                          f"({gib(plan.gpu_total_bytes)}); at most {most} lanes of {plan.options.gpu_memory} fit")
    return lanes


def run_items(options: Options) -> list[str]:
    return list(options.overrides) + ([f"train.steps={options.steps}"] if options.steps is not None else [])


def _check_card(cap: int | None, text: str | None) -> tuple[str | None, int | None]:
    from memlab.core.gpu_memory import gpu_info

    gpu = gpu_info()
    if gpu is None:
        return None, None
    if cap is not None and cap > gpu.total_bytes:
        raise DeviceError(f"--gpu-memory {text} ({gib(cap)}) is more than this GPU has ({gpu.name}: {gib(gpu.total_bytes)})")
    return gpu.name, gpu.total_bytes
