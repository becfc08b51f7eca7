"""attention.kernel / window: the technique door of memlab.core.attention (the kernels live there, one file each)."""

from memlab.core.attention import apply, check

__all__ = ["apply", "check"]
