"""cuda_graph.enabled (memlab.core.techniques.cuda_graph): the refusals, and the StepGraph's bookkeeping around a
capture (which steps run launched, the static inputs, the copied outputs, the capture's peaks handed to the meter).

A CUDA graph cannot be captured on the CPU: here a stand-in graph replays by running the captured step again and
writing its outputs into the captured ones in place, as a replay does. That the real capture trains as the launched
step does, and holds what it holds, is measured on the GPU (bench/graph_step_probe.py, bench/results/graph-step-h100/NOTE.md).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from memlab.core.config import Profile, load_experiment, load_profile
from memlab.core.errors import ConfigError, DeviceError
from memlab.core.techniques import build_step
from memlab.core.techniques import check_plan, check_techniques
from memlab.core.techniques import cuda_graph as cg

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
VOCAB = 128


def _graphed(**changes) -> Profile:
    p = load_profile("bf16")
    p.cuda_graph.enabled = True
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(p, section), name, value)
    return p


@pytest.mark.parametrize(("changes", "names"), [
    ({"precision__dtype": "fp16"}, "GradScaler"),
    ({"checkpointing__offload": True}, "checkpointing.offload"),
    ({"optimizer__offload": True}, "optimizer.offload"),
    ({"optimizer__in_backward": True}, "optimizer.in_backward"),
    ({"optimizer__name": "adafactor"}, "optimizer.name = 'adafactor'"),
    ({"loss__fused": "liger"}, "loss.fused = 'liger'"),
    ({"kernels__float8": True}, "kernels.float8"),
    ({"distributed__mode": "ddp"}, "distributed.mode = 'ddp'"),
])
def test_what_a_graph_cannot_hold_is_refused_with_the_fix(changes, names):
    with pytest.raises(ConfigError) as e:
        cg.check_plan(load_experiment("tiny"), _graphed(**changes))
    message = str(e.value)
    assert names in message and "cuda_graph.enabled = false" in message and "\n" not in message


def test_the_door_runs_the_graph_check_with_every_plan():
    with pytest.raises(ConfigError, match="GradScaler"):
        check_plan(load_experiment("tiny"), _graphed(precision__dtype="fp16"))


def test_the_fastest_profile_graphs_and_passes_the_plan_checks():
    fastest = load_profile("fastest")
    assert fastest.cuda_graph.enabled
    check_plan(load_experiment("gpt2s"), fastest)  # raises if any conflict


def test_cuda_graph_is_refused_on_the_cpu_backend():
    with pytest.raises(DeviceError, match="needs CUDA"):
        check_techniques(load_experiment("tiny"), _graphed(precision__dtype="fp32"), CPU)


def test_the_cli_refuses_it_on_cpu_in_one_line_before_any_work(tmp_path, capsys):
    from memlab.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["run", "--profile", "baseline", "--experiment", "tiny", "--device", "cpu", "--steps", "2",
              "--set", "cuda_graph.enabled=true", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.strip().count("\n") == 0 and "Traceback" not in err, err
    assert "cuda_graph.enabled" in err and not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------ the StepGraph around a capture


class _StandInGraph:
    """Replays by running the captured step again on the static inputs and writing its outputs into the captured
    ones in place: a real replay's effect on what the host can see."""

    def __init__(self) -> None:
        self.step = self.result = None
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        graph = self.step.graph
        fresh = self.step.launch(graph.inputs, cg._CaptureMeter(), lambda name: None)
        graph.result.loss_sum.copy_(fresh.loss_sum)


class _Meter:
    def __init__(self) -> None:
        self.phases: list[str] = []
        self.replayed_peaks: list[dict] = []

    def begin(self, phase: str) -> None:
        self.phases.append(phase)

    def end(self, phase: str) -> None:
        pass

    def replayed(self, peaks: dict) -> None:
        self.replayed_peaks.append(dict(peaks))


def test_warm_steps_launch_then_one_capture_then_replays_with_the_batch_copied_in(monkeypatch):
    allocated = iter(range(1000, 10**6, 1000))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: next(allocated))
    e = load_experiment("tiny")
    torch.manual_seed(e.train.seed)
    step = build_step(e, Profile(), CPU, VOCAB)
    graph = _StandInGraph()
    graph.step = step
    step.graph = cg.StepGraph(make_graph=lambda: graph, capture=lambda g: contextlib.nullcontext())
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (2, e.model.seq_len), generator=g) for _ in range(cg.WARM_STEPS + 3)]
    meters, losses = [], []
    for x in batches:
        meters.append(_Meter())
        losses.append(step.run([(x, torch.roll(x, -1, dims=1))], meters[-1]).loss_sum)

    launched = cg.WARM_STEPS
    assert all(m.phases == ["fwd", "bwd", "opt"] and not m.replayed_peaks for m in meters[:launched])
    assert all(m.phases == [] for m in meters[launched:])  # a graphed step's phases happen in the capture only
    peaks = step.graph.peaks
    assert set(peaks) == {"fwd", "bwd", "opt"} and len(set(peaks.values())) == 3
    assert all(m.replayed_peaks == [peaks] for m in meters[launched:])
    assert graph.replays == 3
    assert torch.equal(step.graph.inputs[0][0], batches[-1])  # the last batch was copied into the static input
    results = losses[launched:]
    assert all(t is not step.graph.result.loss_sum for t in results)  # copies: the next replay overwrites the original
    assert len({round(t.item(), 6) for t in results}) == 3  # each replay's own loss, not the capture's


def test_a_failure_inside_the_capture_surfaces_as_itself(monkeypatch):
    """An OOM while capturing must reach the engine as the OOM (find-batch counts it as 'does not fit'), not as the
    aborted capture's own error raised on the way out."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    class _Capture:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("operation failed due to a previous error during capture")

    class _Step:
        device = CPU

        def launch(self, batches, meter, on_phase):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    graph = cg.StepGraph(make_graph=object, capture=lambda g: _Capture())
    graph.steps = cg.WARM_STEPS
    x = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(torch.OutOfMemoryError):
        graph.run(_Step(), [(x, x)], _Meter(), lambda name: None)


def test_apply_makes_the_optimizer_capturable_with_its_lr_on_the_device(monkeypatch):
    """On a CUDA device (faked: the step is built on the CPU, then told it is CUDA) the groups become capturable and
    their lr a tensor, which set_lr fills in place; fake-tensor traces (on_device) keep the launched step."""
    from memlab.core.optim import set_lr

    e = load_experiment("tiny")
    step = build_step(e, Profile(), CPU, VOCAB)
    step.profile = _graphed(precision__dtype="fp32")
    monkeypatch.setattr(torch, "tensor", lambda v, device=None: torch.as_tensor(v))
    step.device = CUDA
    cg.apply(step)
    assert isinstance(step.graph, cg.StepGraph) and step.applied["cuda_graph"].startswith("whole step")
    lr = step.optimizer.param_groups[0]["lr"]
    assert all(g["capturable"] for g in step.optimizer.param_groups) and isinstance(lr, torch.Tensor)
    set_lr(step.optimizer, 1.5e-4)
    assert step.optimizer.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(1.5e-4)
    step.graph, step.on_device = None, True
    cg.apply(step)
    assert step.graph is None and step.applied["cuda_graph"] == "off"
