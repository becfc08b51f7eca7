"""pyproject.toml lists memlab's packages by hand (core/ tui/ profiles/ sit at the top level and install under
memlab.*): a new sub-package or data file left off that list works from the source tree and is missing from the
wheel. These tests hold the list to the tree. (.ci/run builds the wheel and imports every module of it.)"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_SUFFIXES = (".toml", ".tcss")


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder_to_package() -> dict[Path, str]:
    """The top-level folders of package-dir, each with the dotted name it installs as."""
    return {ROOT / folder: name for name, folder in _setuptools()["package-dir"].items()}


def _package_of(folder: Path) -> str | None:
    """The dotted name a source folder installs as (None outside package-dir's folders)."""
    for top, name in _folder_to_package().items():
        if folder == top or top in folder.parents:
            return ".".join([name, *folder.relative_to(top).parts])
    return None


def _source_files(pattern: str) -> list[Path]:
    return sorted(p for top in _folder_to_package() for p in top.rglob(pattern) if "__pycache__" not in p.parts)


def test_package_dir_covers_the_four_top_level_folders():
    assert _setuptools()["package-dir"] == {
        "memlab": "memlab", "memlab.core": "core", "memlab.tui": "tui", "memlab.profiles": "profiles",
    }


def test_the_package_list_is_every_folder_with_an_init():
    on_disk = {_package_of(init.parent) for init in _source_files("__init__.py")}
    listed = set(_setuptools()["packages"])
    assert on_disk == listed, f"missing from pyproject: {sorted(on_disk - listed)}; listed but absent: {sorted(listed - on_disk)}"


def test_package_data_covers_every_toml_and_tcss_file():
    data = _setuptools()["package-data"]
    files = [p for suffix in DATA_SUFFIXES for p in _source_files(f"*{suffix}")]
    assert any(p.suffix == ".tcss" for p in files) and any(p.suffix == ".toml" for p in files)
    uncovered = [
        str(p.relative_to(ROOT)) for p in files
        if not (p.parent / "__init__.py").exists()
        or not any(fnmatch.fnmatch(p.name, pat) for pat in data.get(_package_of(p.parent), []))
    ]
    assert not uncovered, f"not shipped in the wheel (pyproject's package-data, or the folder lacks __init__.py): {uncovered}"
