"""`memlab data prepare`: tokenizes once, reports the cache entry; a second call is a cache hit; errors are one line."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from data_helpers import sentences, write_jsonl
from memlab.cli import data as data_cli
from memlab.core.errors import DataError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "memlab-cache"))


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()
    data_cli.register(app)

    @app.callback()
    def _root() -> None:  # keep `data` a sub-command even with one group
        pass

    return app


def test_prepare_then_cache_hit(app, tmp_path):
    f = write_jsonl(tmp_path / "posts.jsonl", [{"Id": i, "Body": t} for i, t in enumerate(sentences(30))])
    args = ["data", "prepare", "--data", str(f), "--text-field", "Body", "--tokenizer", "bpe:300", "--val-tokens", "64"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    out = first.stdout
    assert f"{f} (30 documents)" in out and "bpe:300 (trained on posts.jsonl)" in out and "vocab 300" in out
    assert "in 30 documents" in out and " 64 val" in out and "uint16" in out
    assert "cache hit  no" in out and "posts.jsonl-bpe300-" in out
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0 and "cache hit  yes" in second.stdout


def test_prepare_reports_too_small_for_the_default_val_slice(app, tmp_path):
    f = write_jsonl(tmp_path / "posts.jsonl", [{"Body": "short"}])
    result = CliRunner().invoke(app, ["data", "prepare", "--data", str(f), "--text-field", "Body", "--tokenizer", "bpe:300"])
    # auto on CPU is `tiny`, as for `memlab run`: its val slice of 4,096 tokens
    assert isinstance(result.exception, DataError) and "data.val_tokens=4096" in str(result.exception)
    assert "(1 document)" in str(result.exception)


def test_prepare_and_run_resolve_auto_alike_so_the_cache_is_reused(app, tmp_path):
    from memlab.cli.options import resolve
    from memlab.core.data import cache_entry

    f = write_jsonl(tmp_path / "posts.jsonl", [{"text": t} for t in sentences(400)])
    result = CliRunner().invoke(app, ["data", "prepare", "--data", str(f), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert f"{f} (300 of 400 documents; data.max_docs=300, 0 = all)" in result.stdout
    exp, _ = resolve("auto", "baseline", "cpu", [f'data.source="{f}"'])
    assert cache_entry(exp.data)[2] in result.stdout  # the entry `memlab run` would look up


def test_prepare_warns_when_validation_is_most_of_the_corpus(app, tmp_path):
    f = write_jsonl(tmp_path / "posts.jsonl", [{"text": t} for t in sentences(30)])
    result = CliRunner().invoke(app, ["data", "prepare", "--data", str(f), "--tokenizer", "bpe:300", "--val-tokens", "2000"])
    assert result.exit_code == 0, result.output
    assert "warning validation holds out" in result.stderr and "smaller data.val_tokens" in result.stderr


@pytest.mark.parametrize("flag", [["--streaming"], ["--split", "test"]])
def test_prepare_refuses_knobs_stdlib_does_not_have(app, flag):
    result = CliRunner().invoke(app, ["data", "prepare", "--data", "stdlib", *flag])
    assert isinstance(result.exception, DataError) and "does not apply to the built-in stdlib corpus" in str(result.exception)


@pytest.mark.parametrize("args, expect", [
    (["--max-docs", "-1"], "Invalid value for '--max-docs': must be 0 (= every document) or more, got -1"),
    (["--val-tokens", "0"], "Invalid value for '--val-tokens': must be at least 1, got 0"),  # the flag, not "--set:" (issue 50)
])
def test_prepare_starts_from_an_experiment_and_validates_options(args, expect, capsys):
    from memlab.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["data", "prepare", "--experiment", "tiny", *args])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("memlab: error: ") and expect in err and "\n" not in err


def test_memlab_main_prints_one_line_and_exits_2(tmp_path, capsys):
    from memlab.cli import main

    f = write_jsonl(tmp_path / "posts.jsonl", [{"Id": 1, "Body": "hello"}])
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "prepare", "--data", str(f), "--text-field", "body", "--tokenizer", "bpe:300"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memlab: error: ") and "has no field 'body'; its fields: Id, Body" in err
    assert "\n" not in err


def test_list_shows_entries_and_rm_removes_them(app, tmp_path):
    f = write_jsonl(tmp_path / "posts.jsonl", [{"text": t} for t in sentences(30)])
    assert CliRunner().invoke(app, ["data", "prepare", "--data", str(f), "--tokenizer", "bpe:300", "--val-tokens", "64"]).exit_code == 0
    listed = CliRunner().invoke(app, ["data", "list"])
    assert listed.exit_code == 0 and "posts.jsonl-bpe300-" in listed.stdout and "bpe:300 (trained on posts.jsonl)" in listed.stdout
    assert "KiB" in listed.stdout and "1 entry" in listed.stdout and str(tmp_path / "memlab-cache") in listed.stdout
    key = next(w for w in listed.stdout.split() if w.startswith("posts.jsonl-bpe300-"))
    unknown = CliRunner().invoke(app, ["data", "rm", "nope"])
    assert isinstance(unknown.exception, DataError) and f"'nope' is not in the cache; entries: {key}" in str(unknown.exception)
    removed = CliRunner().invoke(app, ["data", "rm", "posts"])  # a unique prefix
    assert removed.exit_code == 0 and removed.stdout.startswith(f"removed {key}")
    assert not (tmp_path / "memlab-cache" / "tokens" / key).exists()
    assert not list((tmp_path / "memlab-cache").rglob("*.lock"))
    assert "token cache is empty" in CliRunner().invoke(app, ["data", "list"]).stdout


def test_rm_needs_keys_or_all(app, tmp_path):
    from memlab.core.errors import MemlabError

    result = CliRunner().invoke(app, ["data", "rm"])
    assert isinstance(result.exception, MemlabError) and "or --all" in str(result.exception)
    f = write_jsonl(tmp_path / "posts.jsonl", [{"text": t} for t in sentences(30)])
    CliRunner().invoke(app, ["data", "prepare", "--data", str(f), "--tokenizer", "bpe:300", "--val-tokens", "64"])
    everything = CliRunner().invoke(app, ["data", "rm", "--all"])
    assert everything.exit_code == 0 and everything.stdout.count("removed ") == 1
