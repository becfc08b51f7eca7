"""The built-in corpus: the running interpreter's own standard library sources. Needs no network, ever.

Every .py file under sysconfig's stdlib folder, site-packages excluded (Python 3.11: 1,790 files, 31.5 MB). Files are
ordered by a hash of their relative path: deterministic on every machine with the same Python, and a spread of the
whole library, so `max_docs = 300` is not just the modules whose names start with "a". The validation slice (the
tail of the token stream) is a spread too.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from memlab.core.data.corpus import Corpus, Documents
from memlab.core.errors import DataError

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[tuple[str, int]]:
    """(relative path, size in bytes) of every stdlib .py file, in the corpus order (hash of the path)."""
    root = root or stdlib_dir()
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        for f in files:
            if f.endswith(".py"):
                full = os.path.join(folder, f)
                try:
                    size = os.stat(full).st_size
                except OSError:
                    continue
                found.append((os.path.relpath(full, root).replace(os.sep, "/"), size))
    found.sort(key=lambda item: (hashlib.sha1(item[0].encode()).hexdigest(), item[0]))
    return found


class StdlibCorpus(Corpus):
    """Documents = stdlib files, read directly (no `datasets` import on this path)."""

    name = "stdlib"

    def __init__(self, max_docs: int = 0):
        self.root = stdlib_dir()
        self.files = stdlib_files(self.root)
        if not self.files:
            raise DataError(f"the built-in corpus is empty: no .py files under {self.root}")
        self.chosen = self.files[:max_docs] if max_docs else self.files
        version = ".".join(platform.python_version_tuple()[:2])
        of = f"{len(self.chosen)} of {len(self.files)}" if len(self.chosen) < len(self.files) else f"{len(self.files)}"
        self.description = f"stdlib (python {version}, {of} files)"
        listing = hashlib.sha256("\n".join(f"{p}\t{s}" for p, s in self.chosen).encode()).hexdigest()
        # What identifies the documents: the interpreter, its stdlib folder and the exact files (names and sizes).
        self.key = {"kind": "stdlib", "python": platform.python_version(), "root": str(self.root), "files": listing}

    def open(self, scratch: Path) -> Documents:
        return Documents(self._texts, len(self.chosen), True, lambda n: self.description)

    def _texts(self) -> Iterator[str]:
        for rel, _ in self.chosen:
            try:
                data = (self.root / rel).read_bytes()
            except OSError as e:
                raise DataError(f"cannot read stdlib file {self.root / rel}: {e.strerror}") from None
            # A few test files are deliberately not UTF-8; replacement characters keep the corpus deterministic.
            yield data.decode("utf-8", errors="replace")
