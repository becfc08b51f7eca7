"""The model seam: the hf family (transformers architectures) behind the same technique door as memlab's GPT."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from memlab.core import engine
from memlab.core.config import apply_overrides, experiment_from_dict, load_experiment, load_profile, to_dict
from memlab.core.errors import MemlabError
from memlab.core.events import ListSink
from memlab.core.models import family, hf
from memlab.core.models.presets import PRESETS
from memlab.core.techniques import build_step
from memlab.core.techniques import check_techniques

pytest.importorskip("transformers")

CPU = torch.device("cpu")


def llama_tiny(steps: int = 2):
    e = load_experiment("llama-tiny")
    e.train.steps, e.train.measure_after = steps, 1
    return e


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_builds_its_published_parameter_count(name):
    e = load_experiment("llama-tiny")
    apply_overrides(e, load_profile("bf16"), [f'model.source="{name}"', "model.seq_len=64"])
    model = family.skeleton(e)  # the whole model, on the meta device
    assert model.num_params() == PRESETS[name]["params"]
    assert model.architecture == PRESETS[name]["config"]["architectures"][0]


def test_shape_keys_override_the_preset_the_rest_come_from_it():
    e = load_experiment("llama-1b")
    assert (e.model.n_layer, e.model.d_model, e.model.n_kv_head, e.model.vocab_size) == (16, 2048, 8, 128256)
    apply_overrides(e, load_profile("bf16"), ["model.n_layer=2"])
    assert (e.model.n_layer, e.model.d_model) == (2, 2048)
    assert hf.skeleton(e).hf.config.num_hidden_layers == 2
    e = load_experiment("llama-1b")  # another model: its own shape, but for the keys given beside it
    apply_overrides(e, load_profile("bf16"), ['model.source="qwen2.5-0.5b"', "model.n_layer=2"])
    assert (e.model.n_layer, e.model.d_model, e.model.vocab_size) == (2, 896, 151936)


def test_a_model_without_grouped_query_attention_takes_another_head_count_whole():
    """GPT-2 has a key/value head per head: --set model.n_head=2 alone is a two-head GPT-2 (it was refused, its
    key/value heads still the preset's 12), while Llama keeps its own 8 key/value heads."""
    e = load_experiment("llama-tiny")
    apply_overrides(e, load_profile("bf16"), ['model.source="gpt2"', "model.n_layer=1", "model.n_head=2", "model.d_model=64"])
    assert (e.model.n_head, e.model.n_kv_head) == (2, 2) and hf.skeleton(e).hf.config.n_head == 2
    e = load_experiment("llama-1b")
    apply_overrides(e, load_profile("bf16"), ["model.n_head=16"])
    assert (e.model.n_head, e.model.n_kv_head) == (16, 8)


def test_gpt_experiments_keep_their_fingerprints():
    """Adding [model] family/source/n_kv_head leaves every stored gpt run comparable with new ones."""
    e = load_experiment("tiny")
    data = to_dict(e)
    for key in ("family", "source", "n_kv_head"):
        del data["model"][key]
    assert experiment_from_dict(data).fingerprint() == e.fingerprint()


CPU_PROFILES = ["baseline", "bf16", "gradcp", "gradcp_every2", "selective", "sac_ops", "chunked_ce", "accum",
                "adafactor", "muon", "optim_in_bwd", "fused_adamw", "flex", "window", "fp16", "lora", "lora_gradcp",
                "dora", "freeze", "ddp_bf16", "fsdp_bf16"]


@pytest.mark.parametrize("name", CPU_PROFILES)
def test_llama_tiny_trains_under_every_cpu_technique(name):
    e, p = llama_tiny(), load_profile(name)
    apply_overrides(e, p, [])
    summary = engine.train(e, p, ListSink(), device="cpu")
    assert summary["status"] == "finished", summary
    assert math.isfinite(summary["final_loss"]) and math.isfinite(summary["val_loss"])
    assert summary["architecture"] == "LlamaForCausalLM" and summary["model_family"] == "hf"
    assert summary["trainable_params"] + summary["frozen_params"] == summary["params"]


def test_lora_trains_adapters_only_and_records_them():
    e, p = llama_tiny(), load_profile("lora")
    apply_overrides(e, p, [])
    s = engine.train(e, p, ListSink(), device="cpu")
    # LoRA r16 on 7 layers of 2 blocks: r * (in + out) each
    layers = [(64, 64), (64, 32), (64, 32), (64, 64), (64, 128), (64, 128), (128, 64)]
    assert s["trainable_params"] == 2 * sum(16 * (i + o) for i, o in layers)
    assert s["adapter_bytes"] > 4 * s["trainable_params"]  # fp32 adapters plus the safetensors header
    assert "peft" in s["finetune"]


def _tiny_qwen_config(path):
    config = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "vocab_size": 600,
              "max_position_embeddings": 128, "tie_word_embeddings": False}
    path.write_text(json.dumps(config))
    return path


def test_an_architecture_from_a_config_json_trains(tmp_path):
    e = llama_tiny()
    p = load_profile("gradcp_bf16")
    apply_overrides(e, p, ['model.source="%s"' % _tiny_qwen_config(tmp_path / "config.json")])
    assert (e.model.d_model, e.model.n_kv_head, e.model.vocab_size) == (48, 2, 600)  # the file's, not llama-tiny's
    s = engine.train(e, p, ListSink(), device="cpu")
    assert s["status"] == "finished" and s["architecture"] == "Qwen2ForCausalLM" and math.isfinite(s["final_loss"])


def _grads(name: str, sets: list[str]) -> dict[str, torch.Tensor]:
    e, p = llama_tiny(), load_profile(name)
    apply_overrides(e, p, ["precision.dtype=fp32", *sets])
    torch.manual_seed(0)
    step = build_step(e, p, CPU, 1024)
    x = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
    loss = step.train_model(x, torch.roll(x, -1, 1))
    loss.backward()
    return {n: q.grad.clone() for n, q in step.model.named_parameters()}


@pytest.mark.parametrize("name,sets", [("gradcp", []), ("sac_ops", []), ("selective", []),
                                       ("chunked_ce", ["loss.chunk_size=24"])])
def test_checkpointed_and_chunked_gradients_equal_the_plain_run(name, sets):
    plain, other = _grads("baseline", ["attention.kernel=sdpa"]), _grads(name, sets)
    assert plain.keys() == other.keys()
    for key in plain:
        torch.testing.assert_close(other[key], plain[key], rtol=1e-4, atol=1e-6)


def _checkpoint(folder, tokenizer: bool = True):
    """A CPU-sized Llama checkpoint as transformers saves one: config.json, model.safetensors, tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM

    e = llama_tiny()
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(hf.transformers_config(e.model))
    model.save_pretrained(folder)
    if tokenizer:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel()
        tok.train_from_iterator(["def f(x):\n    return x + 1\n"] * 50, trainers.BpeTrainer(vocab_size=300, show_progress=False))
        tok.save(str(folder / "tokenizer.json"))
    return model


def test_a_checkpoint_folder_loads_its_weights_and_its_tokenizer(tmp_path):
    saved = _checkpoint(tmp_path)
    e, p = llama_tiny(), load_profile("baseline")
    apply_overrides(e, p, ['model.source="%s"' % tmp_path])
    assert e.data.tokenizer == str(tmp_path / "tokenizer.json")
    check_techniques(e, p, CPU)
    step = build_step(e, p, CPU, e.model.vocab_size)
    loaded = step.model.hf.state_dict()
    for key, tensor in saved.state_dict().items():
        torch.testing.assert_close(loaded[key], tensor, rtol=0, atol=0)


@pytest.mark.parametrize("case,expected", [
    ("preset", "presets: llama-3.2-1b"),
    ("not_causal", "is not a causal language model"),
    ("no_weights", "needs its weights as *.safetensors"),
    ("wrong_weights", "the weights do not match the config"),
    ("kv_heads", "must divide model.n_head"),
    ("positions", "longer than the model's positions (1024"),
    ("fused", "kernels.fused supports model.family = gpt, not hf"),
    ("softcap", "only attention.kernel = eager computes"),
    ("targets", "matches none of the model's Linear layers; its layers in each block: down_proj"),
    ("rank", "finetune.rank = 99 is above the narrowest target layer's width (32)"),
    ("qlora_cpu", "(QLoRA) quantizes the base with bitsandbytes' kernels, which need CUDA"),
])
def test_bad_model_input_is_one_line_before_any_work(tmp_path, case, expected):
    profile, sets = "baseline", []
    if case == "preset":
        sets = ['model.source="llama-9b"']
    elif case == "not_causal":
        (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2,
                                                          "num_attention_heads": 2, "vocab_size": 10}))
        sets = ['model.source="%s"' % (tmp_path / "config.json")]
    elif case == "no_weights":
        _tiny_qwen_config(tmp_path / "config.json")
        sets = ['model.source="%s"' % tmp_path]
    elif case == "wrong_weights":
        _checkpoint(tmp_path, tokenizer=False)
        sets = ['model.source="%s"' % tmp_path, "model.d_ff=96"]
    elif case == "kv_heads":
        sets = ["model.n_kv_head=3"]
    elif case == "positions":
        sets = ['model.source="gpt2"', "model.seq_len=2048"]
    elif case == "fused":
        profile = "fastest"
    elif case == "softcap":
        profile, sets = "bf16", ['model.source="gemma-2-2b"', "model.n_layer=1", "model.seq_len=64"]
    elif case == "targets":
        profile, sets = "lora", ['finetune.targets="qkv"']
    elif case == "rank":
        profile, sets = "lora", ["finetune.rank=99"]
    elif case == "qlora_cpu":
        profile = "qlora"
    e, p = llama_tiny(), load_profile(profile)
    with pytest.raises(MemlabError) as err:
        apply_overrides(e, p, sets)
        check_techniques(e, p, CPU)
    message = str(err.value)
    assert expected in message and "\n" not in message


def test_missing_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    e, p = llama_tiny(), load_profile("baseline")
    with pytest.raises(MemlabError, match=r"pip install 'memlab\[hf\]'"):
        check_techniques(e, p, CPU)


def test_run_refuses_bad_model_input_in_one_line_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "memlab", "run", "--profile", "bf16", "--experiment", "llama-tiny",
                          "--device", "cpu", "--runs-dir", str(tmp_path), "--model", "llama-9b"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "llama-9b" in lines[0] and "llama-3.2-1b" in lines[0]
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_models_lists_the_presets_and_families():
    out = subprocess.run([sys.executable, "-m", "memlab", "models"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for name in PRESETS:
        assert name in out.stdout
    assert "LlamaForCausalLM" in out.stdout and "hf:" in out.stdout


def test_a_pretrained_checkpoint_starts_from_its_own_perplexity(tmp_path):
    """Fine-tuning is a comparison like any other: from a checkpoint folder, validation starts where the checkpoint's
    training left it, not at a random model's perplexity."""
    from transformers import AutoModelForCausalLM

    from memlab.core.data import batch_iterator, load_tokens

    e = llama_tiny()
    tokens = load_tokens(e.data)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf.transformers_config(e.model))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = batch_iterator(tokens.train, batch_size=8, micro_batches=1, seq_len=64, seed=0, steps=40)
    for (x, y), in batches:
        loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(tmp_path)

    def val_after_one_tiny_step(sets: list[str]) -> float:
        ex, p = llama_tiny(steps=1), load_profile("baseline")
        apply_overrides(ex, p, ["train.lr=1e-9", *sets])
        return engine.train(ex, p, ListSink(), device="cpu")["val_loss"]

    random_init = val_after_one_tiny_step([])
    pretrained = val_after_one_tiny_step(['model.source="%s"' % tmp_path, "data.tokenizer=\"bpe:512\""])
    assert pretrained < random_init - 1.0, (pretrained, random_init)


def test_the_attention_kernel_gets_q_k_v_in_one_dtype_under_autocast(monkeypatch):
    """Llama's rotary embedding hands q and k over in fp32 beside a bf16 v under autocast: flash-attn asserts one
    dtype (SDPA casts itself), so the registry's function casts them to the autocast dtype first."""
    from memlab.core.models import hf_attention

    seen = []

    class Recording:
        accepts_gqa, window = True, 0

        def __call__(self, q, k, v, dropout_p=0.0):
            seen.append((q.dtype, k.dtype, v.dtype))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    step = build_step(llama_tiny(), load_profile("bf16"), CPU, 1024)
    for module in step.model.modules():
        if hasattr(module, hf_attention.KERNEL_ATTR):
            monkeypatch.setattr(module, hf_attention.KERNEL_ATTR, Recording())
    x = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))
    with step.autocast():
        step.train_model(x, torch.roll(x, -1, 1)).backward()
    assert seen and set(seen) == {(torch.bfloat16,) * 3}
