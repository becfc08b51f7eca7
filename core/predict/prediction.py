"""`predict(experiment, profile, micro_batch, card) -> Prediction`: one training step's peak memory on a card.

Methods:
  trace     (the default, any model family) one step of the real TrainStep (memlab.core.step, built on the device
            under FakeTensorMode) measured by MemTracker for the breakdown, and CUDA's caching allocator replayed
            over the step's allocation trace (memlab.core.predict.trace) for the allocated and reserved peaks.
  analytic  (gpt family only) the formula of memlab.core.predict.analytic: instant, tensors only, an upper bound
            for planning (its max batch keeps a fragmentation margin).
Every Prediction says where it is calibrated (`valid_for`) and, outside, what error to expect.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from memlab.core import techniques
from memlab.core.config import Experiment, Profile
from memlab.core.errors import ConfigError, MemlabError
from memlab.core.models import family
from memlab.core.predict import analytic, cache, trace
from memlab.core.predict.calibration import ValidFor, valid_for
from memlab.core.predict.card import Card, card_for, context_bytes_here
from memlab.core.predict.fake import fake_estimate
from memlab.core.techniques import accumulation, distributed, finetune
from memlab.core.units import gib

METHODS = ("trace", "analytic")
ANALYTIC_FAMILIES = ("gpt",)  # the families the analytic formula describes


@dataclass(frozen=True)
class Prediction:
    experiment: str
    profile: str
    micro_batch: int
    accumulation: int
    seq_len: int
    vocab_size: int
    params: int
    method: str  # trace | analytic
    allocated_bytes: int  # tensors at the step's peak (trace: in the allocator's rounded blocks)
    reserved_bytes: int | None  # the caching allocator's segments at the peak; None: not replayed (analytic)
    components: dict[str, int]  # bytes alive at the peak, by component (analytic.COMPONENTS)
    phases: dict[str, int]  # the peak of each phase the method sees
    peak_phase: str
    card_bytes: int
    card: str  # where the card's figure came from
    valid_for: ValidFor
    notes: tuple[str, ...] = field(default_factory=tuple)
    outside_bytes: int = 0  # what the profile's techniques hold outside the allocator (techniques.outside_allocator_bytes)

    @property
    def total_bytes(self) -> int:
        """The components' sum: the breakdown's total (the analytic peak; trace: MemTracker's tensors)."""
        return sum(self.components.values())

    @property
    def fits(self) -> bool:
        return (self.reserved_bytes or self.allocated_bytes) <= self.card_bytes - context_bytes_here() - self.outside_bytes

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("components", "valid_for", "notes")}
        out.update({f"{k}_bytes": v for k, v in self.components.items()})
        out.update(total_bytes=self.total_bytes, phases_bytes=out.pop("phases"), notes=list(self.notes),
                   valid_for=self.valid_for.to_dict(), fits=self.fits)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Prediction:
        comps = {c: d[f"{c}_bytes"] for c in analytic.COMPONENTS}
        kept = {k: d[k] for k in cls.__dataclass_fields__ if k not in ("components", "phases", "valid_for", "notes")}
        return cls(**kept, components=comps, phases=d["phases_bytes"], notes=tuple(d["notes"]),
                   valid_for=ValidFor.from_dict(d["valid_for"]))


def predict(experiment: Experiment, profile: Profile, micro_batch: int | None = None, card: Card | None = None, *,
            method: str = "trace", world_size: int = 1, use_cache: bool = True) -> Prediction:
    """The peak of one training step of `profile` on `experiment` at `micro_batch` (default: the experiment's batch
    over accumulation and ranks) on `card` (default: this GPU, else an 80 GB H100). Bad input is a ConfigError
    before any work: an unknown method, a method that cannot run this model or technique, a card smaller than the
    weights, a sequence longer than the model's positions."""
    card = card or card_for(None)
    refuse(experiment, profile, card, method, world_size)
    micro = micro_batch or max(1, accumulation.micro_batch(experiment, profile, world_size))
    if method == "analytic":  # instant: nothing to keep
        return _analytic(experiment, profile, micro, card, world_size)
    name = cache.key(experiment, profile, micro, asdict(card), method, world_size)
    known = cache.read(name) if use_cache else None
    if known is not None:
        return Prediction.from_dict(known)
    made = _traced(experiment, profile, micro, card)
    cache.write(name, made.to_dict())
    return made


def refuse(experiment: Experiment, profile: Profile, card: Card, method: str, world_size: int = 1) -> None:
    """Every refusal predict makes, one line each, before any trace."""
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is not valid; choose one of: {', '.join(METHODS)}")
    family = family_of(experiment)
    if method == "analytic" and family not in ANALYTIC_FAMILIES:
        raise ConfigError(f"the analytic method describes the {', '.join(ANALYTIC_FAMILIES)} family only, not {family}; use method trace")
    if method == "trace" and world_size > 1:
        raise ConfigError("the trace method measures one process; with several ranks use method analytic")
    refuse_longer_than_positions(experiment)
    refuse_weights_over_card(experiment, profile, card)


def family_of(experiment: Experiment) -> str:
    """The experiment's model family (`[model] family`; memlab's GPT where the field does not exist yet)."""
    return getattr(experiment.model, "family", "gpt")


def weights_bytes(experiment: Experiment, profile: Profile) -> int | None:
    """The weights alone, for the refusal below: the gpt family's from its formula (instant), another family's from
    its skeleton on the meta device (a second for an 8B model), stored as the profile stores them: a frozen base in
    bf16, or in 4 bits plus its scales (a lower bound: the adapters are left out)."""
    if family_of(experiment) not in ANALYTIC_FAMILIES:
        return _skeleton_weights_bytes(experiment, profile)
    m = experiment.model
    vocab, _ = analytic.vocab_for(experiment)
    params = analytic.param_count(m.n_layer, m.d_model, m.d_ff or 4 * m.d_model, m.seq_len, vocab)
    return params * analytic.param_bytes(profile)


def _skeleton_weights_bytes(experiment: Experiment, profile: Profile) -> int:
    """Kept in the prediction cache: the skeleton needs transformers' modeling code, seconds to import."""
    name = cache.key(experiment, profile, 0, {}, "weights", 1)
    known = cache.read(name)
    if known is not None:
        return known["bytes"]
    need = _counted_weights_bytes(experiment, profile)
    cache.write(name, {"bytes": need})
    return need


def _counted_weights_bytes(experiment: Experiment, profile: Profile) -> int:
    model = family.shared_skeleton(experiment)
    stored = finetune.stored_weights_bytes(model, profile)
    return stored if stored is not None else sum(p.numel() for p in model.parameters()) * analytic.param_bytes(profile)


def refuse_weights_over_card(experiment: Experiment, profile: Profile, card: Card) -> None:
    need = weights_bytes(experiment, profile)
    if need is not None and not distributed.shards_weights(profile) and need > card.budget_bytes:
        raise ConfigError(f"the weights need {gib(need)}; the card has {gib(card.total_bytes)} ({card.where}), "
                          f"{gib(card.budget_bytes)} of it for the allocator: choose a larger card or a smaller model")


def _analytic(experiment: Experiment, profile: Profile, micro: int, card: Card, world_size: int) -> Prediction:
    vocab, _ = analytic.vocab_for(experiment)
    est = analytic.estimate(experiment, profile, vocab_size=vocab, micro_batch=micro, world_size=world_size)
    return _made(experiment, profile, est, card, allocated=est.total_bytes, reserved=None)


def _traced(experiment: Experiment, profile: Profile, micro: int, card: Card) -> Prediction:
    """MemTracker's breakdown of the step on fake tensors, and the allocator replay's peaks over its trace. A step
    that cannot be traced is refused; one whose allocations cannot be replayed keeps its breakdown, and says why."""
    vocab, _ = analytic.vocab_for(experiment)
    try:
        est = fake_estimate(experiment, profile, vocab_size=vocab, micro_batch=micro)
    except MemlabError as e:
        est = _breakdown_without_tracker(experiment, profile, micro, f"the trace method cannot run {profile.name}: {e}")
    try:
        allocated, reserved = trace.step_peaks(experiment, profile, vocab_size=vocab, micro_batch=micro, capped=card.capped)
    except MemlabError as e:
        if str(e) not in " ".join(est.notes):  # the breakdown's note says it already
            est.notes.append(f"allocator replay: {e}")
        return _made(experiment, profile, est, card, allocated=est.total_bytes, reserved=None)
    # what the allocator holds beyond the tensors MemTracker saw (workspaces, block rounding) is the workspace's
    est.components["workspace"] += max(0, allocated - est.total_bytes)
    est.method = "fake"  # the peaks are the replay's, whatever made the breakdown
    return _made(experiment, profile, est, card, allocated=allocated, reserved=reserved)


def _breakdown_without_tracker(experiment: Experiment, profile: Profile, micro: int, why: str) -> analytic.Estimate:
    """Where MemTracker cannot run a technique here (a CUDA-only library, offload with host and device one; FSDP2,
    which the replay refuses too): the gpt family's breakdown from the formula; another family is refused with `why`."""
    if family_of(experiment) not in ANALYTIC_FAMILIES:
        raise ConfigError(f"{why.split('; use')[0]}; it needs a fake-tensor stand-in declared next to the technique "
                          "(memlab.core.techniques), or predict without that technique")
    vocab, _ = analytic.vocab_for(experiment)
    est = analytic.estimate(experiment, profile, vocab_size=vocab, micro_batch=micro)
    est.notes.append(f"breakdown: the analytic formula's ({why.split(': ', 1)[1]})")
    return est


def _made(experiment: Experiment, profile: Profile, est: analytic.Estimate, card: Card, *, allocated: int,
          reserved: int | None) -> Prediction:
    valid = valid_for(card.gpu, techniques.memory_libraries(profile))
    notes = tuple(est.notes) + ((valid.note(),) if valid.note() else ())
    return Prediction(experiment.name, profile.name, est.micro_batch, est.accumulation, experiment.model.seq_len,
                      est.vocab_size, est.params, "trace" if est.method == "fake" else est.method, allocated, reserved,
                      dict(est.components), dict(est.phases), est.peak_phase, card.total_bytes, card.where, valid, notes,
                      techniques.outside_allocator_bytes(profile))


def with_seq_len(experiment: Experiment, seq_len: int) -> Experiment:
    return dataclasses.replace(experiment, model=dataclasses.replace(experiment.model, seq_len=seq_len))


def max_positions(experiment: Experiment) -> int | None:
    """The longest sequence the model can take (its position table); None: no limit of its own. Hook for the model
    families: memlab's GPT learns one position embedding per token of model.seq_len, so it sizes itself to any
    length; a transformers model reads max_position_embeddings from its config (when that family is added)."""
    return getattr(experiment.model, "max_positions", None)


def refuse_longer_than_positions(experiment: Experiment) -> None:
    positions = max_positions(experiment)
    if positions and experiment.model.seq_len > positions:
        raise ConfigError(f"model.seq_len = {experiment.model.seq_len} is longer than the model's {positions} positions; "
                          f"choose model.seq_len <= {positions}")

