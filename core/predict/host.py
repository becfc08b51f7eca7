"""The CPU backend's own refusal: a step whose predicted host peak is more than this machine can give is refused
before anything allocates (a 200-billion-parameter GPT on a 24 GiB host otherwise allocates until the kernel's OOM
killer or the address-space limit ends it with torch's raw allocator message)."""

from __future__ import annotations

import resource

import psutil

from memlab.core.config import Experiment, Profile
from memlab.core.errors import ConfigError, MemlabError
from memlab.core.predict import analytic
from memlab.core.predict.fake import fake_estimate
from memlab.core.predict.prediction import ANALYTIC_FAMILIES, family_of
from memlab.core.units import gib


def host_peak_bytes(experiment: Experiment, profile: Profile) -> int | None:
    """The step's tensors on the CPU backend (None: the vocabulary is not known yet, so no figure): the gpt family's
    from its formula (instant, an upper bound); another family's from one step of its TrainStep on fake tensors."""
    try:
        vocab, _ = analytic.vocab_for(experiment)
    except MemlabError:
        return None
    if family_of(experiment) in ANALYTIC_FAMILIES:
        return analytic.estimate(experiment, profile, vocab_size=vocab, device="cpu").total_bytes
    return fake_estimate(experiment, profile, vocab_size=vocab, gpu_kernels=False).total_bytes


def host_available_bytes() -> int:
    """What this process can still allocate: the memory the system has available, and no more than what is left
    under an address-space limit (ulimit -v) if one is set."""
    available = psutil.virtual_memory().available
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        available = min(available, max(0, soft - psutil.Process().memory_info().vms))
    return available


def refuse_over_host(experiment: Experiment, profile: Profile) -> None:
    """A ConfigError (one line, both figures, and --force) when the predicted host peak is over what is available."""
    need = host_peak_bytes(experiment, profile)
    have = host_available_bytes()
    if need is not None and need > have:
        raise ConfigError(f"the step needs about {gib(need)} of host memory (predicted at seq_len {experiment.model.seq_len}); "
                          f"this machine has {gib(have)} available: choose a smaller model, sequence or batch, or pass --force to try anyway")
