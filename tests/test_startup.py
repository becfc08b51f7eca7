"""Start-up: listing commands and input refusals answer without importing torch, and what `memlab profiles` says a
profile needs (CUDA, an extra) is what the technique checks themselves refuse."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from memlab.core.config import builtin_names, load_experiment, load_profile
from memlab.core.errors import DeviceError, MemlabError
from memlab.core.requirements import CUDA_NEEDS, needs

# One child runs every command below in turn (main() in process, each exit caught), then reports which heavy
# modules it imported: a listing or a refusal that imports torch costs a user 2-5 s before its first line.
_CHILD = r"""
import contextlib, io, json, sys
from memlab.cli import main, app, _register_commands

_register_commands()
names = {c.name for c in app.registered_commands}
results = []
for argv in json.loads(sys.argv[1]) + [[n] for n in ("models",) if n in names]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
    results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps({"results": results, "heavy": [m for m in ("torch", "polars", "textual") if m in sys.modules]}))
"""

LISTINGS = [["--help"], ["profiles"], ["experiments"], ["run", "--help"]]
REFUSALS = [  # (argv, what the one-line error says)
    (["run", "--profile", "nope"], "unknown profile 'nope'; built-in profiles: accum,"),
    (["run", "--profile", "bf16", "--set", "foo.bar=1"], "unknown section 'foo'"),
    (["run", "--profile", "bf16", "--experiment", "tiny", "--set", "model.n_head=3"], "must be divisible by model.n_head"),
    (["run", "--profile", "bf16", "--batch-size", "lots"], "--batch-size 'lots': expected a positive integer or 'max'"),
    (["run", "--profile", "bf16", "--device", "tpu"], "--device 'tpu' is not valid; choose one of: auto, cuda, cpu"),
    (["run", "--profile", "bf16", "--label", " "], "--label ' ': give a short name"),
    (["run", "--profile", "bf16", "--experiment", "nope"], "unknown experiment 'nope'"),
    (["sweep", "--profiles", "baseline,nope"], "unknown profile 'nope'"),
    (["sweep", "--profiles", "baseline", "--vary", "train.lr=x"], "--vary train.lr=x:"),
    (["estimate", "--profile", "nope"], "unknown profile 'nope'"),
    (["estimate", "--profile", "bf16", "--gpu-memory", "lots"], "lots"),
    (["find-batch", "--profile", "nope"], "unknown profile 'nope'"),
    (["study", "--out", "{tmp}/s", "--profiles", "baseline,nope"], "unknown profile 'nope'"),
    (["data", "prepare", "--val-tokens", "0"], "--val-tokens': must be at least 1, got 0"),
    (["tui", "--set", "foo.bar=1"], "unknown section 'foo'"),
    (["tui", "--device", "tpu"], "--device 'tpu' is not valid"),
]


@pytest.fixture(scope="module")
def child(tmp_path_factory) -> dict:
    """{" ".join(argv): {"code", "out", "err"}} for LISTINGS and REFUSALS, and "heavy": what the child imported."""
    tmp = tmp_path_factory.mktemp("startup")
    argvs = LISTINGS + [argv for argv, _ in REFUSALS]
    given = [[a.replace("{tmp}", str(tmp)) for a in argv] for argv in argvs]
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(given)], capture_output=True, text=True, timeout=120, cwd=tmp)
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout.splitlines()[-1])
    by_argv = {" ".join(argv): result for argv, result in zip(argvs + [[n] for n in ("models",)], answer["results"])}
    return by_argv | {"heavy": answer["heavy"]}


def test_listings_and_refusals_import_neither_torch_nor_polars(child):
    assert child["heavy"] == [], f"imported before any work: {child['heavy']}"


@pytest.mark.parametrize("argv", LISTINGS, ids=" ".join)
def test_a_listing_prints_without_torch(child, argv):
    r = child[" ".join(argv)]
    assert r["code"] == 0 and r["err"] == "" and r["out"].strip()


def test_memlab_models_is_a_listing_too_once_it_exists(child):
    """The child runs `memlab models` as well once it is registered: then it must list without torch too."""
    r = child.get("models")
    assert r is None or (r["code"] == 0 and r["out"].strip())


@pytest.mark.parametrize("argv,says", REFUSALS, ids=[" ".join(a) for a, _ in REFUSALS])
def test_a_bad_input_is_one_line_and_exit_2_without_torch(child, argv, says):
    r = child[" ".join(argv)]
    lines = r["err"].strip().splitlines()
    assert r["code"] == 2 and len(lines) == 1, r
    assert lines[0].startswith("memlab: error: ") and says in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------- needs vs checks


def _cpu_refusal(profile) -> str | None:
    """The DeviceError the technique checks raise for `profile` on the CPU (tiny), or None: the slow truth."""
    import torch

    from memlab.core.techniques import check_techniques

    world = 2 if profile.distributed.mode != "none" else 1
    for experiment in ("tiny", "llama-tiny"):  # a transformers-only knob is checked on the family it supports
        try:
            check_techniques(load_experiment(experiment), copy.deepcopy(profile), torch.device("cpu"), world)
        except DeviceError as e:
            return str(e)
        except MemlabError as e:
            if "model.family = hf, not gpt" in str(e):
                continue
            return None
        return None
    return None


def _one_knob_variants():
    """bf16 (cce takes 16-bit inputs only) with each CUDA-needing knob turned on: every declaration meets its check."""
    out = []
    for path, value in (("allocator.expandable_segments", True), ("loader.pin_memory", True), ("precision.dtype", "tf32"),
                        ("attention.sdpa_backend", "cudnn"), ("attention.sdpa_backend", "efficient"), ("loss.fused", "liger"),
                        ("loss.fused", "cce"), ("kernels.float8", True), ("kernels.liger", True), ("optimizer.name", "adamw8bit"),
                        ("optimizer.name", "adamw4bit"), ("optimizer.name", "paged_adamw8bit"), ("optimizer.offload", True),
                        ("checkpointing.offload", True), ("cuda_graph.enabled", True)):
        p = load_profile("bf16")
        p.attention.kernel = "sdpa"
        section, key = path.split(".")
        setattr(getattr(p, section), key, value)
        out.append(pytest.param(p, id=f"{path}={value}"))
    fsdp, ddp, lora = load_profile("fsdp_bf16"), load_profile("ddp_bf16"), load_profile("lora")
    fsdp.distributed.cpu_offload = ddp.distributed.cpu_offload = True
    lora.finetune.base = "int8"
    return out + [pytest.param(fsdp, id="distributed.cpu_offload"), pytest.param(ddp, id="distributed.cpu_offload=ddp"),
                  pytest.param(lora, id="finetune.base=int8")]


@pytest.mark.parametrize("profile", [pytest.param(load_profile(n), id=n) for n in builtin_names("profile")] + _one_knob_variants())
def test_needs_cuda_is_what_the_checks_refuse_on_the_cpu(profile):
    assert needs(profile).cuda == _cpu_refusal(profile)


def test_every_declared_cuda_need_is_met_by_a_variant():
    covered = {p.id.split("=")[0] for p in _one_knob_variants()}
    for knob in CUDA_NEEDS:
        assert any(c == knob or c.startswith(knob + ".") for c in covered), knob


@pytest.mark.parametrize("name,extra", [("bf16_sr", "torchao"), ("galore", "galore"), ("adamw8bit", "torchao"),
                                        ("paged_adamw8bit", "bnb"), ("liger_ce", "liger"), ("cce", "cce"), ("float8", "torchao"),
                                        ("lora", "peft"), ("qlora", "bnb")])
def test_a_missing_extra_is_named_with_the_line_its_check_gives(monkeypatch, name, extra):
    """Looked for with find_spec (nothing imported); the line is the check's own, met where the package is missing."""
    import importlib

    import torch

    import memlab.core.linear_ce as linear_ce
    import memlab.core.optim_library as optim_library
    import memlab.core.requirements as requirements
    from memlab.core.techniques import finetune, float8, loss, optimizer

    gone = set(requirements.EXTRA_MODULES[extra])
    real_find, real_import = requirements.importlib.util.find_spec, importlib.import_module

    def without(module, *args):
        if module.split(".")[0] in gone:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module.split(".")[0])
        return real_import(module, *args)

    monkeypatch.setattr(requirements.importlib.util, "find_spec", lambda m, *a: None if m in gone else real_find(m, *a))
    monkeypatch.setattr(optim_library, "import_module", without)
    monkeypatch.setattr(linear_ce.importlib, "import_module", without)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # `import torchao.float8` fails here too
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # float8's check, as on an H100
    p = load_profile(name)
    n = needs(p)
    assert n.extra == extra and n.install == f"pip install 'memlab[{extra}]'" and n.install in n.extra_why
    technique = (finetune if p.finetune.method != "full" else optimizer if p.optimizer.name in optim_library.PACKAGES
                 else loss if p.loss.fused != "none" else float8)
    with pytest.raises(MemlabError) as e:  # the check itself, on a CUDA device (the CPU refuses before the package)
        technique.check(load_experiment("tiny"), p, torch.device("cuda"), 1)
    assert str(e.value) == n.extra_why
