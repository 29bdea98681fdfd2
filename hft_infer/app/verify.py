"""Determinism check: the live service's decisions against the model's offline reference.

The reference recomputes every decided event's score from the event table
alone, with no sockets, batching or conflation: the model's plain-torch
reference (`forward_window` over the event's window, `forward_stream` over
the instrument's whole history for stream mode) on raw rows built the way the
feature store builds them (`models.dataset.raw_rows`). Which events the
service decides depends on timing (conflation, shedding); the score of a
decided event does not, so every decided event is compared. The action is
recomputed by replaying the decision policy over the decided events of each
instrument in order (hysteresis depends on the previous decisions).

Events the service received and did not apply are left out of the reference's
history, as the service left them out of its state: under the sequential
discipline (stateful models, conflation off) an event shed QUEUE_FULL or
LATE is answered before its row is written and takes no position
(scheduler.py, admission). verify learns which from their answers, so it needs
`egress.publish_shed` (the default); conflating models write every row.

A score differs when |live - reference| > tolerance (default: what the precision
the service reports in its Status allows, else the config's runner.precision:
`default_tolerance`); an action differs only
when the reference score is further than `tolerance` from a threshold (a
float32 rounding difference at a threshold may flip the action, which is not
a mismatch of the model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from hft_infer.config import Config
from hft_infer.models.base import scores_from_logits
from hft_infer.models.custom import load_configured
from hft_infer.models.dataset import instrument_order, raw_rows, window_index
from hft_infer.models.evaluation import window_logits
from hft_infer.runner.select import conflates
from hft_infer.runner.self_check import TOLERANCE
from hft_infer.transport.schema import Decision, Outcome, Reason

DEFAULT_TOLERANCE = TOLERANCE["fp32"]  # float32 batched vs per-window recompute differ by ~1e-6 on mlp_small (tests)


def default_tolerance(cfg: Config, service_precision: str | None = None) -> tuple[float, str]:
    """--verify's tolerance when none is given, and a note when the service and the config disagree:
    the rounding that the service's precision allows (its Status says which; else the config's
    runner.precision), the figure the engines' start-up self-check holds them to (fp32 1e-4, tf32
    5e-3, bf16 3e-2): a bf16 service's scores differ from the float32 reference by up to ~3e-3."""
    configured = cfg.runner.precision
    precision = service_precision if service_precision in TOLERANCE else configured
    note = ""
    if precision != configured and not (configured == "tf32" and precision == "fp32"):
        note = (f"verify: the service runs precision {precision} where the config says {configured}: "
                f"holding its scores to {precision}'s tolerance {TOLERANCE[precision]:g}")
    return TOLERANCE[precision], note


@dataclass
class Mismatch:
    instrument: int
    seq: int
    live_score: float
    ref_score: float
    live_action: int
    ref_action: int
    what: str  # "score" | "action"


@dataclass
class VerifyResult:
    compared: int
    max_abs_diff: float
    mismatches: list[Mismatch] = field(default_factory=list)
    model_version: str = ""

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def report(self, show: int = 10) -> str:
        lines = [f"verify: {self.compared:,} decisions compared with the offline reference ({self.model_version}); "
                 f"max |score diff| {self.max_abs_diff:.3g}; {len(self.mismatches)} mismatches"]
        for m in self.mismatches[:show]:
            lines.append(f"  instrument {m.instrument} seq {m.seq}: {m.what} live score {m.live_score:+.6f} "
                         f"action {m.live_action:+d} / reference score {m.ref_score:+.6f} action {m.ref_action:+d}")
        if len(self.mismatches) > show:
            lines.append(f"  ... {len(self.mismatches) - show} more")
        return "\n".join(lines)


def reference_scores(model, events: np.ndarray, *, mode: str) -> np.ndarray:
    """float64 score of every event (as if each were decided), in table order."""
    spec = model.spec
    rows = raw_rows(events, spec.levels)
    n = events.shape[0]
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    with torch.inference_mode():
        if spec.kind in ("mlp", "custom"):  # window models: missing rows are zero rows
            index, _ = window_index(events, spec.window)
            return scores_from_logits(window_logits(model, rows, index)).double().numpy()
        order, starts, counts = instrument_order(events)
        for start, count in zip(starts.tolist(), counts.tolist()):
            if count == 0:
                continue
            idx = order[start:start + count]
            seq_rows = torch.from_numpy(rows[idx])
            if mode == "stream":
                scores, _ = model.forward_stream(seq_rows[None])
                out[idx] = scores[0].double().numpy()
                continue
            w = spec.window
            # windows rows max(0, t-W+1)..t: full windows batched, the first W-1 ones one by one
            if count >= w:
                windows = seq_rows.unfold(0, w, 1).permute(0, 2, 1)  # [count-w+1, W, F]
                out[idx[w - 1:]] = model.forward_window(windows.contiguous()).double().numpy()
            for t in range(min(w - 1, count)):
                out[idx[t]] = float(model.forward_window(seq_rows[None, : t + 1])[0])
    return out


_UNAPPLIED = (Reason.QUEUE_FULL, Reason.LATE)  # shed at ingest before their rows were written


def applied_events(decisions: list[Decision], events: np.ndarray) -> np.ndarray:
    """The events a sequentially scheduled service applied: all but those shed QUEUE_FULL or LATE."""
    unapplied = {(d.instrument, d.seq) for d in decisions
                 if d.status == Outcome.SHED and d.reason in _UNAPPLIED}
    if not unapplied:
        return events
    keep = [(i, s) not in unapplied for i, s in zip(events["instrument"].tolist(), events["seq"].tolist())]
    return events[np.asarray(keep, dtype=bool)]


def policy_actions(scores: list[float], threshold: float, hysteresis: float) -> list[int]:
    """The decision policy (models/decision.py) over one instrument's decided scores, in order."""
    actions, held = [], 0
    stay = threshold - hysteresis
    for s in scores:
        if s > threshold:
            held = 1
        elif s < -threshold:
            held = -1
        elif held == 1 and s >= stay:
            held = 1
        elif held == -1 and s <= -stay:
            held = -1
        else:
            held = 0
        actions.append(held)
    return actions


def verify(decisions: list[Decision], events: np.ndarray, cfg: Config, *, tolerance: float = DEFAULT_TOLERANCE,
           service_model_version: str | None = None) -> VerifyResult:
    model, version = load_configured(cfg.model)
    if service_model_version and service_model_version != version:
        raise ValueError(f"the service runs {service_model_version} but the config names {version}: "
                         "verify with the service's config")
    if model.spec.kind != "custom":  # a custom module runs as given (it may fix its own dtypes)
        model = model.double()  # the reference in float64; differences are the service's float32 rounding
    if not conflates(model, cfg):
        events = applied_events(decisions, events)
    ref = reference_scores(model, events, mode=cfg.model.mode)
    key = {(int(i), int(s)): k for k, (i, s) in enumerate(zip(events["instrument"].tolist(), events["seq"].tolist()))}
    by_inst: dict[int, list[tuple[int, Decision, int]]] = {}
    for d in decisions:
        if d.status != Outcome.DECIDED:
            continue
        k = key.get((d.instrument, d.seq))
        if k is not None:
            by_inst.setdefault(d.instrument, []).append((d.seq, d, k))
    th, hy = cfg.decision.threshold, cfg.decision.hysteresis
    result = VerifyResult(0, 0.0, model_version=version)
    for inst, items in by_inst.items():
        items.sort(key=lambda x: x[0])
        ref_scores = [float(ref[k]) for _, _, k in items]
        ref_actions = policy_actions(ref_scores, th, hy)
        for (seq, d, _), rs, ra in zip(items, ref_scores, ref_actions):
            result.compared += 1
            diff = abs(d.score - rs)
            result.max_abs_diff = max(result.max_abs_diff, diff)
            if diff > tolerance:
                result.mismatches.append(Mismatch(inst, seq, d.score, rs, d.action, ra, "score"))
            elif d.action != ra and min(abs(rs - th), abs(rs + th), abs(rs - (th - hy)),
                                        abs(rs + (th - hy))) > tolerance:
                result.mismatches.append(Mismatch(inst, seq, d.score, rs, d.action, ra, "action"))
    result.mismatches.sort(key=lambda m: (m.instrument, m.seq))
    return result
