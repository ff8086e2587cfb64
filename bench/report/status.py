"""Is each sample's status honest? A sample whose response was cut (at the context, or by the length limit of its
last answer) is not COMPLETED, whatever its tokens look like.

Reported, not an invariant: a dishonest COMPLETED sample can be aligned and within budget (slime's retool at
41dc3b6 trims an oversized tool output to the context, then its final status match overwrites TRUNCATED with
the last answer's `stop`). What reads the status decides what it costs: slime passes it to training only as the
`truncated` flag, which its logging turns into `truncated_ratio`; a user's filter or reward that keys on it
would keep a cut sample as finished. So the report names every such sample, and the run fails on it only
through the invariants that see real damage (`context_budget` when the cut did not happen).
"""

from __future__ import annotations

from typing import Any

from bench.records.request_log import RequestRecord
from bench.records.sample import SampleRecord

HONEST = "honest"
JUDGED = ("completed", "truncated", "aborted")  # outcomes that came back with a status to judge


def status_verdicts(records: list[SampleRecord], requests: list[RequestRecord],
                    context_length: int) -> dict[str, str]:
    """Per trajectory that came back: `honest`, or what its COMPLETED status hides."""
    last: dict[str, RequestRecord] = {}  # each trajectory's last answer (an error or a stray is no answer)
    for request in requests:
        if request.trajectory is None or not 200 <= (request.status or 0) < 300:
            continue
        if request.trajectory not in last or request.seq > last[request.trajectory].seq:
            last[request.trajectory] = request
    verdicts: dict[str, str] = {}
    for record in records:
        if record.outcome not in JUDGED:
            continue
        cuts = []
        if record.outcome == "completed":
            total = record.prompt_length + record.response_length
            final = last.get(record.trajectory)
            if total > context_length:
                cuts.append(f"over the context ({total} of {context_length} tokens)")
            elif total == context_length and not _model_stopped_last(record, final):
                cuts.append(f"cut at the context ({total} of {context_length} tokens)")
            if final is not None and final.finish == "length":
                cuts.append(f"its last answer (turn {final.turn}) was cut by length")
        verdicts[record.trajectory] = (f"{record.status or 'completed'} though " + " and ".join(cuts)) if cuts \
            else HONEST
    return verdicts


def _model_stopped_last(record: SampleRecord, final: RequestRecord | None) -> bool:
    """The response ends with the model's own stop (its last answer finished `stop` and the last token is the
    model's, not a tool output appended after it): filling the context exactly that way is finishing."""
    return final is not None and final.finish == "stop" and bool(record.loss_mask) and record.loss_mask[-1] == 1


def honesty_summary(verdicts: dict[str, str]) -> dict[str, Any]:
    """How many statuses were judged, and every dishonest one by trajectory."""
    return {"judged": len(verdicts), "dishonest": {t: v for t, v in sorted(verdicts.items()) if v != HONEST}}


def honesty_line(summary: dict[str, Any]) -> str | None:
    """The terminal line, when some status was dishonest."""
    dishonest = summary.get("dishonest") or {}
    if not dishonest:
        return None
    shown = "; ".join(f"{trajectory}: {verdict}" for trajectory, verdict in list(dishonest.items())[:3])
    more = f"; {len(dishonest) - 3} more in summary.json" if len(dishonest) > 3 else ""
    return (f"{len(dishonest)} of {summary['judged']} samples cut yet reported finished (not a violation: "
            f"what reads the status miscounts them): {shown}{more}")
