"""Training batches and validation windows cut from a flat token array.

The training tokens are cut into W non-overlapping windows of seq_len + 1 tokens (input = first seq_len, target =
the same shifted by one), window i starting at i * seq_len. Batches are drawn from one endless stream of window ids:
epoch 0's permutation, then epoch 1's, and so on, each seeded by (seed, epoch). Optimizer step s takes stream
positions [s * B, (s + 1) * B), so `steps_per_epoch` = ceil(W / B) steps see every window (every training token but
the last < seq_len) once, every batch has exactly B sequences (memory figures stay comparable), and a resumed run
(`start_step`) sees exactly what an uninterrupted one would.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterator

import numpy as np
import torch

from memlab.core.errors import DataError

Batch = list[tuple[torch.Tensor, torch.Tensor]]  # one optimizer step: micro-batches of (x, y), each (b, T) int64


def n_windows(n_tokens: int, seq_len: int) -> int:
    """Non-overlapping windows of seq_len + 1 tokens (consecutive windows share one token: y's last is x's next)."""
    return max(0, (n_tokens - 1) // seq_len)


def steps_per_epoch(n_train_tokens: int, batch_size: int, seq_len: int) -> int:
    """Optimizer steps that cover every training window once; DataError if the corpus holds less than one batch."""
    if batch_size < 1 or seq_len < 1:
        raise DataError(f"batch_size ({batch_size}) and seq_len ({seq_len}) must be at least 1")
    windows = n_windows(n_train_tokens, seq_len)
    if windows < batch_size:
        raise DataError(
            f"corpus smaller than one batch: {n_train_tokens} training tokens make {windows} windows of "
            f"seq_len+1={seq_len + 1}, train.batch_size needs {batch_size}; use more data (data.max_docs), "
            f"a smaller data.val_tokens, train.batch_size or model.seq_len"
        )
    return max(1, math.ceil(windows / batch_size))


class _Schedule:
    """Which windows each optimizer step takes: positions in the stream of per-epoch permutations."""

    def __init__(self, windows: int, batch_size: int, seed: int):
        self.windows, self.batch_size, self.seed = windows, batch_size, seed
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a step spans at most two epochs: keep the cache tiny
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.windows)
        return self._perms[epoch]

    def step(self, step: int) -> np.ndarray:
        pos = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
        epoch, offset = np.divmod(pos, self.windows)
        out = np.empty(self.batch_size, dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self.permutation(int(e))[offset[sel]]
        return out


class _Tokens:
    """A 1-D token array that pickles cheaply: a memory-mapped one travels as (file, offset, length) and is
    mapped again in the loader worker instead of being copied through a pipe."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __getstate__(self) -> dict:
        where = _memmap_location(self.array)
        return {"map": where} if where else {"array": np.asarray(self.array)}

    def __setstate__(self, state: dict) -> None:
        if "map" in state:
            filename, offset, length, dtype = state["map"]
            self.array = np.memmap(filename, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(length,))
        else:
            self.array = state["array"]

    def windows(self, ids: np.ndarray, seq_len: int) -> torch.Tensor:
        idx = ids[:, None] * seq_len + np.arange(seq_len + 1)  # (b, T+1)
        return torch.from_numpy(np.asarray(self.array[idx], dtype=np.int64))


def _memmap_location(a: np.ndarray) -> tuple[str, int, int, str] | None:
    """(filename, byte offset, length, dtype) of a contiguous 1-D view into a memory-mapped file, else None."""
    if not isinstance(a, np.memmap) or a.ndim != 1 or not a.flags.c_contiguous or not getattr(a, "filename", None):
        return None
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root, np.memmap) or not isinstance(root.base, mmap.mmap):
        return None
    delta = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return str(a.filename), int(root.offset) + delta, len(a), a.dtype.str


class _Steps(torch.utils.data.Dataset):
    """Item i = the batch of optimizer step start_step + i, already split for this rank into micro-batches."""

    def __init__(self, tokens: np.ndarray, *, batch_size: int, micro_batches: int, seq_len: int, seed: int,
                 steps: int, start_step: int, rank: int, world_size: int, pin: bool):
        self.tokens = _Tokens(tokens)
        self.schedule = _Schedule(n_windows(len(tokens), seq_len), batch_size, seed)
        self.seq_len, self.start_step, self.pin = seq_len, start_step, pin
        self.n = max(0, steps - start_step)
        per_rank = batch_size // world_size
        self.rank_slice = slice(rank * per_rank, (rank + 1) * per_rank)
        self.micro = per_rank // micro_batches

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Batch:
        ids = self.schedule.step(self.start_step + i)[self.rank_slice]
        seqs = self.tokens.windows(ids, self.seq_len)  # (b, T+1)
        out = []
        for chunk in seqs.split(self.micro):
            x, y = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
            if self.pin:
                x, y = x.pin_memory(), y.pin_memory()
            out.append((x, y))
        return out


def batch_iterator(tokens: np.ndarray, *, batch_size: int, micro_batches: int, seq_len: int, seed: int,
                   steps: int, start_step: int = 0, rank: int = 0, world_size: int = 1,
                   pin_memory: bool = False, workers: int = 0) -> Iterator[Batch]:
    """Yield, for optimizer steps start_step .. steps - 1, a list of `micro_batches` (x, y) int64 CPU tensors of
    shape (batch_size // micro_batches // world_size, seq_len); y is x shifted by one token.

    `steps` is the run's total step count (a resumed run passes the same `steps` and its `start_step`). Each rank
    takes a disjoint slice of the same global batch. `pin_memory` pins the tensors when an accelerator is present (a
    documented no-op on a CPU-only machine). `workers` > 0 builds batches in that many DataLoader processes; the order
    is identical to workers = 0.
    """
    if micro_batches < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise DataError(f"bad split: micro_batches={micro_batches}, rank={rank}, world_size={world_size}")
    if batch_size % (micro_batches * world_size):
        raise DataError(
            f"train.batch_size ({batch_size}) must be divisible by micro-batches ({micro_batches}) x ranks ({world_size})"
        )
    if workers < 0:
        raise DataError(f"loader.workers must be >= 0, got {workers}")
    steps_per_epoch(len(tokens), batch_size, seq_len)  # raises when the corpus is smaller than one batch
    pin = bool(pin_memory) and torch.cuda.is_available()
    data = _Steps(tokens, batch_size=batch_size, micro_batches=micro_batches, seq_len=seq_len, seed=seed,
                  steps=steps, start_step=start_step, rank=rank, world_size=world_size, pin=pin and workers == 0)
    if workers == 0:
        return (data[i] for i in range(len(data)))
    # The workers never tokenize: say so, or a forked worker of a process that just tokenized warns about it.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False, num_workers=workers, pin_memory=pin)
    return iter(loader)


def val_batches(val: np.ndarray, *, micro_batch: int, seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The whole validation slice as non-overlapping windows, in order, in batches of `micro_batch` (the last may be
    smaller). The same tokens for every profile, so validation losses compare."""
    if micro_batch < 1:
        raise DataError(f"micro_batch must be at least 1, got {micro_batch}")
    windows = n_windows(len(val), seq_len)
    if windows == 0:
        raise DataError(
            f"validation slice of {len(val)} tokens is shorter than one window of seq_len+1={seq_len + 1}; "
            f"raise data.val_tokens or lower model.seq_len"
        )
    seqs = _Tokens(val).windows(np.arange(windows), seq_len)
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in seqs.split(micro_batch)]
