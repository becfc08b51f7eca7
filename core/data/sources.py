"""Where documents come from: the built-in stdlib corpus, local files, or a Hugging Face dataset.

A corpus has a `key` (what identifies its documents, hashed into the token cache key; computed without reading the
data, so a cache hit costs no `datasets` import and no network) and `open(scratch)`, which loads it and returns
`Documents`: a callable giving a fresh pass over the texts. Files and Hub datasets go through
`datasets.load_dataset` (builders "text", "json", "parquet", "csv", or a Hub name); `import datasets` is lazy.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from memlab.core.config import DataConfig
from memlab.core.data import hub
from memlab.core.data.corpus import Corpus, Documents
from memlab.core.data.stdlib import StdlibCorpus
from memlab.core.errors import DataError

BUILDERS = {".txt": "text", ".md": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
SUPPORTED = " ".join(BUILDERS)
SOURCE_HELP = f"use stdlib, a file or folder of {SUPPORTED} files, or hf:NAME[:CONFIG]"


def count_documents(n: int, available: int | None, max_docs: int) -> str:
    """`300 of 2,000 documents; data.max_docs=300, 0 = all` when a cap cut the source, else `1,200 documents`."""
    cut = f"; data.max_docs={max_docs}, 0 = all" if max_docs else ""
    if max_docs and available is not None and available > max_docs:
        return f"{n:,} of {available:,} documents{cut}"
    if max_docs and available is None and n >= max_docs:
        return f"the first {n:,} documents{cut}"
    return f"{n:,} document{'s' if n != 1 else ''}"


def open_source(cfg: DataConfig) -> Corpus:
    """DataConfig.source -> a Corpus; a missing path or an unknown form is a DataError naming the valid ones."""
    src = cfg.source.strip()
    if src == "stdlib":
        if cfg.streaming or cfg.split != "train":
            knob = "--streaming (data.streaming)" if cfg.streaming else f"--split {cfg.split!r} (data.split)"
            raise DataError(f"{knob} does not apply to the built-in stdlib corpus (one split, read from disk); "
                            f"leave it out, or use it with a file or hf:NAME source")

        return StdlibCorpus(cfg.max_docs)
    if src.startswith("hf:"):
        return HubCorpus(src, cfg)
    path = Path(src).expanduser()
    if not path.exists():
        raise DataError(f"data source {src!r} not found: {SOURCE_HELP}")
    return FilesCorpus(path, cfg)


# ---------------------------------------------------------------------------------------------- datasets helpers


def _datasets():
    """Import `datasets` (1-2 s) only when a file or Hub source is actually read; keep its logs quiet."""
    try:
        import datasets
    except ImportError as e:
        raise DataError("this data source needs the `datasets` package: pip install datasets") from e
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors become memlab's one line (see FilesCorpus)
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    return datasets


@contextlib.contextmanager
def _quiet_bars(datasets: Any) -> Iterator[None]:
    """No "Generating train split" bars for local files (memlab shows its own); a Hub download keeps its bars."""
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _check_field(columns: Iterable[str] | None, field: str, origin: str) -> None:
    if columns is not None and field not in columns:
        raise DataError(f"{origin} has no field {field!r}; its fields: {', '.join(columns) or '(none)'} (set --text-field)")


def dataset_texts(ds: Any, field: str, origin: str, max_docs: int = 0) -> Documents:
    """Documents from a datasets.Dataset or IterableDataset: the `field` column, first `max_docs` rows."""
    datasets = _datasets()
    if isinstance(ds, datasets.DatasetDict | datasets.IterableDatasetDict):
        raise DataError(f"{origin} has several splits ({', '.join(ds)}); choose one with --split")
    _check_field(ds.column_names, field, origin)
    if isinstance(ds, datasets.Dataset):
        available = len(ds)
        if max_docs:
            ds = ds.select(range(min(max_docs, len(ds))))
        ds = ds.select_columns([field])

        def passes() -> Iterator[str]:
            for batch in ds.iter(batch_size=1024):
                yield from _texts(batch[field], field, origin)

        return Documents(passes, len(ds), True, lambda n: f"{origin} ({count_documents(n, available, max_docs)})", available)

    def stream() -> Iterator[str]:
        rows = iter(ds)
        first = next(rows, None)
        if first is None:
            return
        _check_field(list(first), field, origin)
        rows = itertools.chain([first], rows)
        yield from _texts((row[field] for row in itertools.islice(rows, max_docs or None)), field, origin)

    return Documents(stream, max_docs or None, True, lambda n: f"{origin} ({count_documents(n, None, max_docs)})")


def _texts(values: Iterable[Any], field: str, origin: str) -> Iterator[str]:
    for v in values:
        if isinstance(v, str):
            yield v
        elif v is not None:
            raise DataError(f"{origin}: field {field!r} holds {type(v).__name__} values, not text (set --text-field)")


# ---------------------------------------------------------------------------------------------- local files


class FilesCorpus(Corpus):
    """A file, or a folder searched recursively, of one kind: text (.txt .md; one file = one document), json
    (.jsonl .json), parquet or csv (one row = one document, its `text_field`)."""

    def __init__(self, path: Path, cfg: DataConfig):
        self.path, self.cfg = path, cfg
        if path.is_dir():
            files = sorted(
                (p for p in path.rglob("*") if p.suffix.lower() in BUILDERS and p.is_file()
                 and not any(part.startswith(".") for part in p.relative_to(path).parts)),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not files:
                raise DataError(f"folder {path} holds no {SUPPORTED} files: {SOURCE_HELP}")
        else:
            if path.suffix.lower() not in BUILDERS:
                raise DataError(f"{path}: unsupported file type {path.suffix or '(none)'!r}; supported: {SUPPORTED}")
            files = [path]
        kinds = sorted({BUILDERS[p.suffix.lower()] for p in files})
        if len(kinds) > 1:
            raise DataError(f"folder {path} mixes {' and '.join(kinds)} files; point --data at one kind")
        self.builder, self.files = kinds[0], files
        if self.builder == "text" and cfg.text_field != "text":
            raise DataError(
                f"--text-field {cfg.text_field!r} does not apply to .txt/.md files: each file is one document "
                f"(field 'text')"
            )
        self.name = path.name or str(path)
        self.description = str(path)
        stats = []
        for p in files:
            st = p.stat()
            stats.append(f"{p.resolve()}\t{st.st_size}\t{st.st_mtime_ns}")
        self.key = {
            "kind": "files",
            "builder": self.builder,
            "files": hashlib.sha256("\n".join(stats).encode()).hexdigest(),  # names, sizes, mtimes: edits invalidate
            "split": cfg.split,
            "text_field": None if self.builder == "text" else cfg.text_field,
        }

    def open(self, scratch: Path) -> Documents:
        self._refuse_empty_files()
        datasets = _datasets()
        kwargs: dict[str, Any] = {"sample_by": "document"} if self.builder == "text" else {}
        if not self.cfg.streaming:
            # datasets writes an Arrow copy; keep it in the build's scratch folder, deleted when the build ends.
            kwargs["cache_dir"] = str(scratch / "hf-datasets")
        try:
            with _quiet_bars(datasets):
                ds = datasets.load_dataset(
                    self.builder, data_files=[str(p) for p in self.files], split=self.cfg.split,
                    streaming=self.cfg.streaming, **kwargs,
                )
        except (DataError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001
            raise DataError(self._why_unreadable(e)) from None
        docs = dataset_texts(ds, self.cfg.text_field, str(self.path), self.cfg.max_docs)
        files = f"{len(self.files)} {self.builder} files, " if len(self.files) > 1 else ""
        docs.describe = lambda n: f"{self.path} ({files}{count_documents(n, docs.available, self.cfg.max_docs)})"
        return docs


    def _refuse_empty_files(self) -> None:
        """An empty json / parquet / csv file has no rows to read (datasets says only `StopIteration`)."""
        if self.builder == "text":
            return  # one file = one document: an empty one is skipped like any empty document
        for p in self.files:
            if p.stat().st_size == 0:
                raise DataError(f"{p} is empty (0 bytes): no documents to read; remove it or point --data elsewhere")

    def _why_unreadable(self, e: BaseException) -> str:
        """One line naming the file (and the line, for JSON) that datasets could not read."""
        if self.builder == "json":
            for p in self.files:
                where = first_bad_json(p)
                if where:
                    return f"{where}; fix or remove it"
        cause = e.__cause__ or e.__context__ or e
        return f"cannot read {self.path} as {self.builder}: {hub.one_line(cause)}"


def first_bad_json(path: Path) -> str | None:
    """`FILE line N: not valid JSON (reason)` for the first line of a .jsonl (or the spot in a .json) that does not
    parse; None when the whole file parses."""
    import json

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        return f"{path}: not UTF-8 text (byte {e.start})"
    try:
        json.loads(text)
        return None  # one JSON document (.json)
    except json.JSONDecodeError as whole:
        if text.lstrip().startswith("["):  # one JSON array of rows, not JSON lines
            return f"{path} line {whole.lineno}: not valid JSON ({whole.msg})"
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            return f"{path} line {n}: not valid JSON ({e.msg})"
        if not isinstance(row, dict):
            return f"{path} line {n}: a JSON {type(row).__name__}, expected an object with a text field"
    return None


# ---------------------------------------------------------------------------------------------- Hugging Face Hub


def parse_hub(spec: str) -> tuple[str, str | None]:
    """'hf:NAME[:CONFIG]' -> (NAME, CONFIG or None)."""
    body = spec[3:].strip()
    name, _, config = body.partition(":")
    if not name or not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name):
        raise DataError(f"bad Hugging Face dataset {spec!r}: expected hf:NAME or hf:OWNER/NAME[:CONFIG]")
    return name, config or None


class HubCorpus(Corpus):
    """A Hugging Face dataset by name, through datasets.load_dataset(NAME, CONFIG, split=…, streaming=…)."""

    def __init__(self, spec: str, cfg: DataConfig):
        self.spec, self.cfg = spec, cfg
        self.repo, self.config = parse_hub(spec)
        self.name = self.repo + (f":{self.config}" if self.config else "")
        self.description = f"hf:{self.name}"
        # No revision: the Hub's main branch as cached. Streaming does not change the documents, so it is not keyed.
        self.key = {"kind": "hf", "name": self.repo, "config": self.config, "split": cfg.split, "text_field": cfg.text_field}

    def open(self, scratch: Path) -> Documents:
        datasets = _datasets()
        offline = hub.is_offline()
        origin = f"hf:{self.name}"
        try:
            with hub.offline_mode(offline):
                ds = datasets.load_dataset(self.repo, self.config, split=self.cfg.split, streaming=self.cfg.streaming)
        except (DataError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001
            if offline:
                raise DataError(
                    f"{origin} is not in the local Hugging Face cache and the Hub is unavailable: {hub.offline_reason()}; "
                    f"run once with network, or use stdlib or a local file ({hub.one_line(e, 160)})"
                ) from None
            if type(e).__name__ == "DatasetNotFoundError":
                raise DataError(f"{origin}: no such dataset on the Hub (or it is gated: `hf auth login`)") from None
            raise DataError(f"{origin}: {hub.one_line(e)}") from None
        docs = dataset_texts(ds, self.cfg.text_field, origin, self.cfg.max_docs)
        inner = docs.passes

        def passes() -> Iterator[str]:
            # A stream reads the Hub while it is iterated: keep offline mode on, and turn network failures into one line.
            with hub.offline_mode(offline):
                try:
                    yield from inner()
                except (ConnectionError, TimeoutError) as e:
                    raise DataError(f"{origin}: reading the stream failed: {hub.one_line(e)}") from None

        streamed = ", streamed" if self.cfg.streaming else ""
        count = lambda n: count_documents(n, docs.available, self.cfg.max_docs)  # noqa: E731
        return Documents(passes, docs.total, not self.cfg.streaming, lambda n: f"{origin} ({self.cfg.split}{streamed}, {count(n)})", docs.available)
