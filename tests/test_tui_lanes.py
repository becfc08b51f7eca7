"""The TUI's Lanes view (tui/widgets/lanes_view.py): one row per busy GPU lane, read from the run folders of a
multi-GPU sweep; hidden while fewer than two runs are live."""

from __future__ import annotations

import json
import os
import time

from textual.app import App, ComposeResult

from memlab.tui.widgets.lanes_view import LanesView, busy_lanes


def _live_run(root, name: str, gpu: str | None, step: int, status: str = "running", age_s: float = 0.0):
    d = root / f"20260102-090000-{name}-beef"
    d.mkdir(parents=True)
    env = {"gpu_index": gpu} if gpu is not None else {}
    (d / "run.json").write_text(json.dumps({"schema_version": 1, "status": status, "profile": {"name": name},
                                            "device": "cuda" if gpu else "cpu", "environment": env}))
    events = [{"event": "started", "t": 1.0, "run_dir": str(d), "total_steps": 300}]
    events += [{"event": "step", "t": 2.0 + i, "step": i, "tokens_per_s": 51000.0} for i in range(step)]
    events += [{"event": "gpu_sample", "t": 9.0, "used_bytes": 1}] * 400  # the step events are not the last lines
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if age_s:
        old = time.time() - age_s
        os.utime(d / "events.jsonl", (old, old))
    return d


def test_busy_lanes_lists_each_live_run_by_its_gpu(tmp_path):
    _live_run(tmp_path, "gradcp_bf16", "2", 120)
    _live_run(tmp_path, "bf16", "0", 40)
    _live_run(tmp_path, "fsdp_bf16", "1,3", 7)
    _live_run(tmp_path, "sac_ops", "1", 5, status="finished")  # ended: not live
    _live_run(tmp_path, "baseline", "3", 5, age_s=120)  # running, but silent for two minutes: killed
    rows = busy_lanes(tmp_path)
    assert [(r.lane, r.profile, r.step, r.total_steps) for r in rows] == [
        ("gpu 0", "bf16", 40, 300), ("gpu 2", "gradcp_bf16", 120, 300), ("gpus 1,3", "fsdp_bf16", 7, 300)]
    assert str(rows[0].text()).startswith("gpu 0     bf16 · step 40/300 · 51,000 tok/s · 20260102-090000-bf16-beef")
    assert busy_lanes(tmp_path / "no-such-folder") == []


class _Host(App):
    def __init__(self, runs_dir):
        super().__init__()
        self.runs_dir = str(runs_dir)

    def compose(self) -> ComposeResult:
        yield LanesView()


async def test_the_view_shows_only_while_two_runs_are_live(tmp_path):
    app = _Host(tmp_path)
    async with app.run_test(size=(80, 12)) as pilot:
        view = app.query_one(LanesView)
        view.poll()
        await pilot.pause()
        assert not view.has_class("-busy") and view.rows == []
        _live_run(tmp_path, "bf16", "0", 3)
        view.poll()
        assert not view.has_class("-busy")  # one run: the Live panel says it all
        _live_run(tmp_path, "gradcp_bf16", "1", 9)
        view.poll()
        await pilot.pause()
        assert view.has_class("-busy") and [r.lane for r in view.rows] == ["gpu 0", "gpu 1"]
        assert view.border_subtitle == "2 busy"
