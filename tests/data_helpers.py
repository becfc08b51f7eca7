"""Helpers for the data tests: a private token cache, small corpora written on the spot."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from memlab.core.config import DataConfig

WORDS = "the quick brown fox jumps over the lazy dog while memory stays flat and tokens flow".split()


def sentences(n: int, seed: int = 0, words: int = 40) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=words)) + f" #{i}" for i in range(n)]


@contextlib.contextmanager
def env(**values: str | None) -> Iterator[None]:
    """Set (or, with None, unset) environment variables for the block (usable from session-scoped fixtures)."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def cfg(source: str, **kw) -> DataConfig:
    """A DataConfig for small test corpora: a small BPE and a small validation slice unless told otherwise."""
    kw.setdefault("tokenizer", "bpe:300")
    kw.setdefault("val_tokens", 64)
    return DataConfig(source=source, **kw)


def decode_docs(tokens: np.ndarray, eos: int) -> list[list[int]]:
    """Split a token stream at EOS (EOS dropped)."""
    ids = np.asarray(tokens, dtype=np.int64)
    cuts = np.flatnonzero(ids == eos)
    out, start = [], 0
    for c in cuts:
        out.append(ids[start:c].tolist())
        start = c + 1
    return out
