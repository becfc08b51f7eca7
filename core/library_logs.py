"""Log lines libraries print on import that tell a memlab user nothing, dropped, so that a one-line error stays one
line and a run's first screen is memlab's. Only these exact notices: every other record of those loggers passes.

    torch.utils._pytree  "<enum ...> is an Enum subclass ... register_constant() ... deprecated": torchao 0.18 registers
                         its enums with torch 2.13's pytree when transformers imports it (quantizers.auto, on every
                         transformers model), two lines each time
    torchao              "Failed to load .../_C_*.so": torchao's optional CUDA kernels, which a CPU build of torch
                         cannot load and memlab does not call
"""

from __future__ import annotations

import logging

KNOWN_NOTICES = (
    ("torch.utils._pytree", "%s is an Enum subclass"),
    ("torchao", "Failed to load "),
)


class _DropNotice(logging.Filter):
    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def drop_known_notices() -> None:
    """Filter KNOWN_NOTICES out of their loggers (once: calling again adds nothing)."""
    for name, start in KNOWN_NOTICES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) and f.start == start for f in logger.filters):
            logger.addFilter(_DropNotice(start))
