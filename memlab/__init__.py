"""memlab: a bench for memory-efficient transformer training."""

__version__ = "0.1.0"
