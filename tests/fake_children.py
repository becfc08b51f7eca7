"""Fake `memlab run` children for the supervisor, queue and sweep tests: small `python -c` scripts (no torch, a
few tens of milliseconds each) that misbehave in one chosen way. Each is a ChildSpec through `command`."""

from __future__ import annotations

import sys
import textwrap

from memlab.core.supervisor import ChildSpec

# What every fake child can call: emit an event on stdout, make a run folder as the engine does (run.json running).
PRELUDE = textwrap.dedent("""
    import json, os, shutil, signal, sys, time
    from memlab.core.supervisor import honour_sigint
    honour_sigint()  # as `memlab run --events -` does under a supervisor
    RUNS, PROFILE = sys.argv[1], sys.argv[2]
    def emit(kind, **fields):
        print(json.dumps({"event": kind, "t": time.time(), **fields}), flush=True)
    def make_run():
        name = f"fake-run-{os.getpid()}"
        d = os.path.join(RUNS, name)
        os.makedirs(d)
        with open(os.path.join(d, "run.json"), "w") as f:
            json.dump({"schema_version": 1, "run_id": name, "status": "running", "profile": {"name": "fake"}}, f)
        emit("started", run_id=name, run_dir=d, profile={"name": PROFILE})
        return d
""")

SCRIPTS = {
    # finishes normally, with a summary
    "finished": """
        d = make_run()
        emit("step", step=0, loss=1.0)
        emit("finished", summary={"steps": 1, "peak_alloc_bytes": 1024, "status": "finished"})
    """,
    # refuses its input after `started` and deletes its folder (what `memlab run` does on a late refusal)
    "refuses_after_started": """
        d = make_run()
        shutil.rmtree(d)
        print("memlab: error: validation slice of 10 tokens is shorter than one window", file=sys.stderr)
        sys.exit(2)
    """,
    # refuses its input after `started` but leaves its folder behind
    "refuses_keeping_folder": """
        make_run()
        print("memlab: error: attention.window needs the flash kernel", file=sys.stderr)
        sys.exit(2)
    """,
    # killed by SIGKILL mid-run (what the kernel's OOM killer does)
    "sigkilled": """
        make_run()
        emit("step", step=0, loss=1.0)
        print("allocating a lot of host memory", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """,
    # garbage on stdout, then a real outcome whose fields have the wrong types
    "garbage": """
        d = make_run()
        for line in ['not json', '[1, 2]', '"a string"', '42', '{"event": 3}', '{"no_event": 1}', '{"event": "step", "st',
                     '{' * 5000 + '}' * 5000, '{"event": "step"}', '{"event": "step", "step": "three"}',
                     '{"event": "party", "step": 1}', '{"event": "step", "step": 1, "loss": "low"}']:
            print(line, flush=True)
        emit("step", step=0, loss=1.0)
        sys.stdout.buffer.write(b'\\xff\\xfe not utf-8\\n')
        sys.stdout.flush()
        emit("failed", reason=123, message=["not", "a", "string"], summary="not a dict")
        sys.exit(1)
    """,
    # garbage only, then a clean exit without any outcome
    "silent_exit_0": """
        print("hello", flush=True)
        print('{"event": "started"}', flush=True)
    """,
    # announces a run folder outside its runs folder, then dies: nothing may be written there
    "claims_a_foreign_folder": """
        emit("started", run_id="x", run_dir=os.path.dirname(os.path.abspath(RUNS)))
        os.kill(os.getpid(), signal.SIGKILL)
    """,
    # an out-of-memory failure, reported
    "oom": """
        make_run()
        emit("failed", reason="oom", message="CUDA out of memory. Tried to allocate 2.00 GiB", summary={"peak_alloc_bytes": 2048})
        sys.exit(1)
    """,
    # finishes, its summary saying which GPUs it was pinned to (lanes)
    "reports_gpu": """
        make_run()
        emit("step", step=0, loss=1.0)
        emit("finished", summary={"steps": 1, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    """,
    # waits until the test creates <runs>/release-<profile> (at most 30 s), then finishes as reports_gpu
    "waits_for_release": """
        make_run()
        emit("step", step=0, loss=1.0)
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(RUNS, "release-" + PROFILE)) and time.time() < deadline:
            time.sleep(0.05)
        emit("finished", summary={"steps": 1, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    """,
    # its GPU fails mid-run: the error CUDA raises for a double-bit ECC error
    "gpu_fault": """
        make_run()
        emit("step", step=0, loss=1.0)
        emit("failed", reason="error", message="CUDA error: uncorrectable ECC error encountered")
        sys.exit(1)
    """,
    # runs until stopped (SIGINT: KeyboardInterrupt, no outcome reported)
    "sleeps": """
        make_run()
        emit("step", step=0, loss=1.0)
        time.sleep(60)
    """,
}


def fake_spec(kind: str, runs_dir, profile: str | None = None) -> ChildSpec:
    """A ChildSpec whose child behaves as SCRIPTS[kind]; `unstartable` is an executable that does not exist."""
    if kind == "unstartable":
        command = [str(runs_dir) + "/no-such-executable"]
    else:
        command = [sys.executable, "-c", PRELUDE + textwrap.dedent(SCRIPTS[kind]), str(runs_dir), profile or kind]
    return ChildSpec(profile=profile or kind, runs_dir=str(runs_dir), command=command)
