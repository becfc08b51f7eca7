

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
