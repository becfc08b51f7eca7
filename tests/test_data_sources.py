"""memlab.core.data sources and tokenizers: local files, Hugging Face datasets (in memory / local cache), bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from data_helpers import cfg, decode_docs, sentences, write_jsonl
from memlab.core.data import hub, load_tokens
from memlab.core.data import cache as cache_mod
from memlab.core.data.tokenizer import token_dtype, train_bpe
from memlab.core.errors import DataError

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """A private token cache, a private (empty) Hugging Face cache, and no network: the Hub probe says unreachable.
    The libraries' own offline flags start off (conftest sets HF_HUB_OFFLINE for the session), so these tests show
    that memlab itself puts them offline."""
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "memlab-cache"))
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setattr(datasets.config, name, False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=0: False)


def entries() -> list[str]:
    """What the token cache holds besides lock files (temp folders included)."""
    root = cache_mod.tokens_dir()
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) if root.exists() else []


def tokenizer_of(data):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(data.cache_dir) / "tokenizer.json"))


def decoded(data) -> list[str]:
    tok = tokenizer_of(data)
    stream = np.concatenate([data.train, data.val])
    return [tok.decode(ids) for ids in decode_docs(stream, data.eos_id)]


# ---------------------------------------------------------------------------------------------- local files


def test_jsonl_text_field_round_trips(tmp_path):
    texts = sentences(30) + ["a post that spells <|endoftext|> in its body"]
    f = write_jsonl(tmp_path / "posts.jsonl", [{"Id": i, "Body": t} for i, t in enumerate(texts)])
    stages = []
    data = load_tokens(cfg(str(f), text_field="Body"), progress=lambda s, d, t: stages.append((s, d, t)))
    assert decoded(data) == texts  # in order, one EOS after each, the literal "<|endoftext|>" kept as text
    assert data.n_docs == 31 and data.source == f"{f} (31 documents)"
    assert data.tokenizer == "bpe:300 (trained on posts.jsonl)" and data.vocab_size == 300
    assert {"reading", "training tokenizer", "tokenizing"} <= {s for s, _, _ in stages}
    assert stages[-1] == ("tokenizing", 31, 31)
    assert sorted(p.name for p in Path(data.cache_dir).iterdir()) == ["meta.json", "tokenizer.json", "tokens.bin"]
    assert load_tokens(cfg(str(f), text_field="Body")).cache_hit


def test_folder_of_text_files_one_document_per_file(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / ".hidden").mkdir()
    docs = {"b.txt": "second file\nwith two lines\n", "a.md": "# first\n\nmarkdown", "sub/c.txt": "third"}
    for rel, text in docs.items():
        (folder / rel).write_text(text)
    (folder / ".hidden" / "x.txt").write_text("skipped")
    (folder / "notes.xml").write_text("<ignored/>")
    data = load_tokens(cfg(str(folder), val_tokens=4))
    assert decoded(data) == [docs["a.md"], docs["b.txt"], docs["sub/c.txt"]]  # sorted by relative path
    assert data.source == f"{folder} (3 text files, 3 documents)"


@pytest.mark.parametrize("kind", ["parquet", "csv", "json"])
def test_parquet_csv_and_json_files(tmp_path, kind):
    import polars as pl

    texts = sentences(12)
    frame = pl.DataFrame({"id": list(range(12)), "content": texts})
    f = tmp_path / f"data.{kind}"
    {"parquet": frame.write_parquet, "csv": frame.write_csv}.get(kind, lambda p: p.write_text(json.dumps(frame.to_dicts())))(f)
    data = load_tokens(cfg(str(f), text_field="content"))
    assert decoded(data) == texts


def test_streaming_and_max_docs_give_the_same_first_documents(tmp_path, monkeypatch):
    texts = sentences(50)
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    capped = load_tokens(cfg(str(f), max_docs=20))
    assert decoded(capped) == texts[:20] and capped.n_docs == 20
    streamed = load_tokens(cfg(str(f), max_docs=20, streaming=True))
    assert streamed.cache_hit  # streaming reads the same documents, so it is the same entry
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "other-cache"))
    rebuilt = load_tokens(cfg(str(f), max_docs=20, streaming=True))
    assert not rebuilt.cache_hit and np.array_equal(rebuilt.train, capped.train)


# ---------------------------------------------------------------------------------------------- tokenizers


def _save_tokenizer(folder: Path, texts: list[str], vocab: int = 280) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    train_bpe(texts, vocab).save(str(path))
    return path


def test_tokenizer_json_file(tmp_path):
    texts = sentences(20)
    tok_path = _save_tokenizer(tmp_path / "tok", texts, 280)
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    data = load_tokens(cfg(str(f), tokenizer=str(tok_path)))
    assert data.vocab_size == 280 and data.eos_id == 0
    assert data.tokenizer == f"{tok_path} (280 tokens, EOS <|endoftext|>)"
    assert decoded(data) == texts
    same = load_tokens(cfg(str(f), tokenizer=str(tok_path.parent)))  # the folder that holds tokenizer.json
    assert same.cache_hit


def test_tokenizer_without_eos_gets_one_added_and_config_names_the_eos(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(70_000)} | {"[UNK]": 70_000, "</s>": 70_001, "<eos>": 70_002}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "wl").mkdir()
    tok.save(str(tmp_path / "wl" / "tokenizer.json"))
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": "w1 w69999 w65536 w7"}, {"text": "w2 w3"}])
    data = load_tokens(cfg(str(f), tokenizer=str(tmp_path / "wl"), val_tokens=2))
    assert data.eos_id == 70_001 and data.vocab_size == 70_003  # the usual name </s> wins over <eos>
    assert data.train.dtype == np.uint32  # the vocabulary does not fit uint16
    assert np.concatenate([data.train, data.val]).tolist() == [1, 69999, 65536, 7, 70_001, 2, 3, 70_001]

    (tmp_path / "wl" / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<eos>"}}))
    assert load_tokens(cfg(str(f), tokenizer=str(tmp_path / "wl"), val_tokens=2)).eos_id == 70_002

    bare = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    bare.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bare.save(str(tmp_path / "bare.json"))
    g = write_jsonl(tmp_path / "b.jsonl", [{"text": "a b a"}, {"text": "b"}])
    data = load_tokens(cfg(str(g), tokenizer=str(tmp_path / "bare.json"), val_tokens=1))
    assert data.vocab_size == 4 and data.eos_id == 3 and "<|endoftext|> added as EOS" in data.tokenizer
    assert np.concatenate([data.train, data.val]).tolist() == [0, 1, 0, 3, 1, 3]


def test_token_dtype_limits():
    assert token_dtype(512) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32
    assert token_dtype(1000, "uint32") == np.uint32
    with pytest.raises(DataError, match="vocabulary of 70000 tokens does not fit uint16 \\(at most 65536\\); use uint32"):
        token_dtype(70_000, "uint16")
    with pytest.raises(DataError, match="does not fit uint32"):
        token_dtype(2**32 + 1)
    with pytest.raises(DataError, match="choose one of: uint16, uint32"):
        token_dtype(10, "int8")


def _fake_hub_tokenizer(hub_cache: Path, repo: str, texts: list[str]) -> None:
    """Lay a tokenizer out in a Hugging Face hub cache the way huggingface_hub does."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = hub_cache / f"models--{repo.replace('/', '--')}"
    _save_tokenizer(folder / "snapshots" / commit, texts, 290)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)


def test_hub_tokenizer_from_the_local_cache_offline(tmp_path):
    import huggingface_hub.constants as hub_constants

    texts = sentences(20)
    _fake_hub_tokenizer(Path(hub_constants.HF_HUB_CACHE), "memlab-test/tok", texts)
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    data = load_tokens(cfg(str(f), tokenizer="hf:memlab-test/tok"))  # the Hub is unreachable (fixture)
    assert data.vocab_size == 290 and data.tokenizer == "hf:memlab-test/tok (290 tokens, EOS <|endoftext|>)"
    assert decoded(data) == texts
    assert not hub_constants.HF_HUB_OFFLINE  # offline mode was put back


def test_hub_tokenizer_not_cached_fails_at_once(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in sentences(5)])
    t0 = time.perf_counter()
    with pytest.raises(DataError, match="tokenizer hf:memlab-test/missing is not in the local Hugging Face cache"):
        load_tokens(cfg(str(f), tokenizer="hf:memlab-test/missing"))
    assert time.perf_counter() - t0 < 10
    assert entries() == []


# ---------------------------------------------------------------------------------------------- Hugging Face datasets


class FakeLoader:
    """Stands in for datasets.load_dataset: records the call, returns an in-memory Dataset (or its stream)."""

    def __init__(self, columns: dict):
        self.columns, self.calls = columns, []

    def __call__(self, path, name=None, *, split=None, streaming=False, **kw):
        self.calls.append({"path": path, "name": name, "split": split, "streaming": streaming, **kw})
        ds = datasets.Dataset.from_dict(self.columns)
        return ds.to_iterable_dataset() if streaming else ds


def test_hub_dataset_by_name_config_and_split(monkeypatch):
    texts = sentences(40)
    loader = FakeLoader({"Id": list(range(40)), "Body": texts})
    monkeypatch.setattr(datasets, "load_dataset", loader)
    data = load_tokens(cfg("hf:mikex86/stackoverflow-posts:2023", text_field="Body", split="validation"))
    assert loader.calls == [{"path": "mikex86/stackoverflow-posts", "name": "2023", "split": "validation", "streaming": False}]
    assert data.source == "hf:mikex86/stackoverflow-posts:2023 (validation, 40 documents)"
    assert data.tokenizer == "bpe:300 (trained on mikex86/stackoverflow-posts:2023)"
    assert decoded(data) == texts
    # a later run needs neither the loader nor the network
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("the cache should have answered"))
    assert load_tokens(cfg("hf:mikex86/stackoverflow-posts:2023", text_field="Body", split="validation")).cache_hit


def test_hub_streaming_with_max_docs_reads_the_stream_once(monkeypatch, tmp_path):
    texts = sentences(60)
    loader = FakeLoader({"Body": texts})
    monkeypatch.setattr(datasets, "load_dataset", loader)
    streamed = load_tokens(cfg("hf:o/posts", text_field="Body", streaming=True, max_docs=25))
    assert len(loader.calls) == 1 and loader.calls[0]["streaming"] is True
    assert decoded(streamed) == texts[:25]
    assert streamed.source == "hf:o/posts (train, streamed, the first 25 documents; data.max_docs=25, 0 = all)"
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "other-cache"))
    whole = load_tokens(cfg("hf:o/posts", text_field="Body", max_docs=25))
    assert np.array_equal(whole.train, streamed.train) and whole.cache_key == streamed.cache_key


def test_hub_dataset_missing_field_lists_the_fields(monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", FakeLoader({"Id": [1], "Title": ["t"], "Body": ["b"]}))
    for streaming in (False, True):
        with pytest.raises(DataError, match=r"^hf:o/posts has no field 'body'; its fields: Id, Title, Body \(set --text-field\)$"):
            load_tokens(cfg("hf:o/posts", text_field="body", streaming=streaming))
    assert entries() == []


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE=1", "hub unreachable"])
def test_hub_dataset_not_cached_fails_at_once_offline(monkeypatch, how):
    """The real datasets.load_dataset: no hang, no retries (left alone it retries for ~23 s without a network)."""
    if how.startswith("HF_"):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(DataError) as err:
        load_tokens(cfg("hf:memlab-test/not-cached", text_field="Body", streaming=how.startswith("HF_")))
    assert time.perf_counter() - t0 < 10
    msg = str(err.value)
    assert msg.startswith("hf:memlab-test/not-cached is not in the local Hugging Face cache and the Hub is unavailable")
    assert ("HF_HUB_OFFLINE" in msg) == how.startswith("HF_") and "\n" not in msg
    assert not datasets.config.HF_HUB_OFFLINE  # offline mode was put back
    assert entries() == []


def test_hub_probe_is_quick_against_a_closed_port(monkeypatch):
    monkeypatch.undo()  # the real probe, not the fixture's stand-in
    monkeypatch.setattr(hub, "_reachable", {})
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    t0 = time.perf_counter()
    assert hub.hub_reachable(timeout=2) is False
    assert time.perf_counter() - t0 < 3


# ---------------------------------------------------------------------------------------------- bad input


def _bad_cases(tmp: Path) -> dict[str, tuple[dict, str]]:
    (tmp / "empty_dir").mkdir()
    mixed = tmp / "mixed"
    mixed.mkdir()
    (mixed / "a.txt").write_text("x")
    (mixed / "b.jsonl").write_text('{"text": "y"}\n')
    write_jsonl(tmp / "blank.jsonl", [{"text": ""}, {"text": None}])
    write_jsonl(tmp / "posts.jsonl", [{"Id": 1, "Body": "hello world"}])
    write_jsonl(tmp / "short.jsonl", [{"text": "just a few words"}])
    (tmp / "notes.xml").write_text("<x/>")
    (tmp / "a.txt").write_text("some text")
    (tmp / "broken.json").write_text("{ this is not a tokenizer")
    return {
        "missing path": ({"source": str(tmp / "nope.jsonl")}, r"data source '.*nope.jsonl' not found: use stdlib, a file or folder"),
        "unsupported type": ({"source": str(tmp / "notes.xml")}, r"unsupported file type '.xml'; supported: .txt .md .jsonl"),
        "empty folder": ({"source": str(tmp / "empty_dir")}, r"folder .*empty_dir holds no .txt .md .jsonl .json .parquet .csv files"),
        "mixed folder": ({"source": str(mixed)}, r"folder .*mixed mixes json and text files; point --data at one kind"),
        "empty corpus": ({"source": str(tmp / "blank.jsonl")}, r"corpus is empty: .*blank.jsonl has no document with text \(field 'text'\)"),
        "missing field": ({"source": str(tmp / "posts.jsonl"), "text_field": "body"}, r"has no field 'body'; its fields: Id, Body"),
        "not text": ({"source": str(tmp / "posts.jsonl"), "text_field": "Id"}, r"field 'Id' holds int values, not text"),
        "field on text": ({"source": str(tmp / "a.txt"), "text_field": "Body"}, r"--text-field 'Body' does not apply to .txt/.md files"),
        "too small": ({"source": str(tmp / "short.jsonl"), "val_tokens": 10_000}, r"corpus too small: .* makes \d+ tokens and data.val_tokens=10000 leaves none"),
        "bad tokenizer file": ({"source": str(tmp / "posts.jsonl"), "text_field": "Body", "tokenizer": str(tmp / "broken.json")}, r"tokenizer file .*broken.json does not parse as a tokenizers tokenizer.json"),
        "missing tokenizer": ({"source": "stdlib", "tokenizer": str(tmp / "nope" / "tokenizer.json")}, r"tokenizer '.*' not found: use bpe:N .*, a path to a tokenizer.json, or hf:NAME"),
        "bpe not a number": ({"source": "stdlib", "tokenizer": "bpe:lots"}, r"tokenizer 'bpe:lots': N must be an integer of at least 257"),
        "bpe too small": ({"source": "stdlib", "tokenizer": "bpe:100"}, r"N must be an integer of at least 257 \(256 bytes \+ EOS\)"),
        "bad hub name": ({"source": "hf:"}, r"bad Hugging Face dataset 'hf:': expected hf:NAME or hf:OWNER/NAME\[:CONFIG\]"),
    }


CASES = [
    "missing path", "unsupported type", "empty folder", "mixed folder", "empty corpus", "missing field", "not text",
    "field on text", "too small", "bad tokenizer file", "missing tokenizer", "bpe not a number", "bpe too small",
    "bad hub name",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_a_one_line_data_error_and_leaves_no_entry(tmp_path, case):
    kwargs, pattern = _bad_cases(tmp_path)[case]
    with pytest.raises(DataError) as err:
        load_tokens(cfg(**kwargs))
    assert err.match(pattern)
    assert "\n" not in str(err.value)
    if case != "too small":  # too small: the tokens are fine and cached; only this val_tokens cannot use them
        assert entries() == []
    assert not any(n.startswith(".tmp-") for n in entries())
