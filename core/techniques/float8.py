"""kernels.float8: torchao's float8 training. Each block's nn.Linear becomes torchao's Float8Linear
(`torchao.float8.convert_to_float8_training`, the default tensorwise recipe): its three matmuls (output, input
gradient, weight gradient) run on float8 tensor cores, with the inputs, weights and output gradients cast to float8
on the fly, each with one dynamic scale. The weights stay fp32 masters and the casts are temporaries; fast only
compiled (Inductor fuses the casts and scale reductions), and only where the matmuls are large: on the H100 at
gpt2s's 768-wide blocks it was 19-35% slower than `compile` (two machines). Compiled, it also saves less for
backward (27% lower peak there): the partitioner recomputes the LayerNorm and GELU outputs rather than keep them
(memlab.core.predict.analytic).

Left in high precision: the LM head (the tied embedding matrix: its V x C matmul feeds the loss) and any Linear
whose in or out features are not multiples of 16 (float8 matmuls need them). kernels.fused would bypass the
modules (it calls F.linear on their weights), so the two are refused together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError, DeviceError, MissingExtra
from memlab.core.requirements import refuse_without_cuda
from memlab.core.standin import FakeStep

from memlab.core.models.family import require_family

FAMILIES = ("gpt",)  # what the module swap is checked on

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards
SKIPPED = ("lm_head",)


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    if not profile.kernels.float8:
        return
    check_plan(experiment, profile)
    refuse_without_cuda("kernels.float8", profile, device)
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise DeviceError(f"kernels.float8 needs float8 tensor cores (an H100 or Ada GPU, compute capability 8.9+); this {name} is {capability[0]}.{capability[1]}: set kernels.float8 = false")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise MissingExtra("kernels.float8 needs torchao: pip install 'memlab[torchao]', or kernels.float8 = false", "torchao") from None


def check_plan(experiment: Experiment, profile: Profile) -> None:
    """What the configuration alone rules out, wherever it would run."""
    if not profile.kernels.float8:
        return
    require_family(experiment, FAMILIES, "kernels.float8", "set kernels.float8 = false (the float8 module swap is checked on memlab's GPT only)")
    if profile.kernels.fused:
        raise ConfigError("kernels.float8 swaps the blocks' Linear modules, which kernels.fused bypasses; choose one of kernels.fused, kernels.float8")
    m = experiment.model
    if m.d_model % 16 or (m.d_ff or 4 * m.d_model) % 16:
        raise ConfigError(f"kernels.float8 needs model.d_model ({m.d_model}) and model.d_ff ({m.d_ff or 4 * m.d_model}) to be multiples of 16 (float8 matmul shapes); no block Linear would convert")


def converts(module: torch.nn.Module, fqn: str) -> bool:
    """torchao's module filter: a Linear that float8 can run, and not the LM head."""
    return fqn.split(".")[-1] not in SKIPPED and module.in_features % 16 == 0 and module.out_features % 16 == 0


def swaps_linears(profile: Profile) -> bool:
    """Whether the blocks' Linears are torchao's Float8Linear."""
    return profile.kernels.float8


def around_graphs_standin(profile: Profile) -> dict[str, bool] | None:
    """The eager step a compiled float8 step's graphs are replayed in: without Float8Linear, which fake tensors cannot
    build here (its parameters are the same; its casts and scaled matmuls are in the graphs)."""
    return {"kernels.float8": False} if profile.kernels.float8 else None


def memory_libraries(profile: Profile) -> tuple[str, ...]:
    """The libraries whose release decides this technique's memory (torchao's Float8Linear, traced or stood in for)."""
    return ("torchao",) if profile.kernels.float8 else ()


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    if profile.kernels.float8 and device.type != "cuda":
        return FakeStep(refusal="--method fake cannot run float8 matmuls without CUDA; use --method analytic")
    return None


def apply(step: TrainStep) -> None:
    """After the fused-kernel switch, before checkpointing and compile (which must see the swapped modules)."""
    if not step.profile.kernels.float8:
        return
    import torchao
    from torchao.float8 import convert_to_float8_training

    n = sum(isinstance(m, torch.nn.Linear) and converts(m, fqn) for fqn, m in step.model.named_modules())
    convert_to_float8_training(step.model, module_filter_fn=converts)
    label = f"float8 (torchao {torchao.__version__}, tensorwise, {n} Linear)"
    previous = step.applied.get("kernels", "off")
    step.applied["kernels"] = label if previous == "off" else f"{previous} + {label}"
