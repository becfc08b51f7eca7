"""The peer: the transformers Trainer (optionally + peft LoRA) training the same model at the same batch and sequence
as a memlab experiment, timed the way memlab's wall clock is, peak allocated memory read the way memlab reads it.

  python3 bench/trainer_peer.py --experiment llama-1b --mode bf16|gradcp|compile [--lora] --steps 30 --out row.json

The model is the experiment's (memlab's own transformers config for it: same shape, same 128k head), built with
transformers' SDPA attention, fp32 weights under bf16 autocast (bf16=True), AdamW's fused kernel, the experiment's
lr, betas, weight decay and clipping. Tokens are random ids below the experiment's tokenizer size: step time and
memory do not depend on their values. Figures: the mean wall time per step from the end of step `--warmup` to the
end of the last step (synchronized at those two points only), and torch.cuda.max_memory_allocated over the same
steps (peaks reset at the end of step `--warmup`, once the optimizer state exists).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch


def build_model(experiment, lora: dict | None, device: str):
    """The experiment's model; with LoRA, its base in bf16 (as memlab's lora profile keeps it), with QLoRA its
    Linear layers in NF4 through the same bitsandbytes swap memlab uses, then peft's adapters (fp32, peft's default)."""
    from transformers import AutoModelForCausalLM

    from memlab.core.models.hf import transformers_config

    config = transformers_config(experiment.model)
    dtype = torch.bfloat16 if lora else torch.float32
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    if lora and lora.get("qlora"):
        from memlab.core.models.hf import HFCausalLM
        from memlab.core.techniques.finetune import _quantize, linear_layers

        _quantize(model, {k.removeprefix("hf."): v for k, v in linear_layers(HFCausalLM(model)).items()}, "nf4", torch.device(device))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                                 target_modules="all-linear", use_dora=lora.get("dora", False)))
    return model


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timing_callback(warmup: int, steps: int, out: dict):
    from transformers import TrainerCallback

    class Timing(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                _sync()
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                out["t0"] = time.perf_counter()
            elif state.global_step == steps:
                _sync()
                out["t1"] = time.perf_counter()
                cuda = torch.cuda.is_available()
                out["peak_alloc_bytes"] = torch.cuda.max_memory_allocated() if cuda else None
                out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved() if cuda else None

    return Timing()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--mode", choices=("bf16", "gradcp", "compile"), default="bf16")
    ap.add_argument("--lora", action="store_true", help="peft LoRA r16 alpha 32 dropout 0.05 on every linear layer")
    ap.add_argument("--dora", action="store_true")
    ap.add_argument("--qlora", action="store_true", help="LoRA over an NF4 base (bitsandbytes)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script on a tiny experiment")
    args = ap.parse_args()
    from transformers import Trainer, TrainingArguments

    from memlab.core.config import load_experiment

    e = load_experiment(args.experiment)
    t = e.train
    lora = {"rank": 16, "alpha": 32, "dropout": 0.05, "dora": args.dora, "qlora": args.qlora} if (args.lora or args.dora or args.qlora) else None
    torch.manual_seed(t.seed)
    model = build_model(e, lora, args.device)
    vocab = int(e.data.tokenizer.split(":")[1]) if e.data.tokenizer.startswith("bpe:") else e.model.vocab_size
    data = RandomTokens(t.batch_size * (args.steps + 1), e.model.seq_len, vocab, t.seed)
    timing: dict = {}
    targs = TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=t.batch_size, max_steps=args.steps,
        bf16=args.device == "cuda", optim="adamw_torch_fused", use_cpu=args.device == "cpu", learning_rate=args.lr or t.lr, weight_decay=t.weight_decay,
        adam_beta1=t.beta1, adam_beta2=t.beta2, max_grad_norm=t.clip, warmup_steps=t.warmup_steps,
        lr_scheduler_type="cosine", logging_steps=10**6, save_strategy="no", report_to=[], dataloader_num_workers=0,
        gradient_checkpointing=args.mode == "gradcp", gradient_checkpointing_kwargs={"use_reentrant": False},
        torch_compile=args.mode == "compile", disable_tqdm=True, seed=t.seed,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=data, callbacks=[timing_callback(args.warmup, args.steps, timing)])
    t_start = time.perf_counter()
    trainer.train()
    step_s = (timing["t1"] - timing["t0"]) / (args.steps - args.warmup)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    kind = "+dora" if args.dora else "+qlora" if args.qlora else "+lora" if lora else ""
    row = {"side": "trainer" + ("+peft" if lora else ""), "mode": args.mode + kind,
           "experiment": args.experiment, "batch": t.batch_size, "seq_len": e.model.seq_len,
           "wall_step_ms": step_s * 1000, "tokens_per_s_wall": t.batch_size * e.model.seq_len / step_s,
           "peak_alloc_bytes": timing["peak_alloc_bytes"], "peak_reserved_bytes": timing["peak_reserved_bytes"],
           "trainable_params": trainable, "total_s": time.perf_counter() - t_start,
           "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "torch": torch.__version__}
    import transformers

    row["transformers"] = transformers.__version__
    if lora:
        import peft

        row["peft"] = peft.__version__
    with open(args.out, "w") as f:
        json.dump(row, f)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
