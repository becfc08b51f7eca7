"""cuda_graph.enabled: the whole step (forward, backward, clipping, the optimizer) captured once as one CUDA graph and
replayed, so the host launches one graph a step instead of every kernel. Where the host cannot keep the GPU fed (a
small model, memlab's Python-launched fused kernels, the engine's own work between steps) the step then runs at the
GPU's pace; where the GPU is already busy it changes little (docs/techniques.md, "Speed").

Memory is measured, not hidden: the graph's allocations are made while it is captured, through the caching
allocator's counters, in the same phases (forward, backward, optimizer) as a launched step, and a replay allocates
nothing. So the capture's per-phase peaks are every replayed step's peaks (DESIGN.md "What is measured"); the
graph's private pool is in the reserved figure. Phase times cannot be taken inside a graph: a graphed step has a
step time only. (torch.compile's own CUDA-graph modes stay refused: their pool is recorded outside the phases.)

The first WARM_STEPS steps run launched (compile, the optimizer's state, cuBLAS workspaces: what must exist before a
capture), the next one is captured and replayed, every later one replayed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from memlab.core.errors import ConfigError
from memlab.core.requirements import refuse_without_cuda
from memlab.core.standin import FakeStep
from memlab.core.step import StepResult

from memlab.core.models.family import require_family

FAMILIES = ("gpt",)  # what capturing a whole step is checked on

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

WARM_STEPS = 2


def _conflict(profile: Profile) -> str | None:
    """What a captured step cannot hold: host synchronizations and host-side state inside the step."""
    p, fix = profile, "or set cuda_graph.enabled = false"
    if p.precision.dtype == "fp16":
        return f"cuda_graph.enabled cannot capture fp16's GradScaler (it decides on the host whether to step); use precision.dtype = 'bf16', {fix}"
    if p.checkpointing.offload:
        return f"cuda_graph.enabled cannot capture checkpointing.offload (host copies and pinned buffers made during the step); set it to false, {fix}"
    if p.optimizer.offload or p.optimizer.in_backward:
        which = "optimizer.offload" if p.optimizer.offload else "optimizer.in_backward"
        return f"cuda_graph.enabled captures torch's AdamW step; {which} steps elsewhere; set it to false, {fix}"
    if p.optimizer.name != "adamw":
        return f"cuda_graph.enabled captures torch's AdamW (capturable); optimizer.name = {p.optimizer.name!r} is not, use 'adamw', {fix}"
    if p.loss.fused != "none":
        return f"cuda_graph.enabled is not checked with loss.fused = {p.loss.fused!r}'s library kernels; use loss.fused = 'none' (loss.chunked works), {fix}"
    if p.kernels.float8:
        return f"cuda_graph.enabled is not checked with kernels.float8 (torchao's scaling); set kernels.float8 = false, {fix}"
    if p.distributed.mode != "none":
        return f"cuda_graph.enabled is not checked under distributed.mode = {p.distributed.mode!r}; use 'none', {fix}"
    return None


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    if not profile.cuda_graph.enabled:
        return
    check_plan(experiment, profile)
    refuse_without_cuda("cuda_graph", profile, device)


def check_plan(experiment: Experiment, profile: Profile) -> None:
    if profile.cuda_graph.enabled:
        require_family(experiment, FAMILIES, "cuda_graph.enabled", "set cuda_graph.enabled = false (capturing a step is checked on memlab's GPT only)")
        conflict = _conflict(profile)
        if conflict:
            raise ConfigError(conflict)


def captures(profile: Profile) -> bool:
    """Whether the step is captured and replayed as one CUDA graph (the allocator replay gives it its own pool)."""
    return profile.cuda_graph.enabled


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    """A capture allocates what the launched step does; the allocator replay gives the graph its own pool."""
    if profile.cuda_graph.enabled and device.type != "cuda":
        return FakeStep({"cuda_graph.enabled": False},
                        note="cuda_graph measured launched (the same tensors; the allocator replay gives the graph its own pool)")
    return None


def repeats_per_block(profile: Profile, depths: tuple[int, ...]) -> bool:
    """A captured step's private pool is laid out once, for the whole step: not block by block."""
    return not profile.cuda_graph.enabled


def apply(step: TrainStep) -> None:
    """Last, on the finished step: its optimizer keeps lr and its step count on the device (set_lr fills the lr in
    place, outside the graph), and TrainStep.run goes through a StepGraph. Fake-tensor traces (step.on_device) run
    the step as launched: a capture allocates what a launched step does."""
    enabled = step.profile.cuda_graph.enabled and step.device.type == "cuda" and not step.on_device
    if enabled:
        for group in step.optimizer.param_groups:
            group["capturable"] = True
            group["lr"] = torch.tensor(float(group["lr"]), device=step.device)
        step.graph = StepGraph()
    step.applied["cuda_graph"] = f"whole step, captured at step {WARM_STEPS}" if enabled else "off"


class _CaptureMeter:
    """The phase meter's memory half, for the capture: each phase's peak allocated bytes (a capture allocates through
    the caching allocator's counters as a launched step does; CUDA timing events cannot be recorded inside it)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}

    def begin(self, phase: str) -> None:
        torch.cuda.reset_peak_memory_stats()

    def end(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks.get(phase, 0), torch.cuda.max_memory_allocated())


class StepGraph:
    """Runs TrainStep.launch for WARM_STEPS steps, then captures it once with static inputs and replays it."""

    def __init__(self, make_graph: Callable[[], Any] | None = None, capture: Callable[[Any], Any] | None = None):
        self.steps = 0
        self.graph: Any = None
        self.inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.result: StepResult | None = None
        self.peaks: dict[str, int] = {}
        self._make_graph = make_graph or torch.cuda.CUDAGraph
        self._capture = capture or torch.cuda.graph

    def run(self, step: TrainStep, micro_batches: list, meter: Any, on_phase: Callable[[str], None]) -> StepResult:
        self.steps += 1
        if self.steps <= WARM_STEPS:
            return step.launch(micro_batches, meter, on_phase)
        if self.graph is None:
            self._record(step, [(x.to(step.device, copy=True), y.to(step.device, copy=True)) for x, y in micro_batches], on_phase)
        else:  # the batch into the static inputs, stream-ordered before the replay
            for (sx, sy), (x, y) in zip(self.inputs, micro_batches, strict=True):
                sx.copy_(x, non_blocking=True)
                sy.copy_(y, non_blocking=True)
        on_phase("graph")
        self.graph.replay()
        meter.replayed(self.peaks)
        return self._outputs()

    def _record(self, step: TrainStep, batches: list, on_phase: Callable[[str], None]) -> None:
        """Capture one step on these (now static) inputs. The launched steps' cached blocks go back to the device
        first: the graph's pool cannot reuse them, and kept they would stack under it (a graphed step still holds a
        little more: gpt2s bf16 fitted 21 graphed, 22 launched, under a 12 GiB card)."""
        self.inputs = batches
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        capture_meter, graph = _CaptureMeter(), self._make_graph()
        failure: BaseException | None = None
        try:
            with self._capture(graph):
                try:
                    self.result = step.launch(batches, capture_meter, on_phase)
                except BaseException as e:
                    failure = e
                    raise
        except BaseException:
            if failure is not None:  # what failed in the step (an OOM), not the aborted capture's own error
                raise failure from None
            raise
        self.graph, self.peaks = graph, capture_meter.peaks

    def _outputs(self) -> StepResult:
        """Copies of the graph's outputs: the next replay overwrites them, and the engine reads a step late."""
        r = self.result
        assert r is not None
        grad_norm = r.grad_norm.clone() if isinstance(r.grad_norm, torch.Tensor) else r.grad_norm
        return StepResult(r.loss_sum.clone(), grad_norm, False)
