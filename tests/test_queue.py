"""The one queue supervisor (memlab.core.queue): an outcome for every item whatever its child or a callback does;
cancel ends the running item and the queue goes on; stop ends it and skips the rest. Fake children, no torch."""

from __future__ import annotations

from fake_children import fake_spec

from memlab.core.queue import ChildQueue

BAD = ["refuses_after_started", "sigkilled", "garbage", "unstartable", "silent_exit_0", "oom"]


def test_the_queue_goes_on_after_each_bad_item_and_records_every_outcome(tmp_path):
    kinds = ["finished", *BAD, "finished"]
    results = []
    outcomes = ChildQueue(on_result=results.append).run((i, fake_spec(kind, tmp_path / str(i))) for i, kind in enumerate(kinds))
    assert [o.key for o in outcomes] == list(range(len(kinds)))
    assert [o.status for o in outcomes] == ["finished", "rejected", "crashed", "error", "crashed", "crashed", "oom", "finished"]
    assert results == outcomes  # on_result saw each one, in order
    assert all(o.notes == [] for o in outcomes)


def test_callbacks_that_raise_are_noted_and_lose_no_outcome(tmp_path):
    def on_start(key, spec):
        if key == 0:
            raise RuntimeError("start display broke")

    def on_event(key, event):
        if key == 1:
            raise ValueError("event display broke")

    def on_result(outcome):
        if outcome.key == 2:
            raise OSError("result display broke")

    queue = ChildQueue(on_start=on_start, on_event=on_event, on_result=on_result)
    outcomes = queue.run((i, fake_spec("finished", tmp_path / str(i))) for i in range(3))
    assert [o.status for o in outcomes] == ["finished"] * 3
    assert outcomes[0].notes == ["on_start raised RuntimeError: start display broke"]
    assert outcomes[1].notes == ["on_event raised ValueError: event display broke"]
    assert outcomes[2].notes == ["on_result raised OSError: result display broke"]


def test_cancel_ends_the_running_item_and_the_queue_goes_on(tmp_path):
    queue: ChildQueue

    def on_event(key, event):
        if key == 0 and event["event"] == "step":
            assert queue.cancel_current() is True

    queue = ChildQueue(on_event=on_event)
    outcomes = queue.run([(0, fake_spec("sleeps", tmp_path / "a")), (1, fake_spec("finished", tmp_path / "b"))])
    assert [o.status for o in outcomes] == ["interrupted", "finished"]
    assert outcomes[0].seconds < 30  # stopped, not slept out
    assert queue.cancel_current() is False  # nothing runs now


def test_a_cancel_while_the_child_is_starting_reaches_it_when_it_exists(tmp_path):
    queue: ChildQueue

    def on_start(key, spec):
        if key == 0:
            queue.cancel_current(grace_s=5)

    queue = ChildQueue(on_start=on_start)
    outcomes = queue.run([(0, fake_spec("sleeps", tmp_path / "a")), (1, fake_spec("finished", tmp_path / "b"))])
    assert [o.status for o in outcomes] == ["interrupted", "finished"]


def test_stop_interrupts_the_running_item_and_skips_the_rest(tmp_path):
    queue: ChildQueue
    seen = []

    def on_event(key, event):
        if event["event"] == "step":
            queue.stop()

    queue = ChildQueue(on_event=on_event, on_result=lambda o: seen.append((o.key, o.status)))
    outcomes = queue.run((i, fake_spec(k, tmp_path / str(i))) for i, k in enumerate(["sleeps", "finished", "finished"]))
    assert [o.status for o in outcomes] == ["interrupted", "skipped", "skipped"]
    assert seen == [(0, "interrupted"), (1, "skipped"), (2, "skipped")]
    assert not (tmp_path / "1").exists() and not (tmp_path / "2").exists()  # never started
