"""Sizes as people write them and as memlab shows them: one GiB formatter and one size parser for every view.

    gib(3 * 2**30)         -> "3.00 GiB"       (None -> "—")
    gib_number(3 * 2**30)  -> "3.00"           (a table cell whose header already says GiB)
    parse_size("24GiB")    -> 25769803776
"""

from __future__ import annotations

import re

from memlab.core.errors import ConfigError

GIB = 1024**3
MISSING = "—"  # a figure that was not measured

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def gib_number(n: float | None, digits: int = 2) -> str:
    """Bytes as GiB without the unit, e.g. "1.50"; "—" for None."""
    return MISSING if n is None else f"{n / GIB:.{digits}f}"


def gib(n: float | None, digits: int = 2) -> str:
    """Bytes as GiB with the unit, e.g. "1.50 GiB"; "—" for None."""
    return MISSING if n is None else f"{gib_number(n, digits)} GiB"


def parse_size(text: str, what: str = "--gpu-memory") -> int:
    """'24GiB', '40GB', '48G', '25769803776' -> bytes. K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; KB/MB/GB/TB
    powers of 1000 (so '40GB' is 40e9 bytes, 37.25 GiB); a bare number is bytes. `what` names the input in errors."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(f"{what} {text!r}: not a size; expected e.g. 24GiB, 40GB, 48G or a number of bytes")
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ConfigError(f"{what} {text!r}: unknown unit {m.group(2)!r}; use B, K/KiB, M/MiB, G/GiB, T/TiB (1024s) or KB, MB, GB, TB (1000s)")
    value = float(number) * _UNITS[unit]
    if value < 1:
        raise ConfigError(f"{what} {text!r}: must be more than zero")
    return int(value)
