"""Token alignment: response ids, logprobs, loss mask and response length agree; no zero-filled logprobs."""

from __future__ import annotations

from .base import RunView, Violation, preceding

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
    return out
