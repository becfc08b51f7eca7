"""Issue 17, speed at equal batch: is the host what keeps `fastest` level with the compiled loop at batch 16, and
does one CUDA graph of memlab's whole step (forward, backward, clipping, fused AdamW) take it away?

One process, one GPU, gpt2s. At each batch, three cases in interleaved rounds, each timed by the same wall clock
around the same work (the batch built on the host from the token array, pinned, copied; the step; one synchronize
at the end of the timed steps):
  ref      the plain compiled loop of bench/fastest.py (RefGPT, bf16 autocast, SDPA, fused AdamW, torch.compile)
  step     memlab's TrainStep (memlab.core.techniques.build_step) for --profile, launched from Python
  graph    the same TrainStep captured once as a CUDA graph and replayed (its batch copied into static inputs)
Also: the graph's losses against the launched step's from the same weights and batches, and the peak allocated
bytes of one launched step against the peak during the capture (what a graphed step holds).

    python3 bench/graph_step_probe.py --out $OUT --batches 16,32,64 --rounds 3 --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from fastest import RefGPT  # noqa: E402


def batch_maker(tokens, T: int, batch: int, seed: int = 0):
    n = (len(tokens) - 1) // T
    g = torch.Generator().manual_seed(seed)
    data = torch.from_numpy(tokens[: n * T + 1].astype("int64"))

    def make():
        idx = torch.randint(0, n, (batch,), generator=g) * T
        x = torch.stack([data[i : i + T] for i in idx]).pin_memory()
        y = torch.stack([data[i + 1 : i + 1 + T] for i in idx]).pin_memory()
        return x, y

    return make


def wall_tokens_per_s(run_one, steps: int, tokens_per_step: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        run_one()
    torch.cuda.synchronize()
    return steps * tokens_per_step / (time.perf_counter() - t0)


class Reference:
    def __init__(self, exp, vocab: int, make):
        m = exp.model
        torch.manual_seed(0)
        self.model = RefGPT(vocab, m.seq_len, m.d_model, m.n_layer, m.n_head).cuda()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, fused=True)
        self.fwd = torch.compile(self.model)
        self.make = make

    def __call__(self):
        x, y = self.make()
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def memlab_step(exp, profile, vocab: int, batch: int):
    from memlab.core.techniques import build_step

    exp.train.batch_size = batch
    torch.manual_seed(exp.train.seed)
    step = build_step(exp, profile, torch.device("cuda"), vocab)
    for group in step.optimizer.param_groups:  # what a captured optimizer step needs: lr and step count on the device
        group["capturable"] = True
        group["lr"] = torch.tensor(float(group["lr"]), device="cuda")
    step.train_model.train()
    return step


class Graphed:
    """`step.run` captured once; each call copies the batch into the static inputs and replays."""

    def __init__(self, step, x, y, warmup: int = 2):
        self.step = step
        self.x, self.y = x.cuda(), y.cuda()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # cuBLAS workspaces and the like, made outside the capture
            for _ in range(warmup):
                step.run([(self.x, self.y)])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.cuda.graph(self.graph):
            self.result = step.run([(self.x, self.y)])
        self.capture_peak = torch.cuda.max_memory_allocated()
        self.capture_base = base
        self.reserved_after = torch.cuda.memory_reserved()

    def __call__(self, batch=None):
        x, y = batch
        self.x.copy_(x, non_blocking=True)
        self.y.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.result.loss_sum.clone()


def launched(step, batch):
    return step.run([batch]).loss_sum


def check_losses(exp, profile, vocab: int, batch: int, make) -> dict:
    batches = [make() for _ in range(10)]
    a = memlab_step(exp, profile, vocab, batch)
    want = [launched(a, b).float().item() for b in batches]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    launched(a, batches[0])
    torch.cuda.synchronize()
    launched_peak = torch.cuda.max_memory_allocated()
    a = None
    torch.cuda.empty_cache()
    c = memlab_step(exp, profile, vocab, batch)
    got = [launched(c, bt).float().item() for bt in batches[:3]]
    graphed = Graphed(c, *batches[3], warmup=0)  # its launched steps above warmed it: the losses stay comparable
    capture_peak = graphed.capture_peak
    for bt in batches[3:]:
        got.append(graphed(bt).float().item())
    c = graphed = None
    torch.cuda.empty_cache()
    return {"launched_losses": want, "graphed_losses": got, "max_abs_diff": max(abs(p - q) for p, q in zip(want, got)),
            "launched_step_peak": launched_peak, "launched_base": base, "capture_peak_no_warmup": capture_peak}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="fastest")
    ap.add_argument("--experiment", default="gpt2s")
    ap.add_argument("--batches", default="16,32,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip-check", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.data import load_tokens
    from memlab.core.engine import padded_vocab
    from memlab.core.techniques import check_techniques

    exp, profile = load_experiment(args.experiment), load_profile(args.profile)
    check_techniques(exp, profile, torch.device("cuda"))
    tok = load_tokens(exp.data)
    vocab = padded_vocab(tok.vocab_size, exp.model.vocab_size)
    T = exp.model.seq_len

    def record(row: dict) -> None:
        with open(out / "graph_probe.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    record({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "profile": args.profile, "argv": sys.argv})
    if not args.skip_check:
        try:
            record({"check": "losses_and_memory", "batch": 16, **check_losses(exp, profile, vocab, 16, batch_maker(tok.train, T, 16, seed=1))})
        except Exception as e:  # noqa: BLE001  (a probe records any failure and goes on)
            record({"check": "losses_and_memory", "error": repr(e), "trace": traceback.format_exc()[-3000:]})
    for batch in [int(b) for b in args.batches.split(",")]:
        try:
            make = batch_maker(tok.train, T, batch)
            ref = Reference(exp, vocab, make)
            step = memlab_step(exp, profile, vocab, batch)
            for _ in range(3):
                ref()
                launched(step, make())
            graphed = Graphed(step, *make())
            cases = {"ref": ref, "step": lambda: launched(step, make()), "graph": lambda: graphed(make())}
            for _ in range(3):
                for fn in cases.values():
                    fn()
            tps = {k: [] for k in cases}
            for rnd in range(args.rounds):
                for name, fn in cases.items():
                    tps[name].append(wall_tokens_per_s(fn, args.steps, batch * T))
            med = {k: statistics.median(v) for k, v in tps.items()}
            record({"batch": batch, "tokens_per_s": tps, "median": med, "graph_vs_ref": med["graph"] / med["ref"],
                    "step_vs_ref": med["step"] / med["ref"], "capture_peak": graphed.capture_peak,
                    "capture_base": graphed.capture_base, "reserved_after_capture": graphed.reserved_after})
        except Exception as e:  # noqa: BLE001  (a probe records any failure and goes on)
            record({"batch": batch, "error": repr(e), "trace": traceback.format_exc()[-3000:]})
        ref = step = graphed = cases = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
