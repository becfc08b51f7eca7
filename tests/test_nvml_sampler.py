"""NvmlSampler against a stand-in NVML: the device-wide figure and this process's own (the figure a card of its own
would have to hold: issue 17's check that a batch found under --gpu-memory fits), each with its peak."""

from __future__ import annotations

import os
import sys
import types

from memlab.core.meters import NvmlSampler


def _fake_nvml(device_used: list[int], own: list[int | None]) -> types.ModuleType:
    """Each sample takes the next device figure and this process's next figure (None: not listed)."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = RuntimeError
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda i: "h"
    used, mine = iter(device_used), iter(own)
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=next(used))
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50)
    nv.nvmlDeviceGetPowerUsage = lambda h: 100_000

    def processes(h):
        figure = next(mine)
        other = types.SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=10**9)  # another process on the card
        return [other] + ([types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=figure)] if figure is not None else [])

    nv.nvmlDeviceGetComputeRunningProcesses = processes
    return nv


def _sampled(monkeypatch, device_used, own) -> NvmlSampler:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(device_used, own))
    sampler = NvmlSampler(0)
    for _ in device_used:  # the loop's work, without its thread
        sampler._record(sampler._sample())
    return sampler


def test_each_sample_carries_this_processs_own_figure_beside_the_devices(monkeypatch):
    sampler = _sampled(monkeypatch, [5, 9, 7], [3, 6, 4])
    assert [s["process_bytes"] for s in sampler.samples] == [3, 6, 4]  # the other process's 10**9 is not ours
    assert (sampler.peak_used_bytes, sampler.peak_process_bytes) == (9, 6)


def test_a_process_nvml_never_lists_has_no_figure(monkeypatch):
    sampler = _sampled(monkeypatch, [5, 9], [None, None])
    assert sampler.peak_process_bytes is None and sampler.peak_used_bytes == 9
