"""The snapshot classifier (memlab.core.predict.fake.classify) knows memlab's own frames by module, not by a path
spelled out: `pip install -e .` keeps the engine in a top-level core/, a wheel in site-packages/memlab/core/."""

from __future__ import annotations

import pytest

from memlab.core import memsnapshot as M

EDITABLE = "/home/me/src/checkout/core/"
WHEEL = "/home/me/.venv/lib/python3.11/site-packages/memlab/core/"


def _frames(filename: str, name: str = "forward") -> list[dict]:
    return [{"filename": filename, "name": name, "line": 1}]


def _layout(root: str):
    """A resolver that puts memlab.core's modules under `root`, as that install would."""

    def source_of(module: str) -> str:
        rel = module.removeprefix("memlab.core.").replace(".", "/")
        return root + rel + ("/" if rel in ("attention", "techniques") else ".py")

    return source_of


def _clear_resolved_paths() -> None:
    M._optim_files.cache_clear()
    M._step_files.cache_clear()


@pytest.fixture
def fresh_paths():
    _clear_resolved_paths()
    yield
    _clear_resolved_paths()


@pytest.mark.parametrize("root", [EDITABLE, WHEEL], ids=["editable", "wheel"])
def test_each_layout_classifies_memlab_frames(root, monkeypatch, fresh_paths):
    monkeypatch.setattr(M, "_source_of", _layout(root))
    for file in ("model.py", "loss.py", "attention/sdpa.py", "techniques/checkpointing.py"):
        assert M.classify(_frames(root + file), None, False, True) == "activations", file
    assert M.classify(_frames(root + "optim.py", "build_optimizer"), None, True, True) == "optimizer_state"
    assert M.classify(_frames(root + "techniques/optim_offload.py", "step"), None, True, True) == "optimizer_state"
    other = WHEEL if root == EDITABLE else EDITABLE  # another install's (or library's) core/model.py is not ours
    assert M.classify(_frames(other + "model.py"), None, False, True) == "other"


def test_the_installed_files_are_found_by_module(fresh_paths):
    from memlab.core import loss, model, optim
    from memlab.core.techniques import optim_offload

    assert M.classify(_frames(model.__file__), None, False, True) == "activations"
    assert M.classify(_frames(loss.__file__), None, False, True) == "activations"
    assert M.classify(_frames(optim.__file__), None, True, True) == "optimizer_state"
    assert M.classify(_frames(optim_offload.__file__), None, True, True) == "optimizer_state"
    assert M.classify(_frames("/elsewhere/memlab/core/engine.py", "_train"), None, False, True) == "other"


def test_the_recorder_drops_free_stacks_while_backward_runs_and_puts_backward_back(monkeypatch):
    """--memory-snapshot records frees without their Python stacks during backward: with them, recomputing a
    checkpointed block failed the run on an H100 (bench/snapshot_stop_probe.py). The recorder is torch's, mocked here;
    the backward is a real one on the CPU, and torch.autograd.backward is torch's own again once recording stops."""
    import torch

    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", context="all", **_: calls.append(context if enabled else None))
    own = torch.autograd.backward
    sink = M.SnapshotSink(torch.device("cuda"))
    w = torch.ones(3, requires_grad=True)
    (w * 2).sum().backward()
    sink.close()
    (w * 2).sum().backward()  # after recording: no more calls
    assert calls == ["all", "alloc", "all", None]
    assert torch.autograd.backward is own
    assert w.grad.tolist() == [4.0, 4.0, 4.0]
