"""memlab.core.data: batches (exact windows), the built-in stdlib corpus, the token cache."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from data_helpers import cfg, decode_docs, env, sentences, write_jsonl
from memlab.core.config import DataConfig, load_experiment
from memlab.core.data import TokenData, batch_iterator, cache_entry, load_tokens, n_windows, steps_per_epoch, val_batches
from memlab.core.data import cache as cache_mod
from memlab.core.data import tokens as tokens_mod
from memlab.core.data.batches import _memmap_location, _Tokens
from memlab.core.data.stdlib import stdlib_dir, stdlib_files
from memlab.core.errors import DataError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "memlab-cache"))


# The tests that read `tiny_data` share one xdist worker (pyproject: --dist loadgroup), which builds it once.
SHARES_TINY_DATA = pytest.mark.xdist_group("data-tiny")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> tuple[Path, TokenData, float]:
    """The `tiny` experiment's data (stdlib, bpe:512, 300 files), built once per session in its own cache."""
    root = tmp_path_factory.mktemp("tiny-cache")
    with env(MEMLAB_CACHE=str(root)):
        t0 = time.perf_counter()
        data = load_tokens(load_experiment("tiny").data)
        return root, data, time.perf_counter() - t0


def starts(x: torch.Tensor) -> list[int]:
    """For a stream of np.arange tokens, a window's first token is its start position."""
    return x[:, 0].tolist()


# ---------------------------------------------------------------------------------------------- steps_per_epoch


def test_steps_per_epoch_counts_windows_and_rounds_up():
    # 1001 tokens, T=10: 100 windows of 11 tokens (starts 0, 10, ... 990); batch 8 -> ceil(100 / 8) = 13
    assert n_windows(1001, 10) == 100
    assert steps_per_epoch(1001, 8, 10) == 13
    assert steps_per_epoch(1001, 100, 10) == 1
    assert n_windows(1000, 10) == 99  # the last window needs one token past its input


def test_corpus_smaller_than_one_batch_is_a_data_error():
    with pytest.raises(DataError, match="corpus smaller than one batch: 1000 training tokens make 99 windows"):
        steps_per_epoch(1000, 100, 10)
    with pytest.raises(DataError, match="smaller than one batch"):
        next(batch_iterator(np.arange(50), batch_size=8, micro_batches=1, seq_len=10, seed=0, steps=1))


# ---------------------------------------------------------------------------------------------- batch_iterator


def collect(tokens, **kw):
    return list(batch_iterator(tokens, **kw))


def test_batches_have_shape_dtype_and_shifted_targets():
    tokens = np.arange(2001, dtype=np.uint16)
    steps = collect(tokens, batch_size=8, micro_batches=2, seq_len=16, seed=1, steps=3)
    assert len(steps) == 3
    for step in steps:
        assert len(step) == 2
        for x, y in step:
            assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
            assert torch.equal(y, x + 1)  # arange: the target is the next token
            assert all(s % 16 == 0 for s in starts(x))  # windows start on multiples of seq_len


def test_one_epoch_sees_every_window_once():
    tokens = np.arange(16 * 37 + 1, dtype=np.uint32)  # 37 windows of T=16
    B = 5
    per_epoch = steps_per_epoch(len(tokens), B, 16)
    assert per_epoch == math.ceil(37 / B) == 8
    seen = [s // 16 for step in collect(tokens, batch_size=B, micro_batches=1, seq_len=16, seed=3, steps=per_epoch)
            for s in starts(step[0][0])]
    assert len(seen) == per_epoch * B == 40
    assert sorted(seen[:37]) == list(range(37))  # epoch 0: a permutation of all windows
    # the last step tops up from epoch 1's permutation, seeded by (seed, 1)
    assert seen[37:] == np.random.default_rng([3, 1]).permutation(37)[:3].tolist()


@settings(max_examples=25, deadline=None)
@given(n_win=st.integers(1, 60), batch=st.integers(1, 12), epochs=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_every_epoch_is_a_permutation(n_win, batch, epochs, seed):
    if n_win < batch:
        return
    T = 4
    tokens = np.arange(n_win * T + 1)
    total = n_win * epochs
    steps = math.ceil(total / batch)
    seen = [s // T for step in collect(tokens, batch_size=batch, micro_batches=1, seq_len=T, seed=seed, steps=steps)
            for s in starts(step[0][0])]
    for e in range(epochs):
        assert sorted(seen[e * n_win:(e + 1) * n_win]) == list(range(n_win))


def test_seed_determines_the_order():
    tokens = np.arange(4001)
    kw = dict(batch_size=8, micro_batches=1, seq_len=10, steps=4)
    a = collect(tokens, seed=7, **kw)
    b = collect(tokens, seed=7, **kw)
    c = collect(tokens, seed=8, **kw)
    assert all(torch.equal(p[0][0], q[0][0]) for p, q in zip(a, b))
    assert not all(torch.equal(p[0][0], q[0][0]) for p, q in zip(a, c))


def test_micro_batches_split_the_same_global_batch():
    tokens = np.arange(4001)
    whole = collect(tokens, batch_size=12, micro_batches=1, seq_len=10, seed=5, steps=3)
    split = collect(tokens, batch_size=12, micro_batches=3, seq_len=10, seed=5, steps=3)
    for w, s in zip(whole, split):
        assert torch.equal(torch.cat([x for x, _ in s]), w[0][0])
        assert torch.equal(torch.cat([y for _, y in s]), w[0][1])


def test_ranks_take_disjoint_slices_of_the_global_batch():
    tokens = np.arange(4001)
    kw = dict(batch_size=8, micro_batches=2, seq_len=10, seed=5, steps=4)
    whole = collect(tokens, **kw)
    ranks = [collect(tokens, rank=r, world_size=2, **kw) for r in range(2)]
    for i, step in enumerate(whole):
        glob = torch.cat([x for x, _ in step])
        mine = [torch.cat([x for x, _ in ranks[r][i]]) for r in range(2)]
        assert all(m.shape == (4, 10) for m in mine)
        assert torch.equal(torch.cat(mine), glob)
        assert not set(starts(mine[0])) & set(starts(mine[1]))


def test_resume_at_start_step_continues_the_same_stream():
    tokens = np.arange(2001)
    kw = dict(batch_size=8, micro_batches=1, seq_len=10, seed=2, steps=60)  # 200 windows: 25 steps/epoch, crosses 2
    full = collect(tokens, **kw)
    tail = collect(tokens, start_step=23, **kw)
    assert len(tail) == 60 - 23
    assert all(torch.equal(a[0][0], b[0][0]) for a, b in zip(full[23:], tail))


def test_bad_splits_are_data_errors():
    tokens = np.arange(4001)
    with pytest.raises(DataError, match=r"train.batch_size \(10\) must be divisible by micro-batches \(4\) x ranks \(1\)"):
        collect(tokens, batch_size=10, micro_batches=4, seq_len=10, seed=0, steps=1)
    with pytest.raises(DataError, match="must be divisible"):
        collect(tokens, batch_size=8, micro_batches=1, seq_len=10, seed=0, steps=1, world_size=3)


def test_pin_memory_on_cpu_is_a_no_op():
    tokens = np.arange(2001)
    a = collect(tokens, batch_size=4, micro_batches=1, seq_len=10, seed=0, steps=2)
    b = collect(tokens, batch_size=4, micro_batches=1, seq_len=10, seed=0, steps=2, pin_memory=True)
    assert all(torch.equal(p[0][0], q[0][0]) for p, q in zip(a, b))


def test_loader_workers_keep_the_order_and_map_the_file(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(30001, dtype=np.uint16).tofile(path)
    mm = np.memmap(path, dtype=np.uint16, mode="r")
    train = mm[1000:21001]  # a view with its own offset: travels to the workers as (file, offset, length)
    assert _memmap_location(train) == (str(path), 2000, 20001, "<u2")
    kw = dict(batch_size=8, micro_batches=2, seq_len=16, seed=4, steps=6)
    plain = collect(train, **kw)
    workers = collect(train, workers=2, **kw)
    assert len(workers) == 6
    for p, w in zip(plain, workers):
        for (px, py), (wx, wy) in zip(p, w):
            assert torch.equal(px, wx) and torch.equal(py, wy)
    assert plain[0][0][0].min() >= 1000  # the view, not the whole file


def test_tokens_pickle_a_memmap_by_location(tmp_path):
    import pickle

    path = tmp_path / "t.bin"
    np.arange(100, dtype=np.uint32).tofile(path)
    view = np.memmap(path, dtype=np.uint32, mode="r", offset=40, shape=(50,))[5:]
    blob = pickle.dumps(_Tokens(view))
    assert len(blob) < 400  # not the data
    back = pickle.loads(blob)
    assert np.array_equal(back.array, np.arange(15, 60))


# ---------------------------------------------------------------------------------------------- val_batches


def test_val_batches_cover_the_slice_in_order():
    val = np.arange(10 * 7 + 1)  # 7 windows of T=10
    batches = val_batches(val, micro_batch=3, seq_len=10)
    assert [x.shape[0] for x, _ in batches] == [3, 3, 1]
    x = torch.cat([x for x, _ in batches])
    y = torch.cat([y for _, y in batches])
    assert starts(x) == list(range(0, 70, 10))
    assert torch.equal(y, x + 1) and x.dtype == torch.int64


def test_val_shorter_than_one_window_is_a_data_error():
    with pytest.raises(DataError, match="validation slice of 10 tokens is shorter than one window of seq_len\\+1=11"):
        val_batches(np.arange(10), micro_batch=2, seq_len=10)


# ---------------------------------------------------------------------------------------------- stdlib corpus


def test_stdlib_files_are_deterministic_and_exclude_site_packages():
    files = stdlib_files()
    assert files == stdlib_files()
    assert len(files) > 200
    names = [p for p, _ in files]
    assert not any("site-packages" in p or "__pycache__" in p for p in names)
    assert "os.py" in names and all(p.endswith(".py") for p in names)
    assert names != sorted(names)  # spread by hash, not alphabetical


@SHARES_TINY_DATA
def test_tiny_experiment_data(tiny_data):
    root, data, cold_s = tiny_data
    exp = load_experiment("tiny")
    assert data.source.startswith("stdlib (python ") and "300 of" in data.source
    assert data.tokenizer == "bpe:512 (trained on stdlib)"
    assert data.vocab_size == 512 and data.eos_id == 0
    assert data.train.dtype == data.val.dtype == np.uint16
    assert len(data.val) == exp.data.val_tokens == 4096
    assert not data.cache_hit
    assert cold_s < 30
    assert steps_per_epoch(len(data.train), exp.train.batch_size, exp.model.seq_len) > exp.train.steps
    # every document ends with EOS; the stream is train then val
    meta = json.loads((Path(data.cache_dir) / "meta.json").read_text())
    whole = np.concatenate([data.train, data.val])
    assert len(whole) == meta["n_tokens"] and int((whole == 0).sum()) == meta["n_docs"] == data.n_docs
    assert whole[-1] == 0


@SHARES_TINY_DATA
def test_tiny_tokens_decode_back_to_the_stdlib_files(tiny_data):
    from tokenizers import Tokenizer

    _, data, _ = tiny_data
    tok = Tokenizer.from_file(str(Path(data.cache_dir) / "tokenizer.json"))
    docs = decode_docs(data.train[:200_000], data.eos_id)
    nonempty = [p for p, size in stdlib_files() if size > 0]
    for ids, rel in list(zip(docs, nonempty))[:3]:
        assert tok.decode(ids) == (stdlib_dir() / rel).read_bytes().decode("utf-8", "replace")


@SHARES_TINY_DATA
def test_second_load_is_a_fast_cache_hit(tiny_data):
    root, first, _ = tiny_data
    with env(MEMLAB_CACHE=str(root)):
        t0 = time.perf_counter()
        again = load_tokens(load_experiment("tiny").data)
        warm_s = time.perf_counter() - t0
    assert again.cache_hit and again.cache_key == first.cache_key
    assert warm_s < 2.0  # ~0.02 s on a 2-core machine; generous for CI
    assert isinstance(again.train, np.memmap)
    assert np.array_equal(again.val, first.val)


@SHARES_TINY_DATA
def test_val_slice_is_shared_and_val_tokens_only_moves_the_split(tiny_data):
    root, first, _ = tiny_data
    with env(MEMLAB_CACHE=str(root)):
        more = load_tokens(DataConfig(tokenizer="bpe:512", max_docs=300, val_tokens=8192))
    assert more.cache_hit and more.cache_key == first.cache_key  # val_tokens is not part of the key
    assert len(more.val) == 8192 and np.array_equal(more.val[-4096:], first.val)
    assert len(more.train) + 8192 == len(first.train) + 4096


@SHARES_TINY_DATA
def test_stdlib_path_imports_neither_datasets_nor_the_cli_libraries(tiny_data):
    root, _, _ = tiny_data
    code = (
        "import sys; from memlab.core.config import load_experiment; from memlab.core.data import load_tokens; "
        "d = load_tokens(load_experiment('tiny').data); assert d.cache_hit; "
        "bad = [m for m in ('datasets', 'rich', 'typer', 'textual') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "MEMLAB_CACHE": str(root)}, timeout=120)


# ---------------------------------------------------------------------------------------------- the cache


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_mod.cache_root() == tmp_path / "a"
    monkeypatch.delenv("MEMLAB_CACHE")
    assert cache_mod.cache_root() == tmp_path / "x" / "memlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_mod.cache_root() == tmp_path / "home" / ".cache" / "memlab"


def test_key_follows_source_field_cap_and_tokenizer(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [{"Body": t, "Title": t[:9]} for t in sentences(5)])
    base = cache_entry(cfg(str(f), text_field="Body"))[2]
    assert cache_entry(cfg(str(f), text_field="Body"))[2] == base
    assert cache_entry(cfg(str(f), text_field="Body", val_tokens=999))[2] == base
    assert cache_entry(cfg(str(f), text_field="Title"))[2] != base
    assert cache_entry(cfg(str(f), text_field="Body", max_docs=3))[2] != base
    assert cache_entry(cfg(str(f), text_field="Body", tokenizer="bpe:301"))[2] != base
    os.utime(f, ns=(1, 1))  # an edited file is a different corpus
    assert cache_entry(cfg(str(f), text_field="Body"))[2] != base
    assert base.startswith("a.jsonl-bpe300-")


def test_interrupted_build_leaves_nothing_trusted(tmp_path, monkeypatch):
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in sentences(40)])
    real = tokens_mod._encode

    def interrupted(*args, **kw):
        real(*args, **kw)  # tokens.bin fully written...
        raise KeyboardInterrupt  # ...but killed before meta.json

    monkeypatch.setattr(tokens_mod, "_encode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_tokens(cfg(str(f)))
    root = cache_mod.tokens_dir()
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.setattr(tokens_mod, "_encode", real)
    data = load_tokens(cfg(str(f)))
    assert not data.cache_hit and load_tokens(cfg(str(f))).cache_hit


def test_killed_build_temp_folder_is_cleaned_and_never_trusted(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in sentences(40)])
    name = cache_entry(cfg(str(f)))[2]
    root = cache_mod.tokens_dir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale = root / f".tmp-{name}-{cache_mod._host()}-{dead}-abcd1234"
    stale.mkdir(parents=True)
    (stale / "tokens.bin").write_bytes(b"\0" * 10)
    data = load_tokens(cfg(str(f)))
    assert not data.cache_hit
    assert not stale.exists()


def test_corrupt_entry_is_rebuilt(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in sentences(40)])
    first = load_tokens(cfg(str(f)))
    n = len(first.train) + len(first.val)
    bin_path = Path(first.cache_dir) / "tokens.bin"
    del first
    with open(bin_path, "r+b") as fh:
        fh.truncate(10)
    again = load_tokens(cfg(str(f)))
    assert not again.cache_hit and len(again.train) + len(again.val) == n
