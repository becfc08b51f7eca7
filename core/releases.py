"""Library releases, read without importing the libraries: the releases the predictor's stand-ins were read from,
and what is installed here. No torch: the planning commands' kept answers (memlab.core.answers) are keyed by these
before torch is imported; memlab.core.predict.calibration keys its knowledge by them too."""

from __future__ import annotations

import importlib.metadata

# The library releases whose source the stand-ins (memlab.core.predict.standins, the analytic formula) were read
# from: another release may allocate otherwise.
LIBRARIES: dict[str, str] = {
    "torchao": "0.18.0", "bitsandbytes": "0.50.2", "liger-kernel": "0.8.5", "cut-cross-entropy": "25.1.1",
    "galore-torch": "1.0", "flash-attn-4": "4.0.0b36",
}


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
