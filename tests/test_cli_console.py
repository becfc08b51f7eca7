"""What `memlab run` prints (issue 20): no hard wrapping off a terminal, ranks said, no doubled words, warnings."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from rich.console import Console

from memlab.cli.console import ConsoleSink, batch_split, make_console


def _started(**extra) -> dict:
    ev = {
        "event": "started", "total_steps": 10, "profile": {"name": "ddp_bf16"}, "experiment": {"name": "tiny", "train": {"batch_size": 8}},
        "device": "cpu", "params": 1e5, "attention_kernel": "sdpa", "micro_batch": 4, "grad_accum": 1, "world_size": 2,
        "data": {"source": "posts.jsonl (300 of 2,000 documents; data.max_docs=300, 0 = all)", "tokenizer": "bpe:512",
                 "train_tokens": 2_000, "val_tokens": 4_096},
        "run_dir": "runs/" + "x" * 120,
    }
    return ev | extra


def _sink() -> tuple[ConsoleSink, io.StringIO]:
    out = io.StringIO()
    return ConsoleSink(Console(file=out, soft_wrap=True, width=80, highlight=False), interactive=False), out


def test_batch_names_ranks_when_there_are_several():
    assert batch_split(_started()) == "batch 8 (4 per rank x 1 x 2 ranks)"
    assert batch_split(_started(world_size=1, micro_batch=8)) == "batch 8 (8 x 1)"


def test_started_lines_are_whole_and_warn_about_a_large_holdout():
    sink, out = _sink()
    sink.emit(_started())
    lines = out.getvalue().splitlines()
    assert f"  run folder: runs/{'x' * 120}" in lines  # one line, greppable in a CI log
    assert any("(300 of 2,000 documents; data.max_docs=300, 0 = all)" in ln for ln in lines)
    assert any(ln.startswith("  warning validation holds out 67% of the corpus's 6,096 tokens") for ln in lines)


def test_a_failure_reason_is_not_said_twice():
    sink, out = _sink()
    sink.emit({"event": "failed", "reason": "interrupted", "message": "interrupted at step 4"})
    sink.emit({"event": "failed", "reason": "interrupted", "message": "stopped after step 4"})
    assert out.getvalue().splitlines() == ["interrupted at step 4", "interrupted: stopped after step 4"]


def test_off_a_terminal_the_console_never_hard_wraps():
    console = make_console()  # pytest captures stdout: not a terminal
    assert console.soft_wrap and console.width >= 200


def test_version():
    r = subprocess.run([sys.executable, "-m", "memlab", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("memlab 0.")


def test_flags_do_not_show_a_value_type_in_help():
    r = subprocess.run([sys.executable, "-m", "memlab", "run", "--help"], capture_output=True, text=True, timeout=60,
                       env={"COLUMNS": "160", "PATH": ""})
    assert r.returncode == 0 and "--no-meters" in r.stdout and "<bool>" not in r.stdout


@pytest.mark.xdist_group("memlab-profiles")
def test_profiles_marks_those_that_need_cuda_or_a_missing_extra_from_the_checks_themselves(profiles_listing):
    from memlab.cli.info import needs_label
    from memlab.core.config import builtin_names, load_profile
    from memlab.core.requirements import cuda_only, needs

    r = profiles_listing
    # a row's first line starts with its name; a long description wraps onto indented lines
    lines = [ln for ln in r.stdout.splitlines()[1:] if ln.strip() and not ln.startswith((" ", "needs"))]
    header = r.stdout.splitlines()[0]
    start, end = header.index("needs"), header.index("description")  # the column's whole width ("CUDA, memlab[x]")
    rows = {ln.split()[0]: ln[start:end].strip() for ln in lines}
    missing = set()
    for name in builtin_names("profile"):
        n = needs(load_profile(name))
        assert rows[name] == needs_label(n), name
        assert ("CUDA" in rows[name]) == (cuda_only(load_profile(name)) is not None), name
        if n.extra:
            missing.add(n.extra)
            assert f"pip install 'memlab[{n.extra}]'" in n.extra_why, name
    assert rows["tf32"] == "CUDA" and rows["baseline"] == ""
    assert "needs CUDA" in cuda_only(load_profile("tf32"))
    for extra in missing:  # one line each under the table, with the command that installs it
        assert f"needs memlab[{extra}]: not installed here" in r.stdout and f"pip install 'memlab[{extra}]'" in r.stdout


def test_a_profile_whose_package_is_missing_needs_its_extra_not_cuda(monkeypatch):
    """bf16_sr and galore run on the CPU once installed: a missing package is marked as the extra, not as CUDA."""
    import memlab.core.optim_library as optim_library
    from memlab.core import requirements
    from memlab.core.config import load_profile
    from memlab.core.requirements import needs

    real, found = optim_library.import_module, requirements._installed

    def without(module):
        if module.split(".")[0] in ("torchao", "galore_torch"):
            raise ModuleNotFoundError(f"No module named {module!r}", name=module.split(".")[0])
        return real(module)

    # the packages hidden from both the declarations (found, not imported) and the checks (imported): CI has torchao
    monkeypatch.setattr(optim_library, "import_module", without)
    monkeypatch.setattr(requirements, "_installed", lambda m: m.split(".")[0] not in ("torchao", "galore_torch") and found(m))
    for name, extra in (("bf16_sr", "torchao"), ("galore", "galore")):
        n = needs(load_profile(name))
        assert n.cuda is None and n.extra == extra, name
        assert n.install == f"pip install 'memlab[{extra}]'" and n.install in n.extra_why
    assert needs(load_profile("adamw8bit")).cuda  # CUDA-only: the CPU refuses it before its package is asked for
