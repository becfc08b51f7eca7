"""The largest micro-batch that fits: grow (doubling) then bisect, one fresh child process per probe.

Answers to the usual complaints about batch finders:
- A probe is k (default 3) full training steps of the profile in its own process (forward, backward, clipping,
  optimizer step, so the optimizer state exists from the second step on), with a fresh CUDA context and allocator;
  a batch that passes has already run as training will, and the probe reports the allocator's retries and its
  fragmentation (1 - allocated / reserved at the peak) so a batch that fits only just is visible as such.
- No blind halving: the search grows from a start (the estimator's guess, or 1) by doubling until a probe runs out
  of memory, then bisects between the largest fit and the smallest OOM: exact to one batch unit, in O(log n) probes.
  Under --gpu-memory each fit reports its reserved peak and the allocator's budget, and the next probe goes where
  the reserved peak, affine in the batch, meets the budget: about half the probes (a safeguarded secant).
- Out of memory (torch.OutOfMemoryError, cuDNN / cuBLAS allocation failures; the engine reports them as `oom`) is
  the only result that means "does not fit". Any other failure is a ProbeError, never counted as a fit or a miss.
- `--gpu-memory` emulates a card of that total (MEMLAB_GPU_MEMORY_BYTES, read by the child before the model
  allocates): the child measures, through NVML, what it holds outside the caching allocator (the CUDA context,
  cuBLAS workspace) and caps the allocator (set_per_process_memory_fraction) at the card less that, so a batch found
  under a 24 GB cap fits a real 24 GB card.
- Answers are cached per (experiment, profile, GPU, memory cap) as known bounds, so a later search starts there.

`search_max_batch` is the pure search over an injected probe (tests drive it with a predicate); `ChildProbe` is
the real probe, through memlab.core.supervisor.run_child.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from memlab.core import supervisor
from memlab.core.config import Experiment, Profile, to_dict
from memlab.core.data import cache_root
from memlab.core.errors import ConfigError, MemlabError
from memlab.core.gpu_memory import MEMORY_ENV
from memlab.core.techniques.allocator import ENV
from memlab.core.units import gib, parse_size  # noqa: F401 (parse_size: tests reach it as batchfind.parse_size)

# ---------------------------------------------------------------------------------------------- the search


@dataclass
class ProbeResult:
    batch: int
    fits: bool
    seconds: float = 0.0
    peak_alloc_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    alloc_retries: int | None = None
    message: str = ""
    allocator_budget_bytes: int | None = None  # under --gpu-memory: the allocator's cap the child measured and set
    retried: bool = False  # it finished, but only after allocator retries: not counted as a fit (clean_fit)

    @property
    def verdict(self) -> str:
        """How a probe line names the outcome (find-batch, the study, run --batch-size max)."""
        if self.fits:
            return "fits"
        return "fits only after allocator retries: not counted (--allow-retries)" if self.retried else "out of memory"

    @property
    def fragmentation(self) -> float | None:
        """1 - allocated / reserved at the peak: the share of reserved memory not holding tensors."""
        if not self.peak_alloc_bytes or not self.peak_reserved_bytes:
            return None
        return max(0.0, 1.0 - self.peak_alloc_bytes / self.peak_reserved_bytes)


class ProbeError(MemlabError):
    """A probe failed for a reason other than running out of memory: reported, never counted as "does not fit"."""


class ProbeRejected(ProbeError):
    """The probe's child refused its input (exit 2): the profile itself is refused, whatever the batch."""


class DoesNotFitError(MemlabError):
    """Not even the smallest micro-batch fits."""


@dataclass
class SearchResult:
    max_batch: int  # the largest batch that fits (exact when `exact`)
    min_oom: int | None  # the smallest batch known not to fit (None: the limit fits)
    probes: list[ProbeResult] = field(default_factory=list)
    seconds: float = 0.0
    limit_reached: bool = False  # the largest allowed batch fits: the true maximum may be larger

    @property
    def exact(self) -> bool:
        return not self.limit_reached


Probe = Callable[[int], ProbeResult]


def clean_fit(result: ProbeResult, allow_retries: bool = False) -> ProbeResult:
    """A probe that finished only after the allocator retried (cudaMalloc failed, the cache was flushed) fits only
    just, and slowly: counted as not fitting unless `allow_retries`, and marked as such."""
    if not result.fits or not result.alloc_retries or allow_retries:
        return result
    return dataclasses.replace(result, fits=False, retried=True, message=(
        f"finished only after {result.alloc_retries} allocator retries: not counted as a fit (--allow-retries counts it)"))


@dataclass(frozen=True)
class _Ladder:
    """The batches a search may try, as indices 1..top: every integer (values None, top = the limit or unbounded)
    or the sorted candidates."""

    values: tuple[int, ...] | None
    top: int | None

    @classmethod
    def of(cls, candidates: Sequence[int] | None, limit: int | None, what: str) -> _Ladder:
        if candidates is None:
            return cls(None, limit)
        vals = tuple(sorted({int(c) for c in candidates if c >= 1}))
        if not vals:
            raise MemlabError(f"no {what} to try")
        return cls(vals, len(vals))

    def value(self, i: int) -> int:
        return self.values[i - 1] if self.values is not None else i

    def at_least(self, v: int) -> int:
        """Smallest index whose value >= v (may exceed top)."""
        if self.values is None:
            return max(1, v)
        return next((i for i, x in enumerate(self.values, 1) if x >= v), len(self.values) + 1)

    def at_most(self, v: int) -> int:
        """Largest index whose value <= v (0 when none)."""
        if self.values is None:
            return max(0, v)
        return max((i for i, x in enumerate(self.values, 1) if x <= v), default=0)

    def known_bounds(self, known_fit: int, known_oom: int | None) -> tuple[int, int | None]:
        """(index of the largest known fit or 0, index of the smallest known OOM or None), from a cache."""
        lo = self.at_most(known_fit) if known_fit else 0
        hi = self.at_least(known_oom) if known_oom else None
        if self.top is not None and hi is not None and hi > self.top:
            hi = None
        if hi is not None and hi <= lo:
            hi = None  # inconsistent bounds (a stale cache): trust the fit
        return lo, hi


def search_max_batch(
    probe: Probe,
    *,
    start: int = 1,
    limit: int | None = None,
    candidates: Sequence[int] | None = None,
    known_fit: int = 0,
    known_oom: int | None = None,
    on_probe: Callable[[ProbeResult], None] | None = None,
    what: str = "micro-batch",
) -> SearchResult:
    """Largest batch b (from `candidates`, or any integer 1..limit) with probe(b).fits, assuming fitting is
    monotone. Grows from `start` by doubling until a probe does not fit, then bisects; `known_fit` / `known_oom`
    (from a cache) narrow the search before any probe. Raises DoesNotFitError when the smallest batch does not
    fit, ProbeError (from the probe) on a failure that is not out-of-memory."""
    ladder = _Ladder.of(candidates, limit, what)
    lo, hi = ladder.known_bounds(known_fit, known_oom)
    t0 = time.monotonic()
    probes: list[ProbeResult] = []

    def fits(i: int) -> bool:
        result = probe(ladder.value(i))
        result.batch = ladder.value(i)
        probes.append(result)
        if on_probe:
            on_probe(result)
        return result.fits

    if ladder.values is None:  # any integer: the measured reserved peaks guide the next probe
        lo, hi, limit_reached = _guided(ladder.top, lo, hi, start, fits, probes)
    else:
        lo, hi, limit_reached = _grow(ladder, lo, start, fits) if hi is None else (lo, hi, False)
        while hi is not None and hi - lo > 1:  # bisect between the largest fit and the smallest miss
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if lo == 0:
        detail = f": {probes[-1].message}" if probes and probes[-1].message else ""
        raise DoesNotFitError(f"even {what} {ladder.value(1)} runs out of memory{detail}")
    return SearchResult(max_batch=ladder.value(lo), min_oom=ladder.value(hi) if hi is not None else None,
                        probes=probes, seconds=time.monotonic() - t0, limit_reached=limit_reached)


def _guided(top: int | None, lo: int, hi: int | None, start: int, fits: Callable[[int], bool],
            probes: list[ProbeResult]) -> tuple[int, int | None, bool]:
    """The search over every integer: (largest fit, smallest miss or None, whether the top was reached). Without
    measurements, doubling then bisecting; once fits carry their reserved peak and the allocator's budget, the next
    probe is where the reserved peak, affine in the batch, reaches the budget (a safeguarded secant: after a guided
    probe misses, one bisection step). A search of 8-10 probes then takes about 4."""
    unguided = False  # after a guided probe that missed, or crept one batch up: one plain step
    while hi is None or hi - lo > 1:
        if top is not None and lo == top:
            return lo, None, True
        guess = None if unguided or lo == 0 else extrapolated_max(probes)
        i = _next_probe(lo, hi, start, top, guess)
        ok = fits(i)
        unguided = guess is not None and (not ok or i == lo + 1)
        lo, hi = (i, hi) if ok else (lo, i)
    return lo, hi, False


def _next_probe(lo: int, hi: int | None, start: int, top: int | None, guess: int | None) -> int:
    if guess is not None:
        i = guess
    elif hi is None:
        i = max(1, start) if lo == 0 else 2 * lo
    else:
        i = (lo + hi) // 2
    upper = hi - 1 if hi is not None else top
    return max(lo + 1, min(i, upper) if upper is not None else i)


def extrapolated_max(probes: Sequence[ProbeResult]) -> int | None:
    """The largest batch whose reserved peak stays within the allocator's budget, extrapolated from the clean fits
    that measured both: affine through the two largest (weights and optimizer state do not grow with the batch),
    proportional through one (the safe side: it counts them as growing). None without such measurements."""
    clean = [r for r in probes if r.fits and r.peak_reserved_bytes and r.allocator_budget_bytes]
    if not clean:
        return None
    budget = min(r.allocator_budget_bytes for r in clean)
    points = sorted({r.batch: r.peak_reserved_bytes for r in clean}.items())
    b2, r2 = points[-1]
    if len(points) == 1:
        return int(b2 * budget / r2)
    b1, r1 = points[-2]
    slope = (r2 - r1) / (b2 - b1)
    return int(b2 + (budget - r2) / slope) if slope > 0 else int(b2 * budget / r2)


def _grow(ladder: _Ladder, lo: int, start: int, fits: Callable[[int], bool]) -> tuple[int, int | None, bool]:
    """Doubling from `start` (or from the largest known fit) until something does not fit, or the top fits:
    (largest fit, smallest miss or None, whether the top was reached)."""
    top = ladder.top
    while True:
        i = ladder.at_least(max(1, start)) if lo == 0 else ladder.at_least(2 * ladder.value(lo))
        if top is not None and i > top:
            if lo == top:
                return lo, None, True
            i = top
        if not fits(i):
            return lo, i, False
        lo = i
        if top is not None and lo == top:
            return lo, None, True


def search_recorded(probe: Probe, key: str, meta: dict[str, Any], *, known: tuple[int, int | None] = (0, None),
                    on_probe: Callable[[ProbeResult], None] | None = None, **search: Any) -> SearchResult:
    """search_max_batch from the cached bounds `known` (fit, OOM); what every probe showed goes to the cache under
    `key`, even when the search fails or is stopped (find-batch and the study both search this way)."""
    seen: list[ProbeResult] = []

    def noted(r: ProbeResult) -> None:
        seen.append(r)
        if on_probe:
            on_probe(r)

    try:
        return search_max_batch(probe, known_fit=known[0], known_oom=known[1], on_probe=noted, **search)
    finally:
        if seen:
            record_bounds(key, *outcome_lists(seen), meta)  # what was learned stays, even after an error


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ---------------------------------------------------------------------------------------------- the real probe


CANCEL_GRACE_S = 10.0  # a cancelled probe: SIGINT, SIGTERM after this, SIGKILL after twice this


class ChildProbe:
    """probe(b): train `steps` full steps at micro-batch b (times `accumulation` micro-batches per step) in a
    fresh `memlab run` child, capped at `cap_bytes`; a short validation slice keeps the final eval cheap.
    A child that finished only after allocator retries is not a fit unless `allow_retries` (clean_fit): every
    search (find-batch, the study, run --batch-size max) judges a probe here, and shares one cache key for it.
    Probe run folders go to a temporary folder, removed after each probe."""

    def __init__(
        self,
        profile_ref: str,
        experiment_ref: str,
        overrides: Sequence[str],
        *,
        seq_len: int,
        steps: int = 3,
        accumulation: int = 1,
        cap_bytes: int | None = None,
        device: str = "cuda",
        runs_dir: Path | None = None,
        env: dict[str, str] | None = None,
        allow_retries: bool = False,
    ):
        if steps < 1:
            raise ConfigError(f"--steps must be at least 1 (full training steps per probe), got {steps}")
        self.profile_ref, self.experiment_ref = profile_ref, experiment_ref
        self.overrides = list(overrides)
        self.seq_len, self.steps, self.accumulation = seq_len, steps, accumulation
        self.cap_bytes, self.device = cap_bytes, device
        self.env = dict(env or {})  # e.g. the allocator's settings (expandable_probe_env)
        self.allow_retries = allow_retries
        self._own_dir = runs_dir is None
        self.runs_dir = Path(runs_dir) if runs_dir is not None else Path(tempfile.mkdtemp(prefix="memlab-probes-"))
        self._child: Any = None  # the supervisor.ChildRun in flight, for cancel()
        self._cancelled = False
        self._lock = threading.Lock()

    def spec(self, b: int):
        a = self.accumulation
        items = self.overrides + [
            f"train.batch_size={b * a}",
            f"accumulation.steps={a}",
            f"train.steps={self.steps}",
            f"train.measure_after={min(1, self.steps - 1)}",  # step 0 creates the optimizer state
            "train.eval_every=0",
            f"data.val_tokens={self.seq_len + 1}",  # one window: the final eval costs one forward
        ]
        env = self.env | ({MEMORY_ENV: str(self.cap_bytes)} if self.cap_bytes else {})
        return supervisor.ChildSpec(profile=self.profile_ref, experiment=self.experiment_ref, device=self.device, runs_dir=str(self.runs_dir), overrides=items, env=env)

    def __call__(self, b: int) -> ProbeResult:
        t0 = time.monotonic()
        with self._lock:
            self._child = supervisor.ChildRun(self.spec(b))  # a module lookup: tests stand in for it
            if self._cancelled:  # a stop that came while this probe was being set up
                self._child.cancel(CANCEL_GRACE_S)
        result = self._child.wait()  # never raises: a crashed, refusing or babbling child is an outcome
        seconds = time.monotonic() - t0
        if result.run_dir:
            shutil.rmtree(result.run_dir, ignore_errors=True)
        return clean_fit(probe_result(b, result, seconds, self.profile_ref), self.allow_retries)

    def cancel(self) -> None:
        """Stop the probe in flight now (SIGINT, then insisting: supervisor.ChildRun.cancel) and any later one: a
        compiled probe takes minutes, and a stopped study must not wait for it. The probe then ends as `interrupted`,
        a ProbeError, never a fit or an out-of-memory."""
        with self._lock:
            self._cancelled = True
            if self._child is not None:
                self._child.cancel(CANCEL_GRACE_S)

    def close(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.runs_dir, ignore_errors=True)


def probe_result(b: int, result: Any, seconds: float, profile_ref: str) -> ProbeResult:
    """A child's outcome (a supervisor ChildResult) as a probe: finished fits; oom, or a SIGKILL with no outcome
    (the kernel's OOM killer, out of host memory), does not fit; a refusal is ProbeRejected; anything else ProbeError."""
    s = result.summary or {}
    figures = [_count(s.get(k)) for k in ("peak_alloc_bytes", "peak_reserved_bytes", "alloc_retries")]
    budget = _count(s.get("allocator_budget_bytes"))
    if result.status == "finished":
        return ProbeResult(b, True, seconds, *figures, allocator_budget_bytes=budget)
    if result.status == "oom" or result.killed_by_sigkill:
        return ProbeResult(b, False, seconds, *figures, result.message or "out of memory", allocator_budget_bytes=budget)
    if result.status == "rejected":
        raise ProbeRejected(f"profile {profile_ref} refused (probe at micro-batch {b}): {result.message}".rstrip(": "))
    tail = [ln for ln in result.stderr_tail.splitlines() if ln.strip()]
    detail = result.message or (tail[-1] if tail else "")
    raise ProbeError(f"probe at micro-batch {b} ended with '{result.status}', not out of memory: {detail}".rstrip(": "))


def expandable_probe_env(expandable: bool) -> dict[str, str]:
    """The child's PYTORCH_CUDA_ALLOC_CONF with expandable segments set to `expandable` (the rest of this process's
    setting kept); the profile's own allocator.expandable_segments leaves a setting already there alone."""
    kept = [item for item in os.environ.get(ENV, "").split(",") if item and not item.startswith("expandable_segments")]
    return {ENV: ",".join([*kept, f"expandable_segments:{expandable}"])}


def _count(value: Any) -> int | None:
    """A byte or retry count from a child's summary; anything else (a garbage child) is unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# ---------------------------------------------------------------------------------------------- the cache


def cache_path() -> Path:
    return cache_root() / "max_batch.json"


def _canonical_experiment(e: Experiment) -> dict:
    """What decides memory: the model and the data (the vocabulary); not the batch, steps or learning rate."""
    d = to_dict(e)
    return {"model": d["model"], "data": {k: v for k, v in d["data"].items() if k not in ("val_tokens", "max_docs", "split", "streaming")}}


def _canonical_profile(p: Profile, accumulation: int) -> dict:
    d = to_dict(p)
    d.pop("name", None)
    d.pop("description", None)
    d["accumulation"] = {"steps": accumulation}
    return d


def cache_key(experiment: Experiment, profile: Profile, gpu_name: str, cap_bytes: int | None, *, steps: int, accumulation: int = 1,
              allow_retries: bool = False) -> str:
    import torch

    blob = {
        "experiment": _canonical_experiment(experiment),
        "profile": _canonical_profile(profile, accumulation),
        "gpu": gpu_name,
        "cap_bytes": cap_bytes,
        "steps": steps,
        "torch": torch.__version__,
        # what counts as a fit: entries from before every search judged retries alike (the study and
        # run --batch-size max counted a retried probe as a fit) carry no rule and are not reused
        "fit": "with allocator retries" if allow_retries else "without allocator retries",
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:20]


def _read_cache() -> dict:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else {"entries": {}}
    except (OSError, ValueError):
        return {"entries": {}}


def start_below(predicted: int | None) -> int:
    """A power of two a little under the predicted max: the doubling then starts close to the answer."""
    start = 1
    while predicted and start * 2 <= max(1, int(predicted * 0.9)):
        start *= 2
    return start


def cached_bounds(key: str) -> tuple[int, int | None, dict]:
    """(largest known fit or 0, smallest known OOM or None, the entry)."""
    entry = _read_cache()["entries"].get(key) or {}
    fit = entry.get("max_fit") or 0
    oom = entry.get("min_oom")
    return int(fit), (int(oom) if oom else None), entry


_CACHE_LOCK = threading.Lock()  # study --lanes: searches in threads share one cache file


def record_bounds(key: str, fits: Sequence[int], ooms: Sequence[int], meta: dict[str, Any]) -> dict:
    """Merge probe outcomes into the cache entry (atomic write); returns the entry."""
    with _CACHE_LOCK:
        return _merge_bounds(key, fits, ooms, meta)


def _merge_bounds(key: str, fits: Sequence[int], ooms: Sequence[int], meta: dict[str, Any]) -> dict:
    data = _read_cache()
    entry = dict(data["entries"].get(key) or {})
    fit, oom = merged_bounds((entry.get("max_fit") or 0, entry.get("min_oom")), fits, ooms)
    entry.update(meta)
    entry.update(max_fit=fit or None, min_oom=oom, exact=bool(fit and oom == fit + 1), updated=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    data["entries"][key] = entry
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs a later search its head start
    return entry


def merged_bounds(known: tuple[int, int | None], fits: Sequence[int], ooms: Sequence[int]) -> tuple[int, int | None]:
    """(largest fit, smallest OOM) of known bounds and new outcomes; 0 / None where there is none."""
    fit = max([known[0] or 0, *fits])
    oom_candidates = [x for x in [known[1], *ooms] if x]
    oom = min(oom_candidates) if oom_candidates else None
    if oom is not None and oom <= fit:
        oom = None  # contradicts a newer fit (a changed environment): forget the miss
    return fit, oom


def outcome_lists(probes: Sequence[ProbeResult]) -> tuple[list[int], list[int]]:
    return [p.batch for p in probes if p.fits], [p.batch for p in probes if not p.fits]


def probe_dict(p: ProbeResult) -> dict[str, Any]:
    return dataclasses.asdict(p) | {"fragmentation": p.fragmentation}


def result_dict(result: SearchResult) -> dict[str, Any]:
    return {
        "max_batch": result.max_batch,
        "exact": result.exact,
        "min_oom": result.min_oom,
        "probes": [probe_dict(p) for p in result.probes],
        "n_probes": len(result.probes),
        "seconds": result.seconds,
    }
