"""load_tokens: a DataConfig -> the training and validation token arrays, tokenizing once and caching.

Cold: open the corpus, train or load the tokenizer, encode the documents in batches (tokenizers' Rust encoder runs
each batch on every core), append them, EOS after each, to tokens.bin in a temp folder, then rename it into the cache.
Warm: the cache key is computed without reading any data, and the arrays are memory maps of the cached file.

The last `val_tokens` tokens of the stream are the validation slice: fixed by the corpus and the tokenizer alone, so
every profile of an experiment is evaluated on the same tokens, and never trained on them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memlab.core.config import DataConfig
from memlab.core.data import cache
from memlab.core.data.corpus import Corpus, Documents
from memlab.core.data.sources import open_source
from memlab.core.data.tokenizer import (
    EOS,
    TokenizerSpec,
    load_tokenizer,
    parse_tokenizer,
    token_dtype,
    train_bpe,
    vocab_size,
)
from memlab.core.errors import DataError

Progress = Callable[[str, int, int], None]  # (stage, done, total); total 0 = unknown

ENCODE_BATCH_DOCS = 256
ENCODE_BATCH_CHARS = 4 << 20


@dataclass
class TokenData:
    train: np.ndarray  # 1-D token ids (a read-only memory map), uint16 or uint32: every token not in val
    val: np.ndarray  # 1-D, the last `val_tokens` tokens: the held-out slice every profile is evaluated on
    vocab_size: int  # the tokenizer's vocabulary (the model pads it up itself)
    eos_id: int
    tokenizer: str  # e.g. "bpe:8192 (trained on stdlib)"
    source: str  # e.g. "stdlib (python 3.11, 1790 files)"
    cache_key: str  # the cache entry's folder name
    cache_hit: bool
    cache_dir: str = ""  # the cache entry's folder (tokens.bin, tokenizer.json, meta.json)
    n_docs: int = 0

    @property
    def dtype(self) -> np.dtype:
        return self.train.dtype


def cache_entry(cfg: DataConfig) -> tuple[Corpus, TokenizerSpec, str]:
    """(corpus, tokenizer spec, entry name) for a config, reading no data and touching no network."""
    corpus = open_source(cfg)
    spec = parse_tokenizer(cfg.tokenizer)
    key = {"source": corpus.key, "max_docs": cfg.max_docs, "tokenizer": spec.key}
    tok_slug = {"bpe": f"bpe{spec.vocab}", "file": "tokfile", "hf": spec.repo.split("/")[-1]}[spec.kind]
    return corpus, spec, cache.entry_name(f"{corpus.name}-{tok_slug}", key)


def is_cached(cfg: DataConfig) -> bool:
    """Whether `cfg`'s tokens are in the cache already; when not, whether they could be (a DataError in one line
    naming MEMLAB_CACHE and the path when the cache folder cannot be written), before any tokenizing."""
    entry = cache.tokens_dir() / cache_entry(cfg)[2]
    if cache.read_meta(entry) is not None:
        return True  # a warm cache is only read: a read-only one serves
    cache.writable_tokens_dir()
    return False


def load_tokens(cfg: DataConfig, *, progress: Progress | None = None) -> TokenData:
    """The tokens of `cfg`: from the cache when an entry exists, else tokenized now and cached."""
    corpus, spec, name = cache_entry(cfg)
    entry = cache.tokens_dir() / name
    meta, hit = cache.read_meta(entry), True
    if meta is None:
        with cache.locked(name):
            meta = cache.read_meta(entry)  # another process may have built it while this one waited
            if meta is None:
                hit = False
                with cache.staging(name) as tmp:
                    _build(corpus, spec, tmp, progress or _quiet)
                meta = cache.read_meta(entry)
                if meta is None:
                    raise DataError(f"token cache entry {entry} is incomplete right after it was built")
    return _token_data(entry, meta, cfg.val_tokens, hit)


def holdout_warning(train_tokens: int, val_tokens: int) -> str | None:
    """One line when the validation slice is most of the corpus (a small file with a large data.val_tokens)."""
    total = train_tokens + val_tokens
    if total <= 0 or val_tokens * 2 <= total:
        return None
    return (f"validation holds out {val_tokens / total:.0%} of the corpus's {total:,} tokens (data.val_tokens={val_tokens:,}); "
            f"training sees only {train_tokens:,}: use more data or a smaller data.val_tokens")


def _quiet(stage: str, done: int, total: int) -> None:
    pass


def _token_data(entry: Path, meta: dict, val_tokens: int, hit: bool) -> TokenData:
    n = int(meta["n_tokens"])
    if n - val_tokens < 1:
        raise DataError(
            f"corpus too small: {meta['source']} makes {n} tokens and data.val_tokens={val_tokens} leaves none for "
            f"training; use more data (data.max_docs) or a smaller data.val_tokens"
        )
    return TokenData(
        train=cache.open_tokens(entry, meta, 0, n - val_tokens),
        val=cache.open_tokens(entry, meta, n - val_tokens, n),
        vocab_size=int(meta["vocab_size"]),
        eos_id=int(meta["eos_id"]),
        tokenizer=meta["tokenizer"],
        source=meta["source"],
        cache_key=entry.name,
        cache_hit=hit,
        cache_dir=str(entry),
        n_docs=int(meta["n_docs"]),
    )


# ---------------------------------------------------------------------------------------------- building


def _build(corpus: Corpus, spec: TokenizerSpec, folder: Path, progress: Progress) -> None:
    t0 = time.perf_counter()
    scratch = folder / "scratch"  # removed before the entry is renamed into place
    scratch.mkdir()
    progress("reading", 0, 0)
    docs = corpus.open(scratch)
    total = docs.total or 0
    passes = docs.passes
    if spec.trains:
        if not docs.reiterable:
            passes = _spool(docs, scratch / "docs.spool", progress)
        counted = _Count(_nonempty(passes()))
        tok = train_bpe(counted, spec.vocab, progress=lambda i: progress("training tokenizer", i, total))
        if counted.n == 0:
            raise DataError(_empty(corpus, docs))
        eos, learned = tok.token_to_id(EOS), vocab_size(tok)
        note = f", {learned} learned" if learned < spec.vocab else ""
        tok_desc = f"bpe:{spec.vocab} (trained on {corpus.name}{note})"
    else:
        tok, eos, tok_desc = load_tokenizer(spec)
    vocab = vocab_size(tok)
    dtype = token_dtype(vocab)
    tok.save(str(folder / "tokenizer.json"))
    n_tokens, n_docs = _encode(tok, _nonempty(passes()), eos, vocab, dtype, folder / "tokens.bin", total, progress)
    if n_docs == 0:
        raise DataError(_empty(corpus, docs))
    cache.write_meta(folder, {
        "source": docs.describe(n_docs),
        "tokenizer": tok_desc,
        "vocab_size": vocab,
        "eos_id": eos,
        "dtype": dtype.name,
        "n_tokens": n_tokens,
        "n_docs": n_docs,
        "spec": spec.text,
        "build_s": round(time.perf_counter() - t0, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })


def _empty(corpus: Corpus, docs: Documents) -> str:
    field = getattr(getattr(corpus, "cfg", None), "text_field", "text")
    return f"corpus is empty: {corpus.description} has no document with text (field {field!r})"


class _Count:
    """Wraps an iterator and counts what passed through it."""

    def __init__(self, it: Iterable[str]):
        self.it, self.n = iter(it), 0

    def __iter__(self) -> Iterator[str]:
        for x in self.it:
            self.n += 1
            yield x


def _nonempty(texts: Iterable[str]) -> Iterator[str]:
    return (t for t in texts if t)


def _spool(docs: Documents, path: Path, progress: Progress) -> Callable[[], Iterator[str]]:
    """Read a one-pass stream to a scratch file, so training and encoding read the Hub once."""
    total = docs.total or 0
    with open(path, "wb") as f:
        for i, t in enumerate(docs.passes(), 1):
            b = t.encode("utf-8", "surrogatepass")
            f.write(len(b).to_bytes(8, "little"))
            f.write(b)
            if i % 256 == 0:
                progress("reading", i, total)

    def passes() -> Iterator[str]:
        with open(path, "rb") as f:
            while header := f.read(8):
                yield f.read(int.from_bytes(header, "little")).decode("utf-8", "surrogatepass")

    return passes


def _encode(tok: Any, texts: Iterable[str], eos: int, vocab: int, dtype: np.dtype, out: Path, total: int,
            progress: Progress) -> tuple[int, int]:
    """Encode in batches, EOS after every document, appending to `out`; -> (tokens, documents)."""
    if hasattr(tok, "encode_special_tokens"):
        tok.encode_special_tokens = True  # a document's text that spells "<|endoftext|>" stays text, not EOS
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    eos_arr = np.array([eos], dtype=np.int64)
    n_tokens = n_docs = 0
    progress("tokenizing", 0, total)
    with open(out, "wb") as f:

        def flush(batch: list[str]) -> None:
            nonlocal n_tokens, n_docs
            parts = []
            for enc in encode(batch, add_special_tokens=False):
                parts += [np.asarray(enc.ids, dtype=np.int64), eos_arr]
            ids = np.concatenate(parts)
            top = int(ids.max())
            if top >= vocab:
                raise DataError(f"tokenizer produced id {top}, outside its vocabulary of {vocab} tokens")
            ids.astype(dtype).tofile(f)
            n_tokens += len(ids)
            n_docs += len(batch)
            progress("tokenizing", n_docs, total)

        batch: list[str] = []
        chars = 0
        for text in texts:
            batch.append(text)
            chars += len(text)
            if len(batch) >= ENCODE_BATCH_DOCS or chars >= ENCODE_BATCH_CHARS:
                flush(batch)
                batch, chars = [], 0
        if batch:
            flush(batch)
    progress("tokenizing", total or n_docs, total or n_docs)  # empty documents were skipped, not counted
    return n_tokens, n_docs
