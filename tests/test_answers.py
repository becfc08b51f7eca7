"""Kept answers of `memlab estimate` and `memlab fit` (memlab.core.answers): a question asked again on a machine
without a GPU is answered before torch is imported, word for word; another input, or a GPU, asks the predictor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.core import answers

ESTIMATE = ["estimate", "--profile", "gradcp_bf16", "--experiment", "tiny", "--method", "analytic"]


def memlab(args: list[str], cache: Path, *, no_torch: Path | None = None) -> subprocess.CompletedProcess:
    """A child with answers kept in `cache`; `no_torch`: a folder whose `torch` package fails to import."""
    env = {**os.environ, "MEMLAB_CACHE": str(cache), "MEMLAB_ANSWERS": "on", "CUDA_VISIBLE_DEVICES": "", "COLUMNS": "200"}
    if no_torch is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(no_torch), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "memlab", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def no_torch(tmp_path) -> Path:
    folder = tmp_path / "no-torch"
    (folder / "torch").mkdir(parents=True)
    (folder / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    return folder


@pytest.mark.slow
def test_an_estimate_asked_again_is_answered_without_torch(tmp_path, no_torch):
    cache = tmp_path / "cache"
    first = memlab(ESTIMATE, cache)
    assert first.returncode == 0, first.stderr
    assert "gradcp_bf16 · tiny" in first.stdout and list((cache / answers.FOLDER).glob("*.json"))
    again = memlab(ESTIMATE, cache, no_torch=no_torch)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    # another input is another question: the predictor runs (and here cannot, without torch)
    other = memlab([*ESTIMATE, "--set", "model.n_layer=3"], cache, no_torch=no_torch)
    assert other.returncode != 0 and "torch was imported" in other.stderr


@pytest.mark.slow
def test_a_fit_asked_again_is_answered_without_torch(tmp_path, no_torch):
    # a model whose weights alone exceed the card: its row is quick to predict (nothing to search)
    fit = ["fit", "--experiment", "tiny", "--profiles", "bf16", "--gpu-memory", "2GiB", "--format", "markdown",
           "--set", "model.d_model=4096"]
    first = memlab(fit, tmp_path / "cache")
    assert first.returncode == 0, first.stderr
    assert "| bf16 |" in first.stdout and "the weights alone need" in first.stdout
    again = memlab(fit, tmp_path / "cache", no_torch=no_torch)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    # files asked for: computed every time (here: torch is needed again)
    out = memlab([*fit, "--out", str(tmp_path / "rows.parquet")], tmp_path / "cache", no_torch=no_torch)
    assert out.returncode != 0 and "torch was imported" in out.stderr


@pytest.mark.slow
def test_a_refused_input_keeps_no_answer_and_is_refused_again(tmp_path):
    cache = tmp_path / "cache"
    bad = [*ESTIMATE, "--nproc", "0"]
    for _ in range(2):
        r = memlab(bad, cache)
        assert r.returncode == 2 and "--nproc must be at least 1" in r.stderr
    assert not (cache / answers.FOLDER).exists()


def test_no_answer_is_kept_where_a_gpu_may_be_or_when_switched_off(monkeypatch):
    monkeypatch.setenv(answers.SWITCH_ENV, "on")
    monkeypatch.setattr(answers, "gpu_visible", lambda: True)
    assert not answers.kept_here()
    monkeypatch.setattr(answers, "gpu_visible", lambda: False)
    assert answers.kept_here()
    monkeypatch.setenv(answers.SWITCH_ENV, "off")
    assert not answers.kept_here()


def test_the_key_follows_the_inputs_the_releases_and_the_source(tmp_path, monkeypatch):
    base = answers.key("estimate", {"a": 1})
    assert answers.key("estimate", {"a": 1}) == base
    assert answers.key("estimate", {"a": 2}) != base and answers.key("fit", {"a": 1}) != base
    monkeypatch.setattr(answers, "_version", lambda d: "9.9.9")
    assert answers.key("estimate", {"a": 1}) != base
    monkeypatch.undo()
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.py").write_text("x = 1\n")
    before = answers.key("estimate", {"a": 1}, (src,))
    (src / "m.py").write_text("x = 2\n")
    assert answers.key("estimate", {"a": 1}, (src,)) != before


def test_a_torn_or_foreign_file_is_no_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    answers.write("k", "page\n")
    assert answers.read("k") == {"stdout": "page\n"}
    (tmp_path / answers.FOLDER / "k.json").write_text("{not json")
    assert answers.read("k") is None
    (tmp_path / answers.FOLDER / "k.json").write_text('["a list"]')
    assert answers.read("k") is None
