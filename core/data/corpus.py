"""What every source of documents is (memlab.core.data.sources, the built-in stdlib corpus): a `Corpus` with a
`key` (what identifies its documents, hashed into the token cache key, computed without reading them) and
`open(scratch)`, which loads it and returns `Documents`, a callable giving a fresh pass over the texts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Documents:
    passes: Callable[[], Iterator[str]]  # each call: a fresh pass over the texts, max_docs applied
    total: int | None  # number of documents when known (for progress)
    reiterable: bool  # False: a second pass would fetch everything again (a Hub stream): spool it instead
    describe: Callable[[int], str]  # documents actually tokenized -> e.g. "posts.jsonl (1200 documents)"
    available: int | None = None  # documents in the source before max_docs, when known


class Corpus:
    name: str  # short, for "trained on ..." and the cache entry's folder name
    description: str
    key: dict

    def open(self, scratch: Path) -> Documents:
        raise NotImplementedError
