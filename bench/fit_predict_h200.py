"""`memlab fit --format json`'s predicted rows for a card on an H200, made on a CPU machine: the calibrated card's
context with the H200's own driver reserve (0.601 GiB, bench/results/cap-check-h100/NOTE.md) for the H100's, as
card.context_bytes_here takes it on that GPU (bench/hf_heldout_maxbatch.py does the same). The JSON is what `memlab
fit --measure --predicted FILE` reads on the H200, so the measured side is compared with a prediction made first,
for that card.

    python bench/fit_predict_h200.py --experiment qwen-1.5b --profiles lora_gradcp,qlora_gradcp > FILE.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from unittest import mock

from hf_heldout_maxbatch import H200_RESERVE

from memlab.cli.fit import _for, header
from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.predict import card as cards, fit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--profiles", required=True)
    ap.add_argument("--gpu-memory", default="24GiB")
    args = ap.parse_args()
    outside = cards.context_bytes_with(H200_RESERVE)
    exp = load_experiment(args.experiment)
    with mock.patch.object(cards, "context_bytes_here", lambda: outside):
        card = cards.card_for(args.gpu_memory)
        rows = []
        for name in args.profiles.split(","):
            profile = load_profile(name)
            apply_overrides(exp, profile, [])
            rows.append(fit.fit(exp, profile, card))
        made_for, head = _for(exp, card), header(exp, card, fit._micro(exp, profile))
    print(json.dumps({"header": head + f" (an H200: {outside / 2**30:.2f} GiB outside the allocator)", "for": made_for,
                      "rows": [], "predicted": [dataclasses.asdict(r) for r in rows]}))


if __name__ == "__main__":
    main()
