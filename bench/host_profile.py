"""Issue 8's open question on one GPU: where does the host spend a training step, memlab's engine against the
hand-written compiled loop of bench/fastest.py, at the same batch (both compiled, same kernels on the GPU).

At batch 16 on the H100 the two run the same kernels for the same GPU time, yet memlab's step is ~4% longer: the
host, not the GPU, sets the pace there. cProfile over `--active` steps after `--skip` (compile and warm-up left
out) shows which Python calls make the difference. cProfile slows Python down, so its absolute times are inflated;
compare the two sides, not the figures with fastest.py's.

    python3 bench/host_profile.py --out $OUT            # writes <out>/host_profile.txt
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fastest import memlab_run, reference_run  # noqa: E402 (bench/ is not a package)


class HostProfiled:
    """cProfile over `active` steps after `skip`; `step()` once per step (the interface of fastest.Profiled)."""

    def __init__(self, skip: int = 10, active: int = 20):
        self.skip, self.active, self.seen = skip, active, 0
        self.prof = cProfile.Profile()
        self.t0 = self.t1 = None

    def step(self) -> None:
        self.seen += 1
        if self.seen == self.skip:
            self.t0 = time.perf_counter()
            self.prof.enable()
        elif self.seen == self.skip + self.active:
            self.prof.disable()
            self.t1 = time.perf_counter()

    def close(self, top: int = 35) -> str:
        if self.t1 is None:
            self.prof.disable()
            return "(fewer steps than skip + active: nothing profiled)"
        buf = io.StringIO()
        stats = pstats.Stats(self.prof, stream=buf)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top + 15)
        wall = (self.t1 - self.t0) * 1000 / self.active
        return f"host wall per step while profiled: {wall:.2f} ms\n" + buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--profile", default="fastest")
    ap.add_argument("--experiment", default="gpt2s")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from memlab.core.config import load_experiment
    from memlab.core.data import load_tokens
    from memlab.core.engine import padded_vocab

    exp = load_experiment(args.experiment)
    tok = load_tokens(exp.data)
    vocab = padded_vocab(tok.vocab_size, exp.model.vocab_size)
    sections = []
    # each side twice: the first compiles (and fills Inductor's cache), the second is the one reported
    for rnd in range(2):
        pr = HostProfiled()
        res = reference_run(tok.train, exp, vocab, args.batch, 40, compiled=True, profiled=pr)
        text = pr.close()
        if rnd:
            sections.append(f"== reference, compiled, batch {args.batch}: GPU step {res['step_ms_median']:.2f} ms\n{text}")
        pr = HostProfiled()
        res = memlab_run(args.experiment, args.profile, 40, args.batch, profiled=pr)
        text = pr.close()
        if rnd:
            sections.append(f"== memlab {args.profile}, batch {args.batch}: GPU step {res.get('step_ms_median', float('nan')):.2f} ms\n{text}")
    report = "\n\n".join(sections) + "\n\ncommand: python3 bench/host_profile.py " + " ".join(sys.argv[1:]) + "\n"
    (out / "host_profile.txt").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
