"""What a new user reads (issue 50, round two): help at 80 columns, one-line refusals of input that contradicts
itself (a flag and --set for one knob, a profile listed twice or empty), a card smaller than the CUDA context."""

from __future__ import annotations

import pytest

from memlab.cli import main


def _memlab(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


COMMANDS = [["run"], ["sweep"], ["study"], ["table"], ["plot"], ["estimate"], ["find-batch"], ["data", "prepare"], ["tui"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_at_80_columns_cuts_no_word(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _memlab([*command, "--help"], capsys)
    assert code == 0 and "Usage: memlab" in out
    assert "…" not in out, [ln for ln in out.splitlines() if "…" in ln]
    assert max(len(ln) for ln in out.splitlines()) <= 80


def test_help_keeps_text_in_square_brackets(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    _, out, _ = _memlab(["data", "prepare", "--help"], capsys)
    assert "Start from the [data] table" in out  # rich read `[data]` as markup and dropped it


@pytest.mark.parametrize("args, expect", [
    (["sweep", "--profiles", "bf16,bf16"], "--profiles 'bf16,bf16' lists bf16 more than once; list each profile once"),
    (["sweep", "--profiles", "baseline,,bf16"], "--profiles 'baseline,,bf16' has an empty name between commas"),
    (["sweep", "--profiles", "baseline", "--steps", "4", "--set", "train.steps=6"], "--steps 4 and --set train.steps=6 both set train.steps"),
    (["study", "--profiles", "bf16,bf16"], "--profiles 'bf16,bf16' lists bf16 more than once"),
    (["study", "--profiles", "baseline,,bf16"], "has an empty name between commas"),
    (["study", "--profiles", "baseline", "--steps", "4", "--set", "train.steps=6"], "--steps 4 and --set train.steps=6 both set train.steps"),
    (["study", "--profiles", "baseline", "--gpu-memory", "1GiB"], "--gpu-memory 1GiB (1.00 GiB) is not more than the CUDA context"),
    (["estimate", "--profile", "baseline", "--gpu-memory", "1MiB"], "--gpu-memory 1MiB (0.00 GiB) is smaller than what a run holds outside the allocator"),
    (["estimate", "--profile", "baseline", "--batch-size", "4", "--set", "train.batch_size=8"], "--batch-size 4 and --set train.batch_size=8 both set"),
    (["data", "prepare", "--max-docs", "-3"], "(see: memlab data prepare --help)"),
])
def test_input_that_contradicts_itself_is_one_line_before_any_work(args, expect, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where = {"sweep": ["--runs-dir", str(tmp_path / "runs")], "study": ["--out", str(tmp_path / "s")]}.get(args[0], [])
    device = [] if args[0] == "estimate" else ["--device", "cpu"]
    code, _, err = _memlab([*args, "--experiment", "tiny", *device, *where], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error: "), err
    assert expect in lines[0]
    assert not any(tmp_path.iterdir())  # no runs folder, no study folder


def test_a_warmup_longer_than_the_run_is_said_in_one_line():
    from memlab.core.config import warmup_warning

    assert warmup_warning(5, 30) is None and warmup_warning(0, 3) is None
    line = warmup_warning(1000, 3)
    assert "\n" not in line and "train.warmup_steps (1,000) is not less than the run's 3 steps" in line and "0.3% of train.lr" in line
