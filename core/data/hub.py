"""Hugging Face Hub access that fails fast offline.

Left alone, `datasets` and `huggingface_hub` retry an unreachable Hub five times with back-off (about 23 s) before
they give up. memlab asks first: offline requested (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE / TRANSFORMERS_OFFLINE), or
the Hub (or the HTTPS proxy) not answering a TCP connect within a few seconds. When offline, the libraries are put in
their own offline mode for the call, so a dataset or tokenizer in the local cache still loads and anything else raises
at once.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

_TRUE = {"1", "ON", "YES", "TRUE"}
PROBE_TIMEOUT_S = 3.0
_reachable: dict[tuple[str, int], bool] = {}


def offline_requested() -> bool:
    return any(os.environ.get(v, "").upper() in _TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _probe_target() -> tuple[str, int]:
    proxy = next((os.environ[v] for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy") if os.environ.get(v)), None)
    url = urlparse(proxy if proxy and "://" in proxy else f"http://{proxy}" if proxy else os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the Hub (or the proxy) opens within `timeout` seconds; asked once per process.
    The connect runs in a daemon thread so that a hanging DNS lookup cannot hold the caller past the timeout."""
    target = _probe_target()
    if target not in _reachable:
        result: list[bool] = []

        def probe() -> None:
            try:
                socket.create_connection(target, timeout=timeout).close()
                result.append(True)
            except OSError:
                result.append(False)

        thread = threading.Thread(target=probe, daemon=True, name="memlab-hub-probe")
        thread.start()
        thread.join(timeout + 0.5)
        _reachable[target] = bool(result and result[0])
    return _reachable[target]


def is_offline() -> bool:
    return offline_requested() or not hub_reachable()


@contextmanager
def offline_mode(on: bool = True) -> Iterator[None]:
    """Put huggingface_hub and datasets in offline mode for the block (they read the flag at import time, so the
    module constants are patched as well as the environment); restored afterwards."""
    if not on:
        yield
        return
    import huggingface_hub.constants as hub_constants

    saved_env = {v: os.environ.get(v) for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    patches = [(hub_constants, "HF_HUB_OFFLINE")]
    ds_config = sys.modules.get("datasets.config")
    if ds_config is not None:
        patches += [(ds_config, n) for n in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if hasattr(ds_config, n)]
    saved = [(mod, name, getattr(mod, name)) for mod, name in patches]
    try:
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
        for mod, name, _ in saved:
            setattr(mod, name, True)
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)
        for v, value in saved_env.items():
            if value is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = value


def offline_reason() -> str:
    if offline_requested():
        return "offline mode is set (HF_HUB_OFFLINE)"
    host, port = _probe_target()
    return f"{host}:{port} cannot be reached (no network?)"


def one_line(e: BaseException, limit: int = 240) -> str:
    """An exception as one short line: its class and the first line of its message."""
    text = " ".join(str(e).split()) or e.__class__.__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
