"""Kept answers of `memlab estimate` and `memlab fit` (memlab.core.answers): a question asked again on a machine
without a GPU is answered before torch is imported, word for word; another input, or a GPU, asks the predictor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.cli import main
from memlab.core import answers

ESTIMATE = ["estimate", "--profile", "gradcp_bf16", "--experiment", "tiny", "--method", "analytic"]
# A model whose weights alone exceed the card: its fit row is quick to predict (nothing to search).
FIT = ["fit", "--experiment", "tiny", "--profiles", "bf16", "--gpu-memory", "2GiB", "--format", "markdown",
       "--set", "model.d_model=4096"]
SHOWN = {"COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""}  # the same output settings in this process and the child's


@pytest.fixture
def kept(tmp_path, monkeypatch) -> Path:
    """Answers kept in a cache of this test's own, in this process (the first asking) and in children."""
    cache = tmp_path / "cache"
    for name, value in {**SHOWN, "MEMLAB_CACHE": str(cache), answers.SWITCH_ENV: "on"}.items():
        monkeypatch.setenv(name, value)
    return cache


def ask(args: list[str], capsys) -> tuple[int, str, str]:
    """The command in this process (torch is imported here already): exit status, stdout, stderr."""
    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def child_without_torch(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """The command in a child whose `torch` package fails to import."""
    folder = tmp_path / "no-torch"
    (folder / "torch").mkdir(parents=True, exist_ok=True)
    (folder / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "memlab", *args], capture_output=True, text=True, env=env, timeout=120)


def test_an_estimate_asked_again_is_answered_without_torch(kept, tmp_path, capsys):
    code, first, err = ask(ESTIMATE, capsys)
    assert code == 0, err
    assert "gradcp_bf16 · tiny" in first and list((kept / answers.FOLDER).glob("*.json"))
    again = child_without_torch(ESTIMATE, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first
    # another input is another question: the predictor runs (and here cannot, without torch)
    other = child_without_torch([*ESTIMATE, "--set", "model.n_layer=3"], tmp_path)
    assert other.returncode != 0 and "torch was imported" in other.stderr


def test_a_fit_asked_again_is_answered_without_torch(kept, tmp_path, capsys):
    code, first, err = ask(FIT, capsys)
    assert code == 0, err
    assert "| bf16 |" in first and "the weights alone need" in first
    again = child_without_torch(FIT, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first
    # files asked for: computed every time (here: torch is needed again)
    out = child_without_torch([*FIT, "--out", str(tmp_path / "rows.parquet")], tmp_path)
    assert out.returncode != 0 and "torch was imported" in out.stderr


def test_a_refused_input_keeps_no_answer(kept, capsys):
    code, _, err = ask([*ESTIMATE, "--nproc", "0"], capsys)
    assert code == 2 and "--nproc must be at least 1" in err
    assert not (kept / answers.FOLDER).exists()


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
    monkeypatch.setattr(answers, "installed_version", lambda d: "9.9.9")
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
