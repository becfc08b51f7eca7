"""The allocator's reserved peak of a training step, and the largest micro-batch whose reserved peak fits a budget.

The analytic estimate (memlab.core.estimate) predicts the *allocated* peak; the batch that fits is bounded by the
caching allocator's *reserved* peak (find-batch counts a probe that needed allocator retries as not fitting), and
on a logits-heavy shape the two differ by 45 % or more: the logits and their gradients come and go in blocks of
different sizes that the cache cannot reuse for each other. Here the engine's own step runs on fake tensors (as
memlab.core.memsnapshot.fake_estimate), every storage's allocation and free is recorded in order, and the sequence
is replayed through memlab.core.allocsim, a model of the CUDA caching allocator.

Where fake tensors cannot run a profile on this machine (CUDA-only optimizers, offload to the host, float8), or
cannot run it as on CUDA (torch.compile fuses the loss: a different pattern), the analytic peak is scaled by
FALLBACK_RESERVED_RATIO instead, and the result says so.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

from memlab.core import allocsim
from memlab.core.config import Experiment, Profile
from memlab.core.errors import MemlabError

STEPS = 3  # find-batch's probes run three steps (memlab.core.study.maxbatch.PROBE_STEPS): the cache's history counts

# When the step cannot be replayed: reserved / allocated at the peak, the largest seen on the H100 in a probe that
# fitted without retries (bench/results/estimate-h100, gpt2s, find_batch_*: act_offload at 112, 1.334; 58 probes).
FALLBACK_RESERVED_RATIO = 1.34


@dataclass
class Reserved:
    """Simulated peaks of one step at `micro_batch` (bytes), or the analytic fallback (`simulated` False)."""

    micro_batch: int
    allocated: int
    reserved: int
    simulated: bool
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.reserved / self.allocated if self.allocated else 1.0


def record_events(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int, steps: int = STEPS) -> tuple[list[tuple[str, Any, int]], list[str]]:
    """The storages' allocations and frees, in order, of building the step and running `steps` steps on fake
    tensors; and the notes on what had to be measured differently. MemlabError where fake tensors cannot run it."""
    import torch

    from memlab.core.memsnapshot import _fake_runnable
    from memlab.core.techniques import check_plan, check_techniques

    check_plan(experiment, profile)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    notes: list[str] = []
    p = _fake_runnable(experiment, profile, device, notes)
    check_techniques(experiment, p, device)
    try:
        return _run_recorded(experiment, p, device, vocab_size, micro_batch, steps), notes
    except MemlabError:
        raise
    except Exception as e:  # noqa: BLE001 (an op without a fake implementation)
        raise MemlabError(f"fake tensors could not run this profile ({e.__class__.__name__})") from None


def _recorder() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Recorder(TorchDispatchMode):
        """Each op's new output storages as allocations; a storage's finalizer as its free. Answers `.item()`
        (no value on a fake tensor; any number does for memory)."""

        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[str, Any, int]] = []
            self._live: dict[int, int] = {}
            self._n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                return 1.0 if args[0].dtype.is_floating_point else 1
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._note(t.untyped_storage())
            return out

        def _note(self, st: Any) -> None:
            cdata = st._cdata
            if cdata in self._live or st.nbytes() == 0:
                return  # a view of a storage already counted
            self._n += 1
            self._live[cdata] = self._n
            self.events.append(("alloc", self._n, int(st.nbytes())))
            weakref.finalize(st, self._freed, cdata, self._n)

        def _freed(self, cdata: int, key: int) -> None:
            if self._live.get(cdata) == key:
                del self._live[cdata]
            self.events.append(("free", key, 0))

    return Recorder()


@contextlib.contextmanager
def _cuda_like_sdpa(device: Any) -> Iterator[None]:
    """On the CPU, SDPA with dropout falls back to the math path and keeps B x H x T x T matrices that CUDA's fused
    kernels never make: run the memory-efficient kernel's fake implementation instead (output and log-sum-exp,
    the same tensors CUDA keeps), so that the recorded pattern is CUDA's."""
    import torch
    import torch.nn.functional as F

    if device.type == "cuda":
        yield
        return
    real = F.scaled_dot_product_attention

    def efficient(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        if kw or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, True, dropout_p, is_causal)[0]

    F.scaled_dot_product_attention = efficient
    with _cuda_like_foreach():
        try:
            yield
        finally:
            F.scaled_dot_product_attention = real


@contextlib.contextmanager
def _cuda_like_foreach() -> Iterator[None]:
    """torch.optim and clip_grad_norm_ use the foreach kernels on CUDA (temporaries the size of whole parameter
    lists) and a per-tensor loop for fake or CPU tensors: let them take the CUDA path."""
    import torch.optim.optimizer as opt
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _foreach_utils as fu

    real_devices = opt._get_foreach_kernels_supported_devices
    opt._get_foreach_kernels_supported_devices = lambda: [*real_devices(), "cpu"]
    fu._foreach_supported_types.append(FakeTensor)  # the one list both modules read
    try:
        yield
    finally:
        fu._foreach_supported_types.remove(FakeTensor)
        opt._get_foreach_kernels_supported_devices = real_devices


def _run_recorded(experiment: Experiment, p: Profile, device: Any, vocab_size: int, b: int, steps: int) -> list[tuple[str, Any, int]]:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memlab.core.step import build_step

    T, k = experiment.model.seq_len, p.accumulation.steps
    rec = _recorder()

    def batch() -> list:
        return [(torch.randint(0, vocab_size, (b, T), device=device), torch.randint(0, vocab_size, (b, T), device=device)) for _ in range(k)]

    with FakeTensorMode(), rec, _cuda_like_sdpa(device):
        step = build_step(experiment, p, device, vocab_size, on_device=True)
        step.scaler = None  # fake tensors: GradScaler's inf check reads a value that does not exist
        for _ in range(steps):
            step.run(batch())
        events = list(rec.events)
    return events


# ---------------------------------------------------------------------------------------------- prediction


def simulate(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int) -> Reserved:
    """The reserved peak at `micro_batch`: the analytic allocated peak (memlab.core.estimate, accurate on the H100)
    times the replayed step's reserved / allocated; the analytic peak times FALLBACK_RESERVED_RATIO where fake
    tensors cannot run the step as CUDA does."""
    from memlab.core.estimate import estimate

    analytic = estimate(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch).total_bytes
    why = _no_replay(profile)
    if why is None:
        try:
            events, notes = record_events(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch)
        except MemlabError as e:
            why = str(e)
    if why is not None:
        note = f"reserved: the allocated peak x {FALLBACK_RESERVED_RATIO} (not replayed: {why})"
        return Reserved(micro_batch, analytic, int(analytic * FALLBACK_RESERVED_RATIO), False, [note])
    sim = allocsim.replay(events, expandable=profile.allocator.expandable_segments)
    ratio = sim.peak_reserved / max(1, sim.peak_allocated)
    note = f"reserved: the allocated peak x {ratio:.3f}, the replayed step's reserved / allocated (memlab.core.allocsim)"
    return Reserved(micro_batch, analytic, int(analytic * ratio), True, [*notes, note])


def _no_replay(profile: Profile) -> str | None:
    if profile.compile.enabled:
        return "torch.compile fuses the step: fake tensors run it uncompiled, another allocation pattern"
    return None


def predict_max_batch(experiment: Experiment, profile: Profile, *, vocab_size: int, budget: int, limit: int = 1 << 20) -> tuple[int, Reserved | None]:
    """The largest micro-batch whose predicted reserved peak fits `budget` bytes (0 if not even 1 fits), and the
    simulation it rests on. The replay runs at two batches only (seconds each): at the analytic guess, then at the
    answer; the larger of the two ratios holds."""
    from memlab.core.estimate import estimate

    def alloc(b: int) -> int:
        return estimate(experiment, profile, vocab_size=vocab_size, micro_batch=b).total_bytes

    guess = _largest(lambda b: alloc(b) <= budget, limit)
    if guess == 0:
        return 0, None
    first = simulate(experiment, profile, vocab_size=vocab_size, micro_batch=guess)
    b = _largest(lambda b: alloc(b) * first.ratio <= budget, limit)
    if b == 0 or not first.simulated:
        return b, first
    second = simulate(experiment, profile, vocab_size=vocab_size, micro_batch=b)
    worst = max(first, second, key=lambda r: r.ratio)
    return _largest(lambda b: alloc(b) * worst.ratio <= budget, limit), worst


def _largest(fits: Any, limit: int) -> int:
    """The largest b in 1..limit with fits(b) (monotone), 0 if none: grow, then bisect."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def budget_bytes(memory_bytes: int, *, capped: bool) -> int:
    """What the allocator may reserve: a capped process's limit, or a whole card less the CUDA context."""
    from memlab.core.estimate import CUDA_CONTEXT_BYTES

    return memory_bytes if capped else memory_bytes - CUDA_CONTEXT_BYTES
