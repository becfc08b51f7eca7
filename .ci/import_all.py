"""Import every module of the installed memlab package: each one the wheel holds and each one the source tree has.

    python import_all.py SOURCE_ROOT      # run from outside SOURCE_ROOT, by the Python the wheel is installed in

Run from outside the source tree (.ci/run does), so that `import memlab` finds the installed wheel: a module
left off pyproject's package list, or one that imports an optional package (flash-attn, torchao) at module
level, fails here."""

import importlib
import pkgutil
import sys
import sysconfig
import tomllib
from pathlib import Path

import memlab


def _check_installed() -> Path:
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    where = Path(memlab.__file__).resolve()
    if site not in where.parents:
        sys.exit(f"memlab was imported from {where}, not from the installed wheel in {site}")
    return site


def _source_modules(root: Path) -> set[str]:
    """Every .py file under pyproject's package-dir folders, as the dotted name it installs as."""
    package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    names = set()
    for package, folder in package_dir.items():
        for path in (root / folder).rglob("*.py"):
            parts = path.relative_to(root / folder).with_suffix("").parts
            names.add(".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)]))
    return names


def _wheel_modules() -> set[str]:
    def failed(name: str) -> None:
        raise ImportError(f"cannot import {name}") from sys.exc_info()[1]

    return {m.name for m in pkgutil.walk_packages(memlab.__path__, "memlab.", onerror=failed)} | {"memlab"}


site = _check_installed()
wheel, source = _wheel_modules(), _source_modules(Path(sys.argv[1]).resolve())
if source - wheel:
    sys.exit(f"in the source tree but not in the wheel: {sorted(source - wheel)} (pyproject.toml's packages)")
for name in sorted(wheel):
    importlib.import_module(name)
print(f"imported all {len(wheel)} modules of memlab from {site}")
