"""Token alignment: response ids, logprobs, loss mask and response length agree; no zero-filled logprobs, and no
trained token (loss mask 1) whose logprob is not a finite number: one NaN makes the importance ratio, and so
the whole batch's loss, NaN."""

from __future__ import annotations

import math

import numpy as np

from bench.records.sample import SampleRecord

from .base import RunView, Violation, preceding
from .token_arrays import trained

NAME = "token_alignment"


def check(view: RunView) -> list[Violation]:
    out = []
    for record in view.records:
        if record.outcome not in ("completed", "truncated", "aborted"):
            continue
        lengths = {"response_ids": len(record.response_ids), "loss_mask": len(record.loss_mask),
                   "response_length": record.response_length}
        if record.logprobs is not None:
            lengths["logprobs"] = len(record.logprobs)
        if len(set(lengths.values())) > 1:
            out.append(Violation(NAME, record.trajectory, f"lengths disagree: {lengths}", lengths,
                                 preceding(view, record.trajectory, record)))
        elif record.outcome == "completed" and record.logprobs is None and record.response_length:
            out.append(Violation(NAME, record.trajectory, "completed sample without logprobs",
                                 {"response_length": record.response_length}, preceding(view, record.trajectory, record)))
        elif record.logprobs and len(record.logprobs) > 1 and all(lp == 0.0 for lp in record.logprobs):
            out.append(Violation(NAME, record.trajectory, "logprobs are all exactly 0.0 (zero-filled)",
                                 {"logprobs": len(record.logprobs)}, preceding(view, record.trajectory, record)))
        elif record.logprobs and record.outcome != "aborted" and not _trained_all_finite(view, record):
            bad = [i for i, (lp, trained) in enumerate(zip(record.logprobs, record.loss_mask))
                   if trained and not _finite(lp)]
            if bad:
                out.append(Violation(
                    NAME, record.trajectory,
                    f"trains on {len(bad)} non-finite logprob(s) ({record.logprobs[bad[0]]} at response position "
                    f"{bad[0]})", {"positions": bad[:20], "count": len(bad), "first": repr(record.logprobs[bad[0]])},
                    preceding(view, record.trajectory, record)))
    return out


def _trained_all_finite(view: RunView, record: SampleRecord) -> bool:
    """True when every trained logprob is a finite plain number, said over an array (the usual case); False
    sends the record to the token-by-token check, which names the positions."""
    logprobs = trained(view.memo, record).logprobs
    return logprobs is not None and bool(np.isfinite(logprobs).all())


def _finite(logprob: object) -> bool:
    return isinstance(logprob, (int, float)) and math.isfinite(logprob)
