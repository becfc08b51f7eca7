"""The `memlab` command as a user runs it: real subprocesses, one-line errors with exit status 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TINY = ["--experiment", "tiny", "--device", "cpu", "--set", "train.steps=4", "--set", "train.measure_after=1"]


def memlab(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "memlab", *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def test_run_streams_json_events_on_stdout(tmp_path):
    r = memlab("run", "--profile", "baseline", *TINY, "--runs-dir", str(tmp_path), "--events", "-")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["event"] for e in events][0] == "started" and events[-1]["event"] == "finished"
    assert sum(e["event"] == "step" for e in events) == 4
    run_dir = events[0]["run_dir"]
    assert os.path.isdir(run_dir) and run_dir.startswith(str(tmp_path))


def test_run_prints_progress_and_summary(tmp_path):
    r = memlab("run", "--profile", "gradcp", *TINY, "--runs-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "step 4/4" in r.stderr  # plain progress lines when not on a terminal
    for text in ("peak memory", "host RSS", "step time", "tokens/s", "val loss", "ppl", str(tmp_path)):
        assert text in r.stdout, text


def test_profile_from_a_file_that_extends_a_builtin(tmp_path):
    f = tmp_path / "my_profile.toml"
    f.write_text('description = "mine"\nextends = "gradcp"\n[checkpointing]\nmode = "every_n"\n')
    r = memlab("run", "--profile", str(f), *TINY, "--runs-dir", str(tmp_path / "runs"), "--events", "-")
    assert r.returncode == 0, r.stderr
    started = json.loads(r.stdout.splitlines()[0])
    assert started["profile"]["name"] == "my_profile" and started["profile"]["checkpointing"]["mode"] == "every_n"


@pytest.mark.parametrize(
    "args, expect",
    [
        (["run", "--profile", "nope"], "unknown profile 'nope'; built-in profiles: accum"),
        (["run", "--profile", "bf16", "--set", "train.batchsize=3"], "unknown key train.batchsize; valid keys in [train]: batch_size"),
        (["run", "--profile", "bf16", "--set", "train.batch_size=many"], "train.batch_size must be an integer, got 'many'"),
        (["run", "--profile", "bf16", "--set", "train.batch_size=0"], "train.batch_size must be at least 1"),
        (["run", "--profile", "bf16", "--device", "tpu"], "--device 'tpu' is not valid; choose one of: auto, cuda, cpu"),
        (["run", "--profile", "bf16", "--device", "cuda"], "no CUDA GPU is visible"),
        (["run", "--profile", "tf32", "--device", "cpu"], "tf32 needs CUDA"),
        (["run", "--profile", "bf16", "--experiment", "huge"], "unknown experiment 'huge'; built-in experiments: bigvocab, gpt2s"),
        (["run", "--profile", "bf16", "--bogus"], "No such option: --bogus"),
        (["run"], "Missing option '--profile'"),
        (["run", "--profile", "bf16", "--batch-size", "lots"], "--batch-size 'lots': expected a positive integer or 'max'"),
        # issue 50: a flag's error names the flag (not "--set:"), an empty or mis-cased name, a flag and --set at odds
        (["run", "--profile", "bf16", "--batch-size", "0"], "--batch-size '0': expected a positive integer or 'max'"),
        (["run", "--profile", "bf16", "--epochs", "-1"], "Invalid value for '--epochs': must be positive, got -1"),
        (["run", "--profile", "bf16", "--max-docs", "-3"], "Invalid value for '--max-docs': must be 0 (= every document) or more"),
        (["run", "--profile", ""], "the profile name is empty; give a built-in profile (memlab profiles) or a path"),
        (["run", "--profile", "BF16"], "unknown profile 'BF16' (did you mean bf16?); built-in profiles: accum"),
        (["run", "--profile", "gradcp_bf61"], "unknown profile 'gradcp_bf61' (did you mean gradcp_bf16?)"),
        (["run", "--profile", "bf16", "--steps", "4", "--set", "train.steps=6"], "--steps 4 and --set train.steps=6 both set train.steps; give one of them"),
        (["run", "--profile", "bf16", "--epochs", "1", "--set", "train.steps=6"], "--epochs 1.0 and --set train.steps=6 both set train.steps"),
        (["run", "--profile", "bf16", "--batch-size", "4", "--set", "train.batch_size=8"], "--batch-size 4 and --set train.batch_size=8 both set"),
        (["run", "--profile", "bf16", "--no-streaming", "--set", "data.streaming=true"], "--no-streaming and --set data.streaming=true both set"),
    ],
)
def test_bad_input_is_one_line_exit_2_no_traceback(args, expect, tmp_path, capsys):
    """In process through the same entry point as the console script (fast); one real subprocess check below."""
    from memlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*args, "--runs-dir", str(tmp_path)] if args != ["run"] else args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("memlab: error: "), err
    assert expect in lines[0]
    assert not any(tmp_path.iterdir())  # no half-made run folder


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    r = memlab("run", "--profile", "bf16", "--set", "precision.dtype=fp8", "--runs-dir", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert "choose one of: fp32, tf32, bf16, fp16" in r.stderr


@pytest.mark.parametrize(
    "command, where, expect",
    [
        (["run", "--profile", "baseline", "--device", "cpu", "--experiment", "tiny"], "events_in_a_file", "--events {f}/ev.jsonl: {f} is a file, not a folder"),
        (["run", "--profile", "baseline", "--device", "cpu", "--experiment", "tiny"], "events_is_a_folder", "--events {d}: cannot write there (Is a directory)"),
        (["sweep", "--profiles", "baseline", "--device", "cpu", "--experiment", "tiny"], "runs_dir_is_a_file", "runs folder {f} is a file, not a folder"),
        (["tui", "--device", "cpu"], "runs_dir_is_a_file", "runs folder {f} is a file, not a folder"),
    ],
)
def test_an_unusable_output_path_is_one_line_before_any_work(command, where, expect, tmp_path, capsys):
    """Before any training, any child process or the UI: not a traceback halfway through."""
    from memlab.cli import main

    a_file, a_dir = tmp_path / "a_file", tmp_path / "a_dir"
    a_file.write_text("")
    a_dir.mkdir()
    extra = {
        "events_in_a_file": ["--runs-dir", str(a_dir), "--events", f"{a_file}/ev.jsonl"],
        "events_is_a_folder": ["--runs-dir", str(a_dir), "--events", str(a_dir)],
        "runs_dir_is_a_file": ["--runs-dir", str(a_file)],
    }[where]
    with pytest.raises(SystemExit) as exit_:
        main([*command, *extra])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("memlab: error: " + expect.format(f=a_file, d=a_dir))
    assert not any(a_dir.iterdir())  # no run folder was started


def test_events_file_in_a_new_folder_is_made(tmp_path, capsys):
    from memlab.cli import main

    events = tmp_path / "logs" / "today" / "ev.jsonl"
    main(["run", "--profile", "baseline", *TINY, "--runs-dir", str(tmp_path / "runs"), "--events", str(events)])  # exit 0: returns
    kinds = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert kinds[0] == "started" and kinds[-1] == "finished" and kinds.count("step") == 4


def test_malformed_toml_is_one_line(tmp_path, capsys):
    from memlab.cli import main

    f = tmp_path / "broken.toml"
    f.write_text("[precision\n")
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--profile", str(f), "--device", "cpu"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "not valid TOML" in err and str(f) in err and "Traceback" not in err


def test_debug_shows_the_traceback():
    r = memlab("run", "--profile", "nope", "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.xdist_group("memlab-profiles")
def test_profiles_lists_every_builtin_with_what_it_changes(profiles_listing):
    from memlab.core.config import builtin_names

    r = profiles_listing
    assert r.returncode == 0
    for name in builtin_names("profile"):
        assert name in r.stdout
    assert "checkpointing.mode=full" in r.stdout


def test_env_reports_what_it_sees():
    r = memlab("env", "--json")
    info = json.loads(r.stdout)
    assert info["torch"] and info["cuda_available"] is False and info["nvml"] is False


def test_console_script_is_installed():
    import shutil

    exe = shutil.which("memlab")
    assert exe, "the memlab console script is not on PATH (pip install -e . installs it)"
    assert subprocess.run([exe, "--help"], capture_output=True, text=True).returncode == 0


def test_exit_status_says_how_the_run_ended(tmp_path, capsys):
    """0 finished; 1 for oom / nan / error; 130 interrupted (the supervisor reads events, a shell reads this)."""
    from memlab.cli import main

    diverge = ["--set", "train.lr=1e6", "--set", "train.warmup_steps=0", "--set", "train.clip=0", "--set", "train.steps=30"]
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--profile", "baseline", "--experiment", "tiny", "--device", "cpu", "--runs-dir", str(tmp_path), *diverge])
    assert exit_.value.code == 1
    (run,) = list(tmp_path.iterdir())
    assert json.loads((run / "run.json").read_text())["status"] == "nan"
