"""find-batch's search against injected probes (exact boundary, logarithmic probes, OOM at 1, failures that are not
OOM), sizes, the cache, the memory cap, and the real child probe on the CPU backend."""

from __future__ import annotations

import math
import os

import pytest
import torch
from fake_children import fake_spec

from memlab.core import batchfind as bf
from memlab.core import gpu_memory
from memlab.core import supervisor
from memlab.core.config import load_experiment, load_profile
from memlab.core.errors import ConfigError, DeviceError


def predicate_probe(max_fit: int, calls: list[int] | None = None, fail_at: int | None = None):
    def probe(b: int) -> bf.ProbeResult:
        if calls is not None:
            calls.append(b)
        if fail_at is not None and b == fail_at:
            raise bf.ProbeError(f"probe at micro-batch {b} ended with 'error', not out of memory: RuntimeError: CUDA illegal memory access")
        return bf.ProbeResult(b, b <= max_fit, message="" if b <= max_fit else "CUDA out of memory. Tried to allocate 2.00 GiB")

    return probe


@pytest.mark.parametrize("answer", [1, 2, 3, 37, 64, 100, 1000, 4097])
@pytest.mark.parametrize("start", [1, 16, 256])
def test_finds_the_exact_boundary_in_logarithmic_probes(answer, start):
    calls: list[int] = []
    r = bf.search_max_batch(predicate_probe(answer, calls), start=start)
    assert r.max_batch == answer and r.min_oom == answer + 1 and r.exact
    assert len(r.probes) == len(calls)
    assert len(calls) <= 2 * math.ceil(math.log2(max(answer, start) + 1)) + 2
    assert len(set(calls)) == len(calls)  # never the same batch twice


def test_grows_by_doubling_then_bisects():
    calls: list[int] = []
    bf.search_max_batch(predicate_probe(37, calls), start=1)
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64]  # grow until the first OOM, no blind halving from the top
    assert calls[7:] == [48, 40, 36, 38, 37]  # then bisect between 32 (fits) and 64 (does not)


def test_oom_at_batch_one_is_a_clear_error():
    with pytest.raises(bf.DoesNotFitError, match="even micro-batch 1 runs out of memory: CUDA out of memory"):
        bf.search_max_batch(predicate_probe(0), start=8)


def test_a_failure_that_is_not_oom_is_an_error_not_a_miss():
    calls: list[int] = []
    with pytest.raises(bf.ProbeError, match="not out of memory: RuntimeError: CUDA illegal memory access"):
        bf.search_max_batch(predicate_probe(100, calls, fail_at=16), start=1)
    assert calls == [1, 2, 4, 8, 16]  # stopped there: 16 was not taken for "does not fit"


def test_candidates_and_known_bounds():
    calls: list[int] = []
    r = bf.search_max_batch(predicate_probe(20, calls), start=48, candidates=bf.divisors(48))
    assert r.max_batch == 16 and r.min_oom == 24 and set(calls) <= set(bf.divisors(48))
    calls.clear()
    r = bf.search_max_batch(predicate_probe(20, calls), known_fit=20, known_oom=21)
    assert r.max_batch == 20 and calls == []  # an exact cached answer costs no probe
    r = bf.search_max_batch(predicate_probe(37, calls), known_fit=32)
    assert r.max_batch == 37 and calls[0] == 64  # grows from the known fit


def test_limit():
    r = bf.search_max_batch(predicate_probe(1000), start=1, limit=50)
    assert r.max_batch == 50 and r.limit_reached and not r.exact and r.min_oom is None


def test_search_over_the_estimator_finds_what_it_predicts():
    """A simulated card: probe(b) fits when the estimator's peak fits; the search and predict_max_batch agree."""
    from memlab.core.predict import analytic as E

    e, p = load_experiment("gpt2s"), load_profile("gradcp_bf16")
    budget = E.usable_bytes(40 * 2**30, profile=p)

    def probe(b):
        return bf.ProbeResult(b, E.estimate(e, p, vocab_size=8192, micro_batch=b).total_bytes <= budget)

    r = bf.search_max_batch(probe)
    assert r.max_batch == E.predict_max_batch(e, p, vocab_size=8192, memory_bytes=40 * 2**30)
    assert len(r.probes) <= 2 * math.ceil(math.log2(r.max_batch + 1)) + 1


def test_fragmentation_from_allocated_and_reserved():
    assert bf.ProbeResult(8, True, peak_alloc_bytes=90, peak_reserved_bytes=100).fragmentation == pytest.approx(0.10)
    assert bf.ProbeResult(8, True).fragmentation is None


@pytest.mark.parametrize(
    "text, expect",
    [("24GiB", 24 * 2**30), ("40GB", 40 * 10**9), ("48G", 48 * 2**30), ("25769803776", 25769803776), ("512MiB", 512 * 2**20), ("1.5TiB", int(1.5 * 2**40)), ("80 gib", 80 * 2**30)],
)
def test_sizes(text, expect):
    assert bf.parse_size(text) == expect


@pytest.mark.parametrize("text, expect", [("0", "more than zero"), ("0GiB", "more than zero"), ("-1G", "not a size"), ("", "not a size"), ("GiB", "not a size"), ("24XB", "unknown unit"), ("1e9", "not a size")])
def test_bad_sizes(text, expect):
    with pytest.raises(ConfigError, match=expect):
        bf.parse_size(text)


def test_cache_keeps_bounds_per_experiment_profile_gpu_and_cap(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    e, p = load_experiment("gpt2s"), load_profile("bf16")
    key = bf.cache_key(e, p, "NVIDIA H100 80GB HBM3", None, steps=3)
    assert bf.cached_bounds(key)[:2] == (0, None)
    bf.record_bounds(key, [32, 64], [128], {"profile": "bf16"})
    bf.record_bounds(key, [96], [100, 97], {"profile": "bf16"})
    fit, oom, entry = bf.cached_bounds(key)
    assert (fit, oom, entry["exact"]) == (96, 97, True) and bf.cache_path().parent == tmp_path
    # accumulation does not change the micro-batch that fits: one entry; the batch and steps do not either
    accum = load_profile("accum")
    e2 = load_experiment("gpt2s")
    e2.train.batch_size, e2.train.steps = 64, 10
    assert bf.cache_key(e2, accum, "NVIDIA H100 80GB HBM3", None, steps=3) == key
    for other in (
        bf.cache_key(e, p, "NVIDIA H100 80GB HBM3", 24 * 2**30, steps=3),
        bf.cache_key(e, p, "NVIDIA A100-SXM4-40GB", None, steps=3),
        bf.cache_key(e, load_profile("gradcp_bf16"), "NVIDIA H100 80GB HBM3", None, steps=3),
        bf.cache_key(e, p, "NVIDIA H100 80GB HBM3", None, steps=3, accumulation=2),
    ):
        assert other != key
    bf.record_bounds(key, [120], [], {})  # a fit above a cached miss: the miss is forgotten, not trusted
    assert bf.cached_bounds(key)[:2] == (120, None)


def test_child_probe_overrides_and_cap():
    probe = bf.ChildProbe("bf16", "gpt2s", ["attention.window=0"], seq_len=1024, steps=3, accumulation=2, cap_bytes=24 * 2**30)
    spec = probe.spec(12)
    probe.close()
    assert spec.device == "cuda" and spec.overrides[0] == "attention.window=0"
    for item in ("train.batch_size=24", "accumulation.steps=2", "train.steps=3", "train.measure_after=1", "data.val_tokens=1025"):
        assert item in spec.overrides
    assert spec.env == {gpu_memory.MEMORY_ENV: str(24 * 2**30)}


def test_memory_cap_env(monkeypatch):
    monkeypatch.delenv(gpu_memory.MEMORY_ENV, raising=False)
    assert gpu_memory.apply_memory_cap(torch.device("cpu")) is None
    monkeypatch.setenv(gpu_memory.MEMORY_ENV, "24GiB")
    with pytest.raises(DeviceError, match="needs CUDA"):
        gpu_memory.apply_memory_cap(torch.device("cpu"))
    monkeypatch.setenv(gpu_memory.MEMORY_ENV, "nonsense")
    with pytest.raises(ConfigError, match=gpu_memory.MEMORY_ENV):
        gpu_memory.apply_memory_cap(torch.device("cpu"))


@pytest.mark.slow
def test_real_child_probe_on_cpu(tmp_path):
    """The real probe in a child process (CPU backend): a finished run fits; a child that fails for another
    reason (here: bad input, exit 2) is a ProbeError, not a miss; probe folders are removed."""
    over = ["train.seed=1"]
    probe = bf.ChildProbe("baseline", "tiny", over, seq_len=64, steps=2, device="cpu", runs_dir=tmp_path)
    r = probe(4)
    assert r.fits and r.batch == 4 and r.seconds > 0
    bad = bf.ChildProbe("baseline", "tiny", ["model.vocab_size=3"], seq_len=64, steps=2, device="cpu", runs_dir=tmp_path)
    with pytest.raises(bf.ProbeRejected, match=r"profile baseline refused \(probe at micro-batch 4\): model.vocab_size"):
        bad(4)
    assert not any(tmp_path.iterdir())


@pytest.mark.requires_cuda
def test_find_batch_on_a_gpu(tmp_path, monkeypatch):
    """On a GPU: real probes (child processes) under a 2 GiB cap find an exact boundary, or the limit."""
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    probe = bf.ChildProbe("bf16", "gpt2s", ["model.n_layer=2"], seq_len=1024, steps=2, cap_bytes=2 * 2**30)
    try:
        r = bf.search_max_batch(probe, start=1, limit=64)
    finally:
        probe.close()
    assert r.max_batch >= 1 and all(p.fits == (p.batch <= r.max_batch) for p in r.probes)


def test_divisors():
    assert bf.divisors(12) == [1, 2, 3, 4, 6, 12] and bf.divisors(1) == [1]


def test_env_name_is_documented():
    assert gpu_memory.MEMORY_ENV == "MEMLAB_GPU_MEMORY_BYTES" and gpu_memory.MEMORY_ENV in (bf.__doc__ or "")
    assert os.environ.get(gpu_memory.MEMORY_ENV) is None


class FakeChildProbe:
    """Stands in for ChildProbe: fits up to `limits[accumulation]` (gradients alive with accumulation cost more)."""

    limits = {1: 12, 2: 8}
    calls: list[tuple[int, int]] = []

    def __init__(self, profile_ref, experiment_ref, overrides, *, seq_len, steps=3, accumulation=1, cap_bytes=None, device="cuda", runs_dir=None):
        self.accumulation = accumulation

    def __call__(self, b):
        FakeChildProbe.calls.append((b, self.accumulation))
        return bf.ProbeResult(b, b <= self.limits[self.accumulation])

    def close(self):
        pass


@pytest.mark.parametrize("limits, expect", [({1: 12, 2: 8}, (8, 2)), ({1: 12, 2: 6}, (4, 4)), ({1: 40, 2: 40}, (16, 1))])
def test_batch_size_max_keeps_the_effective_batch(limits, expect, monkeypatch, tmp_path):
    """--batch-size max: the largest divisor of train.batch_size that fits, accumulation = batch / micro, and the
    pick verified with accumulation (stepping down a divisor when gradients alive make it OOM)."""
    from types import SimpleNamespace

    from memlab.cli.batch import resolve_max_batch

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(bf, "ChildProbe", FakeChildProbe)
    monkeypatch.setattr(gpu_memory, "gpu_info", lambda index=0: gpu_memory.GpuInfo("Fake GPU", 80 * 2**30))
    monkeypatch.setattr(FakeChildProbe, "limits", limits)
    FakeChildProbe.calls = []
    e, p = load_experiment("gpt2s"), load_profile("bf16")
    assert e.train.batch_size == 16
    micro, accum = resolve_max_batch(e, p, SimpleNamespace(type="cuda", index=0), profile_ref="bf16", experiment_ref="gpt2s", overrides=[])
    assert (micro, accum) == expect and micro * accum == 16
    assert all(16 % b == 0 for b, _ in FakeChildProbe.calls)
    n = len(FakeChildProbe.calls)
    assert resolve_max_batch(e, p, SimpleNamespace(type="cuda", index=0), profile_ref="bf16", experiment_ref="gpt2s", overrides=[]) == expect
    assert len(FakeChildProbe.calls) == n  # the second time, all from the cache


def test_gpu_memory_larger_than_the_card_is_refused():
    from memlab.cli.batch import _cap_for

    with pytest.raises(DeviceError, match="more than this GPU has"):
        _cap_for("100GiB", gpu_memory.GpuInfo("NVIDIA H100 80GB HBM3", 80 * 2**30))
    assert _cap_for("24GiB", gpu_memory.GpuInfo("NVIDIA H100 80GB HBM3", 80 * 2**30)) == 24 * 2**30


# ---------------------------------------------------------------------------------------------- probes that misbehave


class FakeKindProbe(bf.ChildProbe):
    """The real ChildProbe, its child a fake one (tests/fake_children.py) chosen by the micro-batch."""

    def __init__(self, kind_at, runs_dir):
        super().__init__("baseline", "tiny", [], seq_len=64, steps=1, device="cpu", runs_dir=runs_dir)
        self.kind_at = kind_at

    def spec(self, b):
        return fake_spec(self.kind_at(b), self.runs_dir)


@pytest.mark.parametrize("kind, fits", [("finished", True), ("oom", False), ("sigkilled", False)])
def test_a_probe_fits_unless_out_of_memory_or_killed_by_the_oom_killer(kind, fits, tmp_path):
    r = FakeKindProbe(lambda b: kind, tmp_path)(4)
    assert r.batch == 4 and r.fits is fits
    if kind == "sigkilled":
        assert "killed by signal 9 (SIGKILL, e.g. the OOM killer)" in r.message
    assert not any(tmp_path.iterdir())  # the probe's folder is removed


@pytest.mark.parametrize("kind, error, match", [
    ("refuses_after_started", bf.ProbeRejected, r"profile baseline refused \(probe at micro-batch 4\): validation slice"),
    ("garbage", bf.ProbeError, r"ended with 'error', not out of memory: \['not'"),
    ("silent_exit_0", bf.ProbeError, r"ended with 'crashed', not out of memory: child exited with status 0"),
    ("unstartable", bf.ProbeError, r"ended with 'crashed', not out of memory: could not start the child process: FileNotFoundError"),
])
def test_a_probe_that_neither_fits_nor_runs_out_of_memory_is_an_error(kind, error, match, tmp_path):
    with pytest.raises(error, match=match):
        FakeKindProbe(lambda b: kind, tmp_path)(4)


def find_batch_with(kind_at, monkeypatch, capsys, tmp_path) -> tuple[int, str, str]:
    """`memlab find-batch` in process on a pretend GPU, each probe's child a fake one."""
    from memlab.cli import batch as batch_cli
    from memlab.cli import main

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(batch_cli, "_require_cuda", lambda what: None)
    monkeypatch.setattr(gpu_memory, "gpu_info", lambda index=0: gpu_memory.GpuInfo("Fake GPU", 80 * 2**30))
    monkeypatch.setattr(bf, "ChildProbe", lambda *a, **k: FakeKindProbe(kind_at, tmp_path / "probes"))
    try:
        main(["find-batch", "--profile", "baseline", "--experiment", "tiny", "--start", "1", "--max", "8"])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_find_batch_reports_a_refused_profile_in_one_line_with_exit_2(monkeypatch, capsys, tmp_path):
    code, out, err = find_batch_with(lambda b: "refuses_after_started", monkeypatch, capsys, tmp_path)
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == "memlab: error: profile baseline refused (probe at micro-batch 1): validation slice of 10 tokens is shorter than one window"


def test_find_batch_reports_a_crashed_probe_and_what_was_measured_before_it(monkeypatch, capsys, tmp_path):
    code, out, err = find_batch_with(lambda b: "finished" if b == 1 else "garbage", monkeypatch, capsys, tmp_path)
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("memlab: error: probe at micro-batch 2 ended with 'error', not out of memory")
    assert err.splitlines()[-1].endswith("(measured before it: micro-batch 1 fits)")


def test_find_batch_counts_an_oom_kill_as_not_fitting(monkeypatch, capsys, tmp_path):
    code, out, err = find_batch_with(lambda b: "finished" if b <= 3 else "sigkilled", monkeypatch, capsys, tmp_path)
    assert code == 0 and "max micro-batch: 3 (4 runs out of memory)" in out
    assert "micro-batch 4 out of memory" in err


# ---------------------------------------------------------------------------------------------- issue 17: a real card, retries, expandable segments


def test_the_allocator_budget_is_the_card_less_what_the_process_holds_outside_the_allocator():
    """--gpu-memory 24GiB is a card of 24 GiB in total: NVML's per-process use beyond the allocator's reserved bytes
    (CUDA context, cuBLAS workspace) comes off before the allocator is capped."""
    card = 24 * 2**30
    nvml_used, reserved = 600 * 2**20 + 2 * 2**20, 2 * 2**20  # context 600 MiB + one 2 MiB allocator block
    assert gpu_memory.allocator_budget(card, nvml_used, reserved) == card - 600 * 2**20
    assert gpu_memory.allocator_budget(card, None, reserved) == card  # NVML could not tell: the whole card, as before
    assert gpu_memory.allocator_budget(card, reserved // 2, reserved) == card  # never more than the card
    with pytest.raises(DeviceError, match="less than what this process holds outside the allocator"):
        gpu_memory.allocator_budget(512 * 2**20, 600 * 2**20, 0)


def test_the_drivers_own_reserve_comes_off_the_card_too(monkeypatch):
    """A real card loses the driver's reserve as well (NVML v2 `reserved`: 0.469 GiB on the H100 with no process on
    it, bench/results/cap-check-h100/NOTE.md); it comes off the budget at the start and whenever it is tightened."""
    import sys
    from types import SimpleNamespace

    card, context, driver = 24 * 2**30, 600 * 2**20, 480 * 2**20
    assert gpu_memory.allocator_budget(card, context, 0, driver) == card - context - driver
    cap = gpu_memory.MemoryCap(card, card - context - driver, context, driver_bytes=driver)
    assert gpu_memory.tightened_budget(cap, context + 2**30, 0) == card - context - 2**30 - driver  # the context grew
    v2 = SimpleNamespace(nvmlMemory_v2=2, nvmlDeviceGetMemoryInfo=lambda h, version=1: SimpleNamespace(reserved=driver))
    monkeypatch.setitem(sys.modules, "pynvml", v2)
    assert gpu_memory.driver_reserved(object()) == driver and gpu_memory.driver_reserved(None) == 0
    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace())  # a binding without v2 memory info
    assert gpu_memory.driver_reserved(object()) == 0


def test_a_probe_reports_the_budget_its_child_measured():
    from types import SimpleNamespace

    child = SimpleNamespace(status="finished", summary={"peak_alloc_bytes": 5, "allocator_budget_bytes": 23 * 2**30}, killed_by_sigkill=False)
    assert bf.probe_result(4, child, 1.0, "baseline").allocator_budget_bytes == 23 * 2**30


def test_a_fit_that_needed_allocator_retries_is_not_clean_unless_allowed():
    retried = bf.ProbeResult(8, True, alloc_retries=3)
    counted = bf.clean_fit(retried)
    assert not counted.fits and counted.retried and "3 allocator retries" in counted.message
    assert bf.clean_fit(retried, allow_retries=True).fits
    assert bf.clean_fit(bf.ProbeResult(8, True, alloc_retries=0)).fits


def test_the_expandable_probe_sets_the_allocator_in_the_childs_env_keeping_the_rest(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,expandable_segments:False")
    assert bf.expandable_probe_env(True) == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    probe = bf.ChildProbe("bf16", "gpt2s", [], seq_len=1024, cap_bytes=24 * 2**30, env=bf.expandable_probe_env(True))
    spec = probe.spec(4)
    probe.close()
    assert spec.env == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True", gpu_memory.MEMORY_ENV: str(24 * 2**30)}


class RetryingChild:
    """A fake `memlab run` child (supervisor.ChildRun) behind the real ChildProbe, which judges its outcome: fits up
    to micro-batch 6, 5 and 6 only after allocator retries; with expandable segments (in its env) no retries and less
    reserved. Each reports the budget a child would have measured under a 24 GiB card."""

    made: list[dict] = []

    def __init__(self, spec):
        self.batch = next(int(o.split("=")[1]) for o in spec.overrides if o.startswith("train.batch_size="))
        self.expandable = "expandable_segments:True" in spec.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        RetryingChild.made.append({"env": spec.env, "batch": self.batch})

    def wait(self):
        from types import SimpleNamespace

        b = self.batch
        summary = {"peak_alloc_bytes": 8 * 2**30, "peak_reserved_bytes": (10 if self.expandable else 12) * 2**30,
                   "alloc_retries": 2 if b in (5, 6) and not self.expandable else 0, "allocator_budget_bytes": 23 * 2**30}
        return SimpleNamespace(status="finished" if b <= 6 else "oom", summary=summary, run_dir=None, killed_by_sigkill=False,
                               message="" if b <= 6 else "CUDA out of memory", stderr_tail="")

    def cancel(self, grace_s):
        pass


def find_batch_fake(args, monkeypatch, capsys, tmp_path) -> tuple[str, str]:
    from memlab.cli import batch as batch_cli
    from memlab.cli import main

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(batch_cli, "_require_cuda", lambda what: None)
    monkeypatch.setattr(gpu_memory, "gpu_info", lambda index=0: gpu_memory.GpuInfo("Fake GPU", 80 * 2**30))
    monkeypatch.setattr(supervisor, "ChildRun", RetryingChild)
    RetryingChild.made = []
    try:
        main(["find-batch", "--profile", "baseline", "--experiment", "tiny", "--start", "1", "--max", "16", "--gpu-memory", "24GiB", *args])
    except SystemExit as e:
        assert e.code == 0, capsys.readouterr().err
    out = capsys.readouterr()
    return out.out, " ".join(out.err.split())  # the progress lines are wrapped at the terminal's width


def test_find_batch_does_not_count_a_fit_with_retries_unless_asked(monkeypatch, capsys, tmp_path):
    out, err = find_batch_fake([], monkeypatch, capsys, tmp_path)
    assert "max micro-batch: 4 (5 runs out of memory)" in out
    assert "micro-batch 5 fits only after allocator retries: not counted (--allow-retries)" in err
    out, err = find_batch_fake(["--allow-retries"], monkeypatch, capsys, tmp_path)
    assert "max micro-batch: 6 (7 runs out of memory)" in out


def test_the_allocator_flip_probe_counts_retries_as_the_search_did(monkeypatch, capsys, tmp_path):
    """Expandable segments on (the search's child needs retries at 5 and 6 all the same: the fake child reads only its
    env): with --allow-retries the search finds 6, and the probe with them off, which retries too, is a fit as well."""
    out, _ = find_batch_fake(["--allow-retries", "--set", "allocator.expandable_segments=true"], monkeypatch, capsys, tmp_path)
    assert "max micro-batch: 6 (7 runs out of memory)" in out
    assert "with expandable_segments:False at micro-batch 6: fits · reserved 12.00 GiB · fragmentation 33% · retries 2" in out


def test_the_study_judges_a_retried_probe_as_find_batch_does(monkeypatch, tmp_path):
    """The study searched through ChildProbe too but counted a probe that needed allocator retries as a fit (on the
    H100 it found 112 for adafactor on the seeds' shape where find-batch found 100), and cached that answer under
    find-batch's key. The probe itself now judges, for every search."""
    from memlab.core.study.maxbatch import find_max
    from memlab.core.study.plan import Plan
    from memlab.core.study.state import Item, Options

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(supervisor, "ChildRun", RetryingChild)
    options = Options(profiles=["baseline"], experiment="tiny", device="cuda", gpu_memory="24GiB", steps=3)
    plan = Plan(options, load_experiment("tiny"), {"baseline": load_profile("baseline")}, "baseline", 24 * 2**30, "NVIDIA Fake")
    item, lines = Item("max/baseline", "max", "baseline"), []
    find_max(plan, item, lines.append, lambda: False)
    assert (item.status, item.max_batch) == ("measured", 4)
    assert any(line.startswith("micro-batch 5 fits only after allocator retries: not counted") for line in lines)
    key = bf.cache_key(plan.experiment, plan.profiles["baseline"], "NVIDIA Fake", 24 * 2**30, steps=3)
    assert bf.cached_bounds(key)[:2] == (4, 5)  # what find-batch reads back
    allowed = bf.ChildProbe("baseline", "tiny", [], seq_len=64, cap_bytes=24 * 2**30, allow_retries=True)
    assert allowed(6).fits and not bf.ChildProbe("baseline", "tiny", [], seq_len=64)(6).fits


def test_a_cache_entry_names_what_counted_as_a_fit():
    e, p = load_experiment("tiny"), load_profile("baseline")
    strict, lenient = (bf.cache_key(e, p, "NVIDIA H100 80GB HBM3", None, steps=3, allow_retries=a) for a in (False, True))
    assert strict != lenient


def test_find_batch_prints_the_card_and_the_allocator_budget_and_what_expandable_segments_changes(monkeypatch, capsys, tmp_path):
    import json

    out, err = find_batch_fake([], monkeypatch, capsys, tmp_path)
    assert "memory: a card of 24.00 GiB in total assumed (--gpu-memory) · allocator budget 23.00 GiB (1.00 GiB outside it" in out
    assert "with expandable_segments:True at micro-batch 4: fits · reserved 10.00 GiB · fragmentation 20% · retries 0 (reserved -16.7% against the search's probe)" in out
    flipped = [m for m in RetryingChild.made if "PYTORCH_CUDA_ALLOC_CONF" in m["env"]]
    assert len(flipped) == 1 and flipped[0]["env"][gpu_memory.MEMORY_ENV] == str(24 * 2**30)  # one extra probe, under the same cap
    out, _ = find_batch_fake(["--json", "--refresh"], monkeypatch, capsys, tmp_path)
    got = json.loads(out)
    assert (got["device_total_bytes"], got["allocator_budget_bytes"]) == (24 * 2**30, 23 * 2**30)
    assert got["expandable_segments"]["setting"] is True and got["expandable_segments"]["probe"]["peak_reserved_bytes"] == 10 * 2**30


def test_the_budget_tightens_when_the_context_grows_and_a_process_over_the_card_is_out_of_memory():
    """Measured on the H100 (bench/results/study-so-posts-h100): 0.66 GiB outside the allocator after one matmul,
    1.20-1.23 GiB at every run's peak; the cap is measured again after the first steps, never loosened."""
    GiB = 2**30
    cap = gpu_memory.MemoryCap(card_bytes=24 * GiB, budget_bytes=24 * GiB - 676 * 2**20, outside_bytes=676 * 2**20)
    grown = gpu_memory.tightened_budget(cap, nvml_used_bytes=10 * GiB + 1260 * 2**20, reserved_bytes=10 * GiB)
    assert grown == 24 * GiB - 1260 * 2**20
    assert gpu_memory.tightened_budget(cap, nvml_used_bytes=10 * GiB + 100 * 2**20, reserved_bytes=10 * GiB) == cap.budget_bytes
    assert gpu_memory.tightened_budget(cap, None, 10 * GiB) == cap.budget_bytes  # NVML cannot tell: as before
    with pytest.raises(gpu_memory.OverTheCard, match=r"this process holds 24\.13 GiB \(22\.90 GiB reserved by the allocator, 1\.23 GiB outside it\): more than the 24\.00 GiB card"):
        gpu_memory.tightened_budget(cap, nvml_used_bytes=int(24.13 * GiB), reserved_bytes=int(22.9 * GiB))


def test_the_memory_cap_is_measured_again_after_the_first_steps_only(monkeypatch):
    """The technique registers an after-step check for the first RECHECK_STEPS steps (warm-up steps, never
    measured ones); what it tightens reaches the summary's allocator_budget_bytes."""
    from types import SimpleNamespace

    from memlab.core.techniques import memory_cap

    GiB = 2**30
    first = gpu_memory.MemoryCap(24 * GiB, 23 * GiB, GiB)
    monkeypatch.setattr(memory_cap, "apply_memory_cap", lambda device: first)
    seen = []

    def tighten(cap):
        seen.append(cap.budget_bytes)
        return gpu_memory.MemoryCap(cap.card_bytes, cap.budget_bytes - GiB // 4, cap.outside_bytes + GiB // 4)

    monkeypatch.setattr(memory_cap, "tighten_memory_cap", tighten)
    step = SimpleNamespace(device=torch.device("cpu"), applied={}, after_step=[])
    memory_cap.apply(step)
    for i in range(6):
        for check in step.after_step:
            check(i)
    assert len(seen) == memory_cap.RECHECK_STEPS
    assert step.applied == {"gpu_memory_cap_bytes": 24 * GiB, "allocator_budget_bytes": 23 * GiB - memory_cap.RECHECK_STEPS * GiB // 4}


def _reserved_probe(fixed: int, per_sequence: float, budget: int, calls: list[int]):
    """A probe whose reserved peak is affine in the batch, rounded up to the allocator's 20 MiB segments."""
    seg = 20 * 2**20

    def probe(b: int) -> bf.ProbeResult:
        calls.append(b)
        reserved = -(-int(fixed + per_sequence * b) // seg) * seg
        fits = reserved <= budget
        return bf.ProbeResult(b, fits, peak_reserved_bytes=reserved if fits else None, allocator_budget_bytes=budget)

    return probe


@pytest.mark.parametrize("fixed_gib, per_sequence_gib, start", [(2, 0.225, 64), (0.5, 0.0112, 1024), (3, 0.01, 1), (1, 0.2, 300)])
def test_measured_reserved_peaks_guide_the_search_to_the_exact_max_in_fewer_probes(fixed_gib, per_sequence_gib, start):
    GiB, budget = 2**30, int(23.34 * 2**30)
    fixed, per = int(fixed_gib * GiB), per_sequence_gib * GiB
    truth = max(b for b in range(1, 1 << 16) if -(-int(fixed + per * b) // (20 * 2**20)) * (20 * 2**20) <= budget)
    guided: list[int] = []
    r = bf.search_max_batch(_reserved_probe(fixed, per, budget, guided), start=start)
    plain: list[int] = []
    bf.search_max_batch(predicate_probe(truth, plain), start=start)
    assert (r.max_batch, r.min_oom) == (truth, truth + 1)
    assert len(guided) < len(plain)


def test_the_extrapolation_is_affine_through_two_fits_and_proportional_through_one():
    GiB = 2**30
    one = [bf.ProbeResult(10, True, peak_reserved_bytes=2 * GiB, allocator_budget_bytes=20 * GiB)]
    assert bf.extrapolated_max(one) == 100  # the safe side: the fixed part counted as growing
    two = one + [bf.ProbeResult(20, True, peak_reserved_bytes=3 * GiB, allocator_budget_bytes=20 * GiB)]
    assert bf.extrapolated_max(two) == 190  # 1 GiB fixed + 0.1 GiB a sequence
    assert bf.extrapolated_max([bf.ProbeResult(10, False, allocator_budget_bytes=20 * GiB)]) is None
    assert bf.extrapolated_max([bf.ProbeResult(10, True, peak_reserved_bytes=GiB)]) is None  # no budget: no guide


@pytest.mark.parametrize("replayed, expected", [(100, 100), (None, "analytic"), (10**9, "guard")])
@pytest.mark.parametrize("profile", ["bf16", "gradcp_bf16", "act_offload"])
def test_the_prediction_takes_the_allocator_replay_under_an_analytic_guard(monkeypatch, profile, replayed, expected):
    """With replay (a real GPU's find-batch and study), the smaller of the replayed figure and the analytic one with
    the plain fragmentation margin only (the replay lays the blocks out itself); the analytic figure with its
    pattern's own margin where the step cannot be replayed (None)."""
    from memlab.core.predict import analytic as E
    from memlab.core.predict import maxbatch as P

    exp, prof = load_experiment("tiny"), load_profile(profile)
    analytic = P.predicted_max_batch(exp, prof, 2 * 2**30)
    guard = E.predict_max_batch(exp, prof, vocab_size=E.vocab_for(exp)[0], memory_bytes=2 * 2**30, pattern="plain")
    asked = []
    monkeypatch.setattr(P, "_replayed_max_batch",
                        lambda e, p, vocab, card, near, should_stop=None: asked.append((card.budget_bytes, near, card.capped)) or replayed)
    got = P.predicted_max_batch(exp, prof, 2 * 2**30, replay=True)
    assert got == {"analytic": analytic, "guard": guard}.get(expected, expected)
    assert asked == [(2 * 2**30 - E.CUDA_CONTEXT_BYTES, analytic, True)] and analytic > 100  # an emulated card by default
    assert (guard == analytic) == (E.allocation_pattern(prof) == "plain") and guard >= analytic
    assert P.predicted_max_batch(exp, prof, 2 * 2**30) == analytic  # without replay, as before


@pytest.mark.parametrize("reserve,expect_mib", [(None, 1247), (480 * 2**20, 1247), (615 * 2**20, 1382)])
def test_a_prediction_on_a_gpu_counts_its_own_driver_reserve_in_place_of_the_h100s(reserve, expect_mib, monkeypatch):
    """The H100's 1,247 MiB outside the allocator hold its driver's 480 MiB reserve; an H200 reserves 615 MiB. No
    GPU, or no NVML v2 answer (0): the H100's figure."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: reserve is not None)
    monkeypatch.setattr(gpu_memory, "_nvml_index", lambda index: index)
    monkeypatch.setattr(gpu_memory, "_nvml_handle", lambda index: object())
    monkeypatch.setattr(gpu_memory, "driver_reserved", lambda handle: reserve or 0)
    from memlab.core.predict import card

    assert card.context_bytes_here() == expect_mib * 2**20


def test_find_batch_profiles_searches_each_profile_on_a_gpu_lane(monkeypatch, capsys, tmp_path):
    """--profiles a,b --gpus 0,1 on two faked GPUs: one search per profile, every probe of it pinned to its lane."""
    from memlab.cli import batch as batch_cli
    from memlab.cli import main

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MEMLAB_FAKE_GPU_COUNT", "2")
    monkeypatch.setattr(batch_cli, "_require_cuda", lambda what: None)
    monkeypatch.setattr(gpu_memory, "gpu_info", lambda index=0: gpu_memory.GpuInfo("Fake GPU", 80 * 2**30))
    envs = []
    monkeypatch.setattr(bf, "ChildProbe", lambda *a, **k: envs.append(k.get("env", {})) or FakeKindProbe(lambda b: "finished" if b <= 3 else "oom", tmp_path / "probes"))
    main(["find-batch", "--profiles", "baseline,bf16", "--experiment", "tiny", "--start", "1", "--max", "8", "--gpus", "0,1"])
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["baseline: max micro-batch 3", "bf16: max micro-batch 3"]
    assert all(", gpu 0, " in ln or ", gpu 1, " in ln for ln in lines)
    assert len(envs) == 4 and {e.get("CUDA_VISIBLE_DEVICES") for e in envs} <= {"0", "1"}  # each search and its flipped probe
    assert "[gpu " in out.err


@pytest.mark.parametrize("args, expect", [
    (["--profiles", "baseline,baseline"], "--profiles 'baseline,baseline': give each profile once"),
    (["--profiles", "baseline", "--gpus", "0,0"], "--gpus 0,0: GPU 0 is listed twice"),
    (["--profiles", "baseline", "--gpus", "2"], "--gpus 2: GPU 2 is not visible (visible: 0,1)"),
    (["--profile", "baseline", "--profiles", "bf16"], "give --profile NAME, or --profiles a,b,c"),
])
def test_find_batch_profiles_bad_input_is_one_line(monkeypatch, capsys, args, expect):
    from memlab.cli import main

    monkeypatch.setenv("MEMLAB_FAKE_GPU_COUNT", "2")
    with pytest.raises(SystemExit) as exit_:
        main(["find-batch", "--experiment", "tiny", *args])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(err) == 1 and expect in err[0], err


class LengthChild(RetryingChild):
    """Fits while micro-batch x sequence stays within 700 tokens."""

    def __init__(self, spec):
        self.batch = next(int(o.split("=")[1]) for o in spec.overrides if o.startswith("train.batch_size="))
        self.tokens = self.batch * next(int(o.split("=")[1]) for o in spec.overrides if o.startswith("model.seq_len="))
        LengthChild.made.append(self.tokens)

    def wait(self):
        from types import SimpleNamespace

        fits = self.tokens <= 700
        return SimpleNamespace(status="finished" if fits else "oom", summary={}, run_dir=None, killed_by_sigkill=False,
                               message="" if fits else "CUDA out of memory", stderr_tail="")


def test_find_batch_seq_len_max_probes_sequences_from_the_predicted_one(monkeypatch, capsys, tmp_path):
    from memlab.cli import batch as batch_cli
    from memlab.cli import main
    from memlab.core.predict import maxbatch

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(batch_cli, "_require_cuda", lambda what: None)
    monkeypatch.setattr(gpu_memory, "gpu_info", lambda index=0: gpu_memory.GpuInfo("Fake GPU", 80 * 2**30))
    monkeypatch.setattr(supervisor, "ChildRun", LengthChild)
    monkeypatch.setattr(maxbatch, "longest_sequence", lambda *a: 256)  # a prediction well below: the search climbs
    LengthChild.made = []
    main(["find-batch", "--profile", "baseline", "--experiment", "tiny", "--seq-len", "max", "--batch-size", "2",
          "--gpu-memory", "24GiB"])
    out = capsys.readouterr().out
    assert "longest sequence at micro-batch 2: 320 tokens (a multiple of 64; predicted 256)" in out
    assert LengthChild.made[0] == 2 * 256 and len(LengthChild.made) <= 4  # from the prediction, a few probes
