import pytest


def test_an_archived_run_folder_reads_its_gzipped_events(tmp_path):
    """Committed run folders keep events.jsonl gzipped: the study's frame reads the `started` event from either."""
    import gzip
    import json

    from memlab.core.runfolder import open_events
    from memlab.core.study.frame import started_event

    started = {"event": "started", "data": {"train_tokens": 1234}}
    with gzip.open(tmp_path / "events.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"event": "note"}) + "\n" + json.dumps(started) + "\n")
    assert started_event(tmp_path) == started
    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "started", "data": {}}) + "\n")
    with open_events(tmp_path) as f:  # the plain file wins where both exist (a live run folder)
        assert json.loads(f.readline())["data"] == {}


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_honour_the_umask_as_events_jsonl_does(umask, mode, tmp_path):
    """A colleague on a shared host reads run.json and the Parquet files as they read events.jsonl (issue 50)."""
    import os
    import stat

    import polars as pl

    from memlab.core.runfolder import atomic_write_json, atomic_write_parquet

    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "run.json", {"status": "finished"})
        atomic_write_parquet(tmp_path / "summary.parquet", pl.DataFrame({"a": [1]}))
        with open(tmp_path / "events.jsonl", "w") as f:  # what a plain open gives, for comparison
            f.write("{}\n")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"run.json": mode, "summary.parquet": mode, "events.jsonl": mode}
