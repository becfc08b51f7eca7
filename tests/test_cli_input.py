"""Input a new user gives by mistake (issue 20): refused in one line with exit 2, before any work, leaving no runs
folder and no cache lock file behind."""

from __future__ import annotations

import pytest

from memlab.core.config import MAX_STEPS

TINY = ["--experiment", "tiny", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))


def _files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{not json\n')
    (tmp_path / "list.jsonl").write_text('{"text": "fine"}\n[1, 2]\n')
    (tmp_path / "ext.toml").write_text('extends = "missing"\n')
    (tmp_path / "a_folder").mkdir()


CASES = [
    (["--steps", "0"], "--steps': must be at least 1, got 0 (to train by epochs, use --epochs"),
    (["--steps", "99999999999999999999"], "is too large"),
    (["--steps", str(MAX_STEPS + 1)], f"train.steps must be at most {MAX_STEPS:,}"),
    (["--set", "train.lr=inf"], "train.lr must be a finite number, got inf"),
    (["--set", "train.lr=nan"], "train.lr must be a finite number, got nan"),
    (["--set", "model.dropout=-inf"], "model.dropout must be a finite number"),
    (["--steps", "3", "--epochs", "1"], "--steps 3 and --epochs 1 both set the run's length; give one of them"),
    (["--runs-dir", ""], "--runs-dir': is empty; give a folder"),
    (["--data", "{tmp}/empty.jsonl"], "{tmp}/empty.jsonl is empty (0 bytes)"),
    (["--data", "{tmp}/bad.jsonl"], "{tmp}/bad.jsonl line 2: not valid JSON (Expecting property name"),
    (["--data", "{tmp}/list.jsonl"], "{tmp}/list.jsonl line 2: a JSON list, expected an object"),
    (["--data", "stdlib", "--streaming"], "--streaming (data.streaming) does not apply to the built-in stdlib corpus"),
]


@pytest.mark.parametrize("args, expect", CASES)
def test_refused_in_one_line_before_any_work(args, expect, tmp_path, capsys):
    from memlab.cli import main

    _files(tmp_path)
    runs = tmp_path / "runs"
    args = [a.format(tmp=tmp_path) for a in args]
    runs_dir = [] if "--runs-dir" in args else ["--runs-dir", str(runs)]
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--profile", "baseline", *TINY, *runs_dir, *args])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("memlab: error: ") and expect.format(tmp=tmp_path) in lines[0]
    assert not runs.exists()  # no empty runs folder
    assert not list((tmp_path / "cache").rglob("*.lock"))  # no 0-byte lock files


@pytest.mark.parametrize(
    "profile, expect",
    [
        ("{tmp}/ext.toml", "{tmp}/ext.toml: extends = 'missing': unknown profile 'missing'"),
        ("{tmp}/a_folder", "{tmp}/a_folder is a folder; a profile is a .toml file (or a built-in name: memlab profiles)"),
    ],
)
def test_profile_mistakes_name_the_file(profile, expect, tmp_path, capsys):
    from memlab.cli import main

    _files(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--profile", profile.format(tmp=tmp_path), *TINY, "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.strip().count("\n") == 0 and expect.format(tmp=tmp_path) in err, err


def test_sweep_checks_every_value_before_making_the_runs_folder(tmp_path, capsys):
    from memlab.cli import main

    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--profiles", "baseline,bf16", *TINY, "--runs-dir", str(runs), "--set", "train.lr=inf"])
    assert exit_.value.code == 2 and "train.lr must be a finite number" in capsys.readouterr().err
    assert not runs.exists()


def test_a_finished_build_leaves_no_lock_file(tmp_path):
    from memlab.core.data import cache

    with cache.locked("entry"):
        assert (cache.tokens_dir() / ".entry.lock").exists()
    assert not (cache.tokens_dir() / ".entry.lock").exists()
    with cache.locked("entry"):  # and the lock can be taken again
        pass


def test_another_corpus_resets_how_the_old_one_was_read():
    """--data replaces the corpus: a recipe's streamed Hub split does not follow it onto the stdlib corpus."""
    from memlab.cli.options import data_overrides

    items = data_overrides("stdlib", None, "bpe:8192", None, None, None, None)
    assert items.index('data.split="train"') < items.index('data.source="stdlib"')
    assert "data.streaming=false" in items
    assert data_overrides("hf:x", None, None, True, None, None, None)[-1] == "data.streaming=true"  # given again: kept
    assert not any(i.startswith(("data.split", "data.streaming")) for i in data_overrides(None, None, "bpe:8192", None, None, None, None))


def test_a_refused_run_takes_back_the_events_file_and_folders_it_made(tmp_path, capsys):
    from memlab.cli import main

    kept = tmp_path / "kept.jsonl"
    kept.write_text("")  # the user's own file: left alone even though empty
    for events in (tmp_path / "new" / "dir" / "ev.jsonl", kept):
        with pytest.raises(SystemExit) as exit_:
            main(["run", "--profile", "tf32", "--device", "cpu", "--experiment", "tiny", "--runs-dir", str(tmp_path / "runs"), "--events", str(events)])
        assert exit_.value.code == 2 and "tf32 needs CUDA" in capsys.readouterr().err
    assert not (tmp_path / "new").exists() and kept.exists() and not (tmp_path / "runs").exists()


def test_a_transformers_models_refusal_is_one_line_though_transformers_imports_torchao(tmp_path):
    """transformers imports torchao where it is installed, and torchao 0.18 under torch 2.13 logs two pytree notices
    (and, on a CPU build, a line per CUDA kernel it cannot load) to stderr: the refusal after them was one line of
    three or five. In a fresh process with an empty cache, as a newcomer meets it, stderr is the refusal alone."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed")
    env = dict(os.environ, MEMLAB_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "memlab", "estimate", "--experiment", "llama-1b", "--profile", "bf16",
                           "--gpu-memory", "2GiB"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith("memlab: error: the weights need")


def test_only_the_known_library_notices_are_dropped():
    import logging

    from memlab.core.library_logs import drop_known_notices

    drop_known_notices()
    drop_known_notices()  # once is enough: no second filter
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    for name in ("torch.utils._pytree", "torchao"):
        logger = logging.getLogger(name)
        assert len(logger.filters) == 1
        logger.addHandler(handler := Keep())
        try:
            logger.warning("%s is an Enum subclass and is now natively supported", "<enum 'X'>")
            logger.warning("Failed to load /x/_C_cutlass_90a.abi3.so: Could not load this library")
            logger.warning("something else")
        finally:
            logger.removeHandler(handler)
    # each logger loses its own notice only
    assert seen == ["Failed to load /x/_C_cutlass_90a.abi3.so: Could not load this library", "something else",
                    "<enum 'X'> is an Enum subclass and is now natively supported", "something else"]


@pytest.mark.parametrize("args, expect", [
    (["estimate", "--profile", "bf16", "--format", "csv"], "--format 'csv' is not valid here; choose table or json"),
    (["find-batch", "--profile", "bf16", "--format", "markdown"], "--format 'markdown' is not valid here"),
    (["fit", "--profiles", "bf16", "--json", "--format", "csv"], "--json and --format csv ask for two formats; give one"),
    (["table", "{tmp}", "--json", "--format", "markdown"], "--json and --format markdown ask for two formats; give one"),
])
def test_json_is_asked_the_same_way_of_every_command_or_refused_in_one_line(args, expect, tmp_path, capsys):
    """estimate and find-batch print JSON with --json, fit and table with --format json: each takes the other's
    spelling too, and a format it does not write is refused before any work."""
    from memlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([a.format(tmp=tmp_path) for a in args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error: ") and expect in lines[0], lines


def test_estimate_prints_json_under_either_spelling(capsys):
    import json

    from memlab.cli import main

    printed = []
    for spelling in (["--json"], ["--format", "json"]):
        main(["estimate", "--experiment", "tiny", "--profile", "bf16", "--method", "analytic", *spelling])
        printed.append(json.loads(capsys.readouterr().out))
    assert printed[0] == printed[1] and printed[0]["profile"] == "bf16"
