"""Model families behind one seam (DESIGN.md 1a).

`gpt` is memlab's own GPT (memlab.core.model); `hf` is any causal LM the installed transformers knows, from a preset,
a config.json or a checkpoint folder. Each family has an adapter (memlab.core.models.family) that names what the
techniques need: the list of blocks, the final norm, the head, the embedding, a block's attention and MLP.

This package's __init__ imports nothing heavy: `shape` (the experiment's resolved shape, read from a preset or a
config.json) is used by config loading and by `memlab models`, which must answer without torch or transformers.
"""
