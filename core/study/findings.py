"""What a study's figures say, computed from them: each finding is a sentence built from the frame's numbers and
the estimator's breakdown of the baseline's peak, and a finding whose data is missing is left out, never guessed.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import polars as pl

from memlab.core.config import Experiment, Profile
from memlab.core.predict.analytic import Estimate, estimate, vocab_for
from memlab.core.predict.fake import fake_estimate
from memlab.core.runfolder import read_info
from memlab.core.study.frame import common, finished, peak_column, started_event
from memlab.core.units import gib

SMALL_PCT = 1.0  # a memory change below this is "no effect"
_WINDOW = re.compile(r"window \d+ >= seq_len \d+[^)(;]*")
_OOM_TAIL = re.compile(r"Tried to allocate [\d.]+ [KMGT]?i?B\.?")
STATIC = ("weights", "gradients", "optimizer_state")


def estimates(frame: pl.DataFrame, out: Path) -> dict[str, Estimate]:
    """The estimator's breakdown of each finished common run, at the run's own micro-batch (from its run.json)."""
    from memlab.core.config import experiment_from_dict, profile_from_dict

    found = {}
    for row in finished(common(frame)).iter_rows(named=True):
        try:
            info = read_info(Path(row["path"]))
            exp, prof = experiment_from_dict(info["experiment"]), profile_from_dict(info["profile"])
            vocab = started_event(Path(row["path"])).get("vocab_size") or vocab_for(exp)[0]
            found[row["profile"]] = breakdown(exp, prof, int(vocab), int(row["micro_batch"]), row["device"] or "cuda")
        except Exception:  # noqa: BLE001 (a breakdown is a nicety: a finding without it is left out)
            continue
    return {name: est for name, est in found.items() if est is not None}


def breakdown(exp: Experiment, prof: Profile, vocab: int, micro_batch: int, device: str) -> Estimate | None:
    """One run's peak by component: for memlab's GPT the analytic formula's (its logits counted apart), for another
    family the trace's (the real step on fake tensors: weights, gradients, optimizer state, activations and
    temporaries; the logits are among the last two, and _where_the_peak_goes names their size from the shape)."""
    if getattr(exp.model, "family", "gpt") != "gpt":
        return fake_estimate(exp, prof, vocab_size=vocab, micro_batch=micro_batch)
    return estimate(exp, prof, vocab_size=vocab, micro_batch=micro_batch, device=device)


def findings(frame: pl.DataFrame, breakdown: dict[str, Estimate], baseline: str) -> list[str]:
    rows = finished(common(frame)).to_dicts()
    base = next((r for r in rows if r["profile"] == baseline), None)
    out: list[str] = []
    if base is not None:
        out += _memory(rows, base, frame) + _fastest(rows, base)
    told = baseline if baseline in breakdown else next((r["profile"] for r in rows if r["profile"] in breakdown), None)
    if told is not None:  # the baseline's, or where it did not finish (it did not fit), the first profile's that did
        out += _where_the_peak_goes(breakdown[told], rows, base)
    out += _no_effect(rows, base, frame, breakdown) + _at_max(frame) + _estimator(frame) + _failures(frame)
    return out or ["nothing finished: no figures to compare yet"]


def _memory(rows: list[dict], base: dict, frame: pl.DataFrame) -> list[str]:
    col, label = peak_column(frame)
    others = [r for r in rows if r is not base and r.get("mem_saved_pct") is not None]
    if not others:
        return []
    best = max(others, key=lambda r: r["mem_saved_pct"])
    if best["mem_saved_pct"] < SMALL_PCT:
        return [f"No profile lowered the {label} by {SMALL_PCT:.0f}% or more below {base['profile']}'s {gib(base[col])}."]
    return [f"**{best['profile']}** saves the most memory: {label} {gib(best[col])} against {gib(base[col])} for "
            f"{base['profile']} ({best['mem_saved_pct']:.1f}% less), {_speed_cost(best, base)}."]


def _speed_cost(row: dict, base: dict) -> str:
    if not row.get("step_ms_median") or not base.get("step_ms_median"):
        return "speed not measured"
    ratio = row["step_ms_median"] / base["step_ms_median"]
    how = f"{(ratio - 1) * 100:.0f}% slower" if ratio > 1.005 else f"{1 / ratio:.2f}× as fast" if ratio < 0.995 else "at the same speed"
    return f"{how} ({row['step_ms_median']:.1f} ms a step against {base['step_ms_median']:.1f} ms)"


def _fastest(rows: list[dict], base: dict) -> list[str]:
    timed = [r for r in rows if r.get("step_ms_median")]
    if len(timed) < 2:
        return []
    best = min(timed, key=lambda r: r["step_ms_median"])
    if best is base:
        return [f"Nothing ran faster than **{base['profile']}** ({base['step_ms_median']:.1f} ms a step) at the common batch."]
    return [f"**{best['profile']}** is the fastest at the common batch: {best['step_ms_median']:.1f} ms a step, "
            f"{best['speedup_x']:.2f}× {base['profile']} ({best['tokens_per_s']:,.0f} tokens/s)."]


def share_of_peak(est: Estimate) -> list[tuple[str, float]]:
    total = est.total_bytes or 1
    parts = {"logits and loss": est.components["logits_loss"], "saved activations": est.components["activations"],
             "weights, gradients and optimizer state": sum(est.components[c] for c in STATIC),
             "temporaries and workspace": est.components["temporaries"] + est.components["workspace"]}
    return sorted(((k, 100 * v / total) for k, v in parts.items()), key=lambda kv: -kv[1])


def _where_the_peak_goes(est: Estimate, rows: list[dict], base: dict | None) -> list[str]:
    shares = share_of_peak(est)
    listing = ", ".join(f"{k} {v:.0f}%" for k, v in shares if v >= 1)
    how = "the trace" if est.method == "fake" else "the estimator"
    at = "" if est.method == "fake" else f" at the {est.peak_phase}"
    line = f"Where {est.profile}'s peak goes ({how}, micro-batch {est.micro_batch}, {gib(est.total_bytes)}{at}): {listing}."
    top, pct = shares[0]
    if top == "logits and loss":
        seq = rows[0]["seq_len"] if rows else "T"
        chunked = _chunked(rows, base)
        line += (f" The B×T×V logits (B={est.micro_batch}, T={seq}, V={est.vocab_size:,}) are {pct:.0f}% of the peak, so attention "
                 "kernels cannot move it; " + _what_moves_it("chunked cross-entropy", chunked, "chunked cross-entropy (loss.chunked = true) would."))
    elif top == "saved activations":
        ckpt = _best(rows, base, lambda r: (r["checkpointing"] or "none") != "none")
        line += f" Saved activations are {pct:.0f}% of the peak: " + _what_moves_it("checkpointing and activation offload", ckpt, "checkpointing and activation offload move it.")
    elif top.startswith("weights"):
        line += f" Weights, gradients and optimizer state are {pct:.0f}% of the peak: activation techniques cannot move it; a smaller optimizer state, optimizer offload, FSDP or training fewer parameters (LoRA, freeze) can."
    return [line + _full_logits(est, rows, base)]


def _full_logits(est: Estimate, rows: list[dict], base: dict | None) -> str:
    """A trace's breakdown does not tell the logits from the other activations: their size, from the shape, where
    the run computed full logits (the loss upcasts them to fp32: one such copy is B x T x V x 4 bytes)."""
    row = next((r for r in rows if r["profile"] == est.profile), None)
    if est.method != "fake" or row is None or row.get("loss_kernel") != "full logits" or not est.total_bytes:
        return ""
    logits = est.micro_batch * row["seq_len"] * est.vocab_size * 4
    chunked = _chunked(rows, base)
    return (f" One fp32 copy of the B×T×V logits (B={est.micro_batch}, T={row['seq_len']}, V={est.vocab_size:,}; the loss "
            f"upcasts them) is {gib(logits)}, {100 * logits / est.total_bytes:.0f}% of the peak, among the activations and "
            "temporaries: " + _what_moves_it("chunked cross-entropy", chunked, "chunked cross-entropy (loss.chunked = true) would drop it."))


def _chunked(rows: list[dict], base: dict | None) -> tuple[str, float] | None:
    """The chunked-loss row that saved most (_best), for the clauses on what moves the logits."""
    return _best(rows, base, lambda r: r["profile"] == "chunked_ce" or "chunk" in (r["profile"] or ""))


def _what_moves_it(technique: str, best: tuple[str, float] | None, untried: str) -> str:
    """The clause on what would lower the peak, told by what the study measured: `does` only where it saved memory."""
    if best is None:
        return untried
    said, saved = best
    if saved >= SMALL_PCT:
        return f"{technique} does: {said}."
    return f"{technique} should, but here {said}."


def _best(rows: list[dict], base: dict | None, which) -> tuple[str, float] | None:
    """(`profile measured N% less`, the saving in %) for the row among `which` that saved most against the baseline;
    a row that used more memory says `N% more`, never a negative "less"."""
    cands = [r for r in rows if r is not base and which(r) and r.get("mem_saved_pct") is not None]
    if not cands:
        return None
    r = max(cands, key=lambda r: r["mem_saved_pct"])
    return f"{r['profile']} measured {change_in_words(r['mem_saved_pct'])}", r["mem_saved_pct"]


def change_in_words(saved_pct: float) -> str:
    """A memory saving in % as words with its direction: `72% less`, `4% more`, `about the same (+0.3%)`."""
    if abs(saved_pct) < SMALL_PCT:
        return f"about the same ({_memory_change(saved_pct)})"
    return f"{abs(saved_pct):.0f}% {'less' if saved_pct > 0 else 'more'}"


def _memory_change(saved_pct: float) -> str:
    """The change in memory a saving means, signed as the estimator's figures are: +0.3% is more memory."""
    return f"{round(-saved_pct, 1) + 0.0:+.1f}%"  # + 0.0: never "-0.0%"


def _no_effect(rows: list[dict], base: dict | None, frame: pl.DataFrame, breakdown: dict[str, Estimate]) -> list[str]:
    out = []
    for r in rows:
        reason = _WINDOW.search(r.get("attention_kernel") or "")
        if reason:
            out.append(f"{r['profile']}: its window had no effect: {reason.group(0).strip()} (the sequence fits in the window; "
                       f"kernel that ran: {r['attention_kernel'].split(' (')[0]}).")
        elif base is not None and r is not base and r.get("mem_saved_pct") is not None and abs(r["mem_saved_pct"]) < SMALL_PCT:
            why = _same_prediction(r["profile"], base["profile"], breakdown)
            out.append(f"{r['profile']}: no effect on memory ({_memory_change(r['mem_saved_pct'])} against {base['profile']}){why}.")
    return out


def _same_prediction(profile: str, baseline: str, breakdown: dict[str, Estimate]) -> str:
    a, b = breakdown.get(profile), breakdown.get(baseline)
    if a is None or b is None or not b.total_bytes:
        return ""
    diff = 100 * (a.total_bytes / b.total_bytes - 1)
    if abs(diff) < SMALL_PCT:
        top = share_of_peak(b)[0][0]
        return f"; the estimator predicts the same peak ({diff:+.1f}%): what it changes is not alive at the peak, which {top} dominate"
    return f"; the estimator predicted {diff:+.1f}%"


def _at_max(frame: pl.DataFrame) -> list[str]:
    out = []
    for r in finished(frame.filter(pl.col("study_kind") == "at_max")).iter_rows(named=True):
        how = "measured" if r["max_batch_measured"] else "predicted, not measured (CPU)"
        tx = f", {r['throughput_x']:.2f}× the baseline's common-batch throughput" if r.get("throughput_x") else ""
        out.append(f"At its own max ({r['micro_batch']}, {how}) {r['profile']} trains {r['tokens_per_s']:,.0f} tokens/s{tx}; "
                   f"this is another optimisation (batch {r['batch_size']}), so its perplexity {r['val_ppl']:.2f} is not compared.")
    return out


def _estimator(frame: pl.DataFrame) -> list[str]:
    errs = [(r["profile"], r["estimate_error_pct"]) for r in finished(common(frame)).iter_rows(named=True) if r.get("estimate_error_pct") is not None]
    if errs:
        worst = max(errs, key=lambda e: abs(e[1]))
        return [f"The estimator's peak is within {statistics.median(abs(e) for _, e in errs):.1f}% of the measured peak (median over "
                f"{len(errs)} runs; furthest: {worst[0]}, {worst[1]:+.1f}%)."]
    if finished(frame).height and peak_column(frame)[0] == "peak_host_rss_bytes":
        return ["On the CPU backend the measured peak is the host process's RSS and the max batch is not measured: the "
                "estimator's device figures are shown beside them, not compared with them."]
    return []


def _failures(frame: pl.DataFrame) -> list[str]:
    bad = frame.filter(pl.col("study_status") != "finished")
    return [f"{r['profile']} ({'at its max' if r['study_kind'] == 'at_max' else 'common batch'}): {r['study_status']}"
            + (f": {_first_sentence(r['study_message'])}" if r["study_message"] else "") + _accumulated(r)
            for r in bad.iter_rows(named=True)]


def _accumulated(row: dict) -> str:
    """Why a micro-batch its max-batch search fitted ran out of memory at the common batch: accumulated, the earlier
    micro-batches' gradients are alive through the later ones' forward, which a probe (one micro-batch a step) never
    has (Llama-3.2-1B under 24 GiB: 4.6 GiB of fp32 gradients on top of micro-batch 1's 20.4 GiB peak)."""
    micro, steps, fitted = row.get("micro_batch"), row.get("grad_accum"), row.get("max_batch")
    if row["study_status"] != "oom" or not micro or not steps or steps < 2 or not fitted or micro > fitted:
        return ""
    return (f" Its max-batch search fitted micro-batch {fitted} alone; accumulating {steps}, the earlier micro-batches' "
            "gradients stay alive through the later ones' forward, which the search's probes (one micro-batch a step) never hold.")


def _first_sentence(message: str) -> str:
    """PyTorch's out-of-memory message up to the allocation that failed (the allocator's advice after it is in the
    run's own folder): a finding is one line."""
    cut = _OOM_TAIL.search(message)
    return message[:cut.end()] if cut else message
