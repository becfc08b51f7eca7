"""Tokenizers: a byte-level BPE trained on the corpus (bpe:N), a tokenizer.json file, or a Hub tokenizer (hf:NAME).

All three are `tokenizers.Tokenizer` objects. Every document is followed by one end-of-sequence token: the
tokenizer's own (from tokenizer_config.json when there is one, else a usual name such as </s>), or an added
<|endoftext|> when it has none, which then counts in the vocabulary size.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from memlab.core.data import hub
from memlab.core.errors import DataError

EOS = "<|endoftext|>"
_EOS_NAMES = (EOS, "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "[SEP]")
BPE_MIN_VOCAB = 257  # the 256 byte symbols + the end-of-sequence token
BPE_TRAIN_CHARS = 1 << 30  # train on at most the first 2**30 characters (memory); the whole corpus is still encoded
TOKENIZER_HELP = "use bpe:N (train a byte-level BPE of N tokens), a path to a tokenizer.json, or hf:NAME"


@dataclass
class TokenizerSpec:
    kind: str  # bpe | file | hf
    text: str  # as given
    vocab: int = 0  # bpe: the requested size
    path: Path | None = None  # file
    repo: str = ""  # hf
    key: dict | None = None  # identifies the tokenizer in the token cache key

    @property
    def trains(self) -> bool:
        return self.kind == "bpe"


def parse_tokenizer(spec: str) -> TokenizerSpec:
    text = spec.strip()
    if text.startswith("bpe:"):
        try:
            n = int(text[4:])
        except ValueError:
            n = -1
        if not BPE_MIN_VOCAB <= n < 2**32:
            raise DataError(f"tokenizer {spec!r}: N must be an integer of at least {BPE_MIN_VOCAB} (256 bytes + EOS), e.g. bpe:8192")
        return TokenizerSpec("bpe", text, vocab=n, key={"kind": "bpe", "vocab": n, "train_chars": BPE_TRAIN_CHARS})
    if text.startswith("hf:"):
        repo = text[3:].strip()
        if not repo or " " in repo:
            raise DataError(f"tokenizer {spec!r}: expected hf:NAME, e.g. hf:gpt2 or hf:OWNER/NAME")
        return TokenizerSpec("hf", text, repo=repo, key={"kind": "hf", "name": repo})
    path = Path(text).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"tokenizer {spec!r} not found: {TOKENIZER_HELP}")
    try:
        digest = hashlib.sha256(path.read_bytes())
        config = path.parent / "tokenizer_config.json"  # may name the EOS token: part of what the tokens mean
        if config.is_file():
            digest.update(b"\0" + config.read_bytes())
    except OSError as e:
        raise DataError(f"cannot read tokenizer file {path}: {e.strerror}") from None
    return TokenizerSpec("file", text, path=path, key={"kind": "file", "sha256": digest.hexdigest()})


# ---------------------------------------------------------------------------------------------- building


def train_bpe(texts: Iterable[str], vocab_size: int, progress: Callable[[int], None] | None = None) -> Any:
    """A byte-level BPE (GPT-2 style: any text encodes, nothing is unknown) of `vocab_size` tokens, EOS = id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def budget() -> Iterator[str]:
        used = 0
        for i, t in enumerate(texts, 1):
            yield t
            used += len(t)
            if progress:
                progress(i)
            if used >= BPE_TRAIN_CHARS:
                return

    tok.train_from_iterator(budget(), trainer=trainer)
    return tok


def _from_file(path: Path) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise DataError(f"tokenizer file {path} does not parse as a tokenizers tokenizer.json ({hub.one_line(e, 120)})") from None


def _eos_from_config(config: Path | None) -> str | None:
    """The eos_token named in a transformers tokenizer_config.json, if any."""
    if config is None or not config.is_file():
        return None
    try:
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def _from_hub(repo: str) -> tuple[Any, str | None]:
    from tokenizers import Tokenizer

    offline = hub.is_offline()
    try:
        with hub.offline_mode(offline):
            tok = Tokenizer.from_pretrained(repo)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001
        if offline:
            raise DataError(
                f"tokenizer hf:{repo} is not in the local Hugging Face cache and the Hub is unavailable: "
                f"{hub.offline_reason()}; run once with network, or use bpe:N or a tokenizer.json"
            ) from None
        raise DataError(f"tokenizer hf:{repo}: cannot load its tokenizer.json ({hub.one_line(e, 160)})") from None
    config = None
    try:
        from huggingface_hub import hf_hub_download

        with hub.offline_mode(offline):
            config = Path(hf_hub_download(repo, "tokenizer_config.json"))
    except Exception:  # noqa: BLE001
        pass  # no config: fall back on the usual EOS names
    return tok, _eos_from_config(config)


def with_eos(tok: Any, named: str | None) -> tuple[Any, int, bool]:
    """(tokenizer, eos id, whether an EOS token had to be added)."""
    for name in ([named] if named else []) + list(_EOS_NAMES):
        tid = tok.token_to_id(name)
        if tid is not None:
            return tok, tid, False
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(EOS, special=True)])
    return tok, tok.token_to_id(EOS), True


def load_tokenizer(spec: TokenizerSpec) -> tuple[Any, int, str]:
    """A file or Hub tokenizer -> (tokenizer, eos id, description)."""
    if spec.kind == "file":
        assert spec.path is not None
        tok, named, label = _from_file(spec.path), _eos_from_config(spec.path.parent / "tokenizer_config.json"), str(spec.path)
    elif spec.kind == "hf":
        (tok, named), label = _from_hub(spec.repo), f"hf:{spec.repo}"
    else:
        raise ValueError(spec.kind)
    tok, eos, added = with_eos(tok, named)
    eos_name = tok.id_to_token(eos)
    extra = f", {eos_name} added as EOS" if added else f", EOS {eos_name}"
    return tok, eos, f"{label} ({vocab_size(tok)} tokens{extra})"


def vocab_size(tok: Any) -> int:
    return int(tok.get_vocab_size(with_added_tokens=True))


# ---------------------------------------------------------------------------------------------- storage


def token_dtype(vocab: int, requested: str | None = None) -> np.dtype:
    """uint16 when every id fits (vocab <= 65,536), else uint32; a requested dtype too small is a DataError."""
    if vocab < 1:
        raise DataError(f"tokenizer vocabulary is empty ({vocab} tokens)")
    choices = {"uint16": 2**16, "uint32": 2**32}
    if requested is not None:
        if requested not in choices:
            raise DataError(f"token dtype {requested!r} is not valid; choose one of: {', '.join(choices)}")
        if vocab > choices[requested]:
            raise DataError(f"vocabulary of {vocab} tokens does not fit {requested} (at most {choices[requested]}); use uint32")
        return np.dtype(requested)
    if vocab > choices["uint32"]:
        raise DataError(f"vocabulary of {vocab} tokens does not fit uint32 (at most {choices['uint32']})")
    return np.dtype("uint16" if vocab <= choices["uint16"] else "uint32")
