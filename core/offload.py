"""Activation offload that overlaps (checkpointing.offload_overlap): tensors a block saves for backward are copied to
pinned host memory on a side CUDA stream while the forward goes on, and copied back one block ahead of the backward
that needs them, so the copies run beside the compute instead of between it (save_on_cpu copies synchronously).

- Pack (forward): a tensor saved inside a block, at least `min_bytes` large and not a weight, is copied to the host
  on the side stream; the GPU tensor is held until the compute stream has waited for that copy (the throttle below,
  or the forward's end), then dropped there. Not `record_stream`: a block freed with pending side-stream work is
  not reused until the allocator sees that work done, so it grows new segments instead (on an H100, gpt2s batch 16
  reserved 7.6 GiB for a 2.9 GiB allocated peak). Everything else (small tensors, parameters,
  views of them, autocast's copies of them, whatever is saved outside the blocks: the embedding, the final norm, the
  head and the loss, needed first in backward) stays where it is.
- Forward throttle: before block i (or the head after the last) runs, the compute stream waits for block i-2's
  copies and drops its device tensors, so at most one finished
  block's activations are in flight beside the block being computed (a forward faster than the link would
  otherwise keep them all on the GPU).
- Prefetch (backward): when backward reaches block i, block i-1's tensors start back on the side stream; reaching
  the final norm starts the last block's. Unpack waits for its tensor's copy (or copies it now if it was never
  prefetched), hands it over and drops the host buffer.

The copies go through a `Copier`, so the bookkeeping runs and is tested on the CPU with plain copies
(`HostCopies`); `CudaCopies` is the real one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol

import torch
from torch import nn

MIN_BYTES = 1 << 20  # smaller tensors (LayerNorm statistics, the log-sum-exp) are not worth a trip over the link


class Copier(Protocol):
    """Moves tensors between the device and the host; `mark` returns a token that `wait` makes the compute wait for."""

    def to_host(self, t: torch.Tensor) -> torch.Tensor: ...

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor: ...

    def mark(self) -> Any: ...

    def wait(self, token: Any) -> None: ...

    def drain(self) -> None: ...


class CudaCopies:
    """Copies on one side stream; the compute stream is whatever stream is current when a hook runs."""

    def __init__(self, device: torch.device):
        self.side = torch.cuda.Stream(device)

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.size(), dtype=t.dtype, pin_memory=True)
        self.side.wait_stream(torch.cuda.current_stream(t.device))  # t is computed
        with torch.cuda.stream(self.side):
            host.copy_(t, non_blocking=True)
        return host  # the caller holds t until the compute stream has waited for this copy (no record_stream)

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        # allocated on the compute stream, which uses and frees it; the side stream only writes it first
        out = torch.empty(host.size(), dtype=host.dtype, device=device)
        self.side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(self.side):
            out.copy_(host, non_blocking=True)
        return out

    def mark(self) -> torch.cuda.Event:
        return self.side.record_event()

    def wait(self, token: torch.cuda.Event) -> None:
        torch.cuda.current_stream().wait_event(token)

    def drain(self) -> None:
        self.side.synchronize()


class HostCopies:
    """The CPU stand-in: copies are clones, tokens are None. Counts what moved (for the tests)."""

    def __init__(self) -> None:
        self.to_host_count = 0
        self.to_device_count = 0

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        self.to_host_count += 1
        return t.detach().clone()

    def to_device(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        self.to_device_count += 1
        return host.clone().to(device)

    def mark(self) -> None:
        return None

    def wait(self, token: None) -> None:
        pass

    def drain(self) -> None:
        pass


@dataclass
class Moved:
    """One saved tensor that went to the host."""

    host: torch.Tensor | None
    device: torch.device
    block: int
    back: torch.Tensor | None = None  # the prefetched device copy, until unpacked
    source: torch.Tensor | None = None  # the device tensor, until the compute stream has waited for its copy
    unpacked: bool = False


@dataclass
class _Block:
    moved: list[Moved] = field(default_factory=list)
    sent: Any = None  # token: the block's copies to the host are done
    left: bool = False  # its forward has ended (`sent` is marked)
    fetched: Any = None  # token: its prefetch is done (None: not prefetched)
    prefetched: bool = False


def is_weight(t: torch.Tensor) -> bool:
    """A parameter, a view of one, or autocast's cast of one (a leaf's copy): weights, not activations."""
    base = t._base if t._base is not None else t
    if isinstance(base, nn.Parameter):
        return True
    fn = base.grad_fn
    if fn is None or fn.name() != "ToCopyBackward0":
        return False
    return all(type(nxt).__name__ == "AccumulateGrad" for nxt, _ in fn.next_functions if nxt is not None)


class OverlapOffload:
    """The per-forward registry of moved tensors, grouped by block, and the hooks that fill and empty it.

    `install(blocks, head)` once on the model; run each forward under `forward()`. `head` is the module that runs
    after the last block (the final norm): backward reaching it starts the last block's prefetch."""

    def __init__(self, copier: Copier, min_bytes: int = MIN_BYTES):
        self.copier, self.min_bytes = copier, min_bytes
        self.blocks: dict[int, _Block] = {}
        self.current: int | None = None  # the block whose forward is running
        self.active = False  # inside forward(): eval and no-grad forwards pass through untouched
        self.packed = self.unpacked = self.moved = 0  # counts, for the tests
        self.late = 0  # moved tensors backward asked for before their prefetch started (copied back on demand)
        self._cleanup_queued = False
        self._handles: list[Any] = []

    def install(self, blocks: list[nn.Module], head: nn.Module | None) -> None:
        for i, block in enumerate(blocks):
            self._handles += [
                block.register_forward_pre_hook(lambda m, a, i=i: self._enter_block(i)),
                block.register_forward_hook(lambda m, a, o, i=i: self._leave_block(i)),
                block.register_full_backward_pre_hook(lambda m, g, i=i: self._backward_reaches(i)),
            ]
        if head is not None:
            last = len(blocks) - 1
            self._handles += [
                # the head throttles as a block would: the loss (the forward's peak) runs with one block in flight
                head.register_forward_pre_hook(lambda m, a: self._throttle(last + 1)),
                head.register_full_backward_pre_hook(lambda m, g: self._backward_reaches(last + 1)),
            ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        self.release()  # what a forward without a backward (or an interrupted one) left behind
        self.active = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self.active, self.current = False, None
            for b in self.blocks.values():
                self._drop_sources(b)

    def _drop_sources(self, b: _Block) -> None:
        """Free a block's device tensors once their copies to the host are done (the compute stream waits for them,
        so the allocator may hand their memory out again at once)."""
        if not b.left or not any(m.source is not None for m in b.moved):
            return
        self.copier.wait(b.sent)
        for m in b.moved:
            m.source = None

    def release(self) -> None:
        """Drop every buffer still held; waits for the side stream first (a prefetch may still be writing)."""
        if self.blocks:
            self.copier.drain()
            self.blocks.clear()
        self._cleanup_queued = False

    # ---------------------------------------------------------------------------------- forward

    def _enter_block(self, i: int) -> None:
        if not self.active or not torch.is_grad_enabled():
            return
        self.current = i
        self.blocks[i] = _Block()
        self._throttle(i)

    def _throttle(self, i: int) -> None:
        """Before block i (or the head, i = number of blocks) runs: at most one finished block in flight beside it."""
        earlier = self.blocks.get(i - 2)
        if self.active and earlier is not None:
            self._drop_sources(earlier)

    def _leave_block(self, i: int) -> None:
        if self.active and i in self.blocks:
            self.blocks[i].sent, self.blocks[i].left = self.copier.mark(), True
            self.current = None

    def worth_moving(self, t: torch.Tensor) -> bool:
        return t.numel() * t.element_size() >= self.min_bytes and not is_weight(t)

    def pack(self, t: torch.Tensor) -> Any:
        self.packed += 1
        if self.current is None or not self.worth_moving(t):
            return t.detach()  # kept; detached so that a saved output does not hold its own grad_fn in a cycle
        m = Moved(self.copier.to_host(t), t.device, self.current, source=t.detach())
        self.blocks[self.current].moved.append(m)
        self.moved += 1
        return m

    # ---------------------------------------------------------------------------------- backward

    def _backward_reaches(self, i: int) -> None:
        """Backward is at block i (i = len(blocks): the head): bring block i-1 back while block i is differentiated."""
        if not self._cleanup_queued:
            self._cleanup_queued = True  # buffers autograd never asked for are dropped when this backward ends
            torch.autograd.Variable._execution_engine.queue_callback(self.release)
        self.prefetch(i)  # a no-op unless nothing brought it back earlier
        self.prefetch(i - 1)

    def prefetch(self, i: int) -> None:
        b = self.blocks.get(i)
        if b is None or b.prefetched:
            return
        b.prefetched = True
        for m in b.moved:
            if not m.unpacked:
                m.back = self.copier.to_device(m.host, m.device)
        b.fetched = self.copier.mark()

    def unpack(self, packed: Any) -> torch.Tensor:
        self.unpacked += 1
        if isinstance(packed, torch.Tensor):
            return packed
        if packed.unpacked:
            raise RuntimeError("checkpointing.offload_overlap hands each saved tensor back once; backward(retain_graph=True) is not supported")
        b = self.blocks[packed.block]
        if packed.back is None:  # never prefetched: copy it now and wait
            self.late += 1
            packed.back = self.copier.to_device(packed.host, packed.device)
            self.copier.wait(self.copier.mark())
        else:
            self.copier.wait(b.fetched)
        out, packed.back, packed.host, packed.unpacked = packed.back, None, None, True
        if all(m.unpacked for m in b.moved):
            del self.blocks[packed.block]
        return out

    def host_buffers(self) -> int:
        """Host buffers still held (0 after a backward)."""
        return sum(m.host is not None for b in self.blocks.values() for m in b.moved)
