"""Data: corpora, tokenizers, the token cache, and the batches the engine trains on.

    load_tokens(cfg)        DataConfig -> TokenData (train / val token arrays, vocab size, EOS id), cached on disk
    steps_per_epoch(...)    optimizer steps that cover every training token once
    batch_iterator(...)     per-step lists of (x, y) micro-batches, shuffled per epoch, split across ranks
    val_batches(...)        the fixed validation slice as (x, y) batches

One job per module: sources (where documents come from), stdlib (the built-in corpus), hub (Hub access that fails
fast offline), tokenizer (train / load), cache (the on-disk entries), tokens (load_tokens), batches.
"""

from memlab.core.data.batches import batch_iterator, n_windows, steps_per_epoch, val_batches
from memlab.core.data.cache import cache_root
from memlab.core.data.tokens import TokenData, cache_entry, holdout_warning, is_cached, load_tokens

__all__ = [
    "TokenData",
    "batch_iterator",
    "cache_entry",
    "cache_root",
    "holdout_warning",
    "is_cached",
    "load_tokens",
    "n_windows",
    "steps_per_epoch",
    "val_batches",
]
