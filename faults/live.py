"""Which faults can act on a LIVE engine's replies (`rollout-bench proxy`, `run --upstream`), and why not.

In front of a live engine the proxy gets a real answer, then lets the plan edit it exactly as the mock's
recorded answers are edited: drop or break logprobs, abort it, report a stale version, replace it by an
HTTP error, hold it, cut it. A few faults need what only the mock has, and are refused by name when the
plan is loaded rather than silently never firing:

- `abort_all_on_weight_update` aborts the generations in flight in the mock's own scheduler when its
  weight version changes; a live engine's in-flight requests are its own (send the update with
  `abort_all_requests: true` and the engine aborts them itself).
- `stale_retry` is applied by the bench's target adapter; a bare proxy has none (allowed in `run --upstream`,
  where the target adapter runs).
- Faults that write text or token ids the engine never produced (a tool call, a poison marker, a stop token)
  need the model's tokenizer (`--tokenizer DIR`, or the bench's own when the upstream speaks it).

Every fault type must appear in `LIVE` (a test checks), so a new fault is classified on purpose.
"""

from __future__ import annotations

from .base import FAULTS, fault_class
from .plan import Plan, PlanError

APPLIES, NEEDS_TOKENIZER, CLIENT_SIDE, REFUSED = "applies", "needs tokenizer", "client side", "refused"

# fault name -> (kind, why: said in the error when refused, or what it does to a live reply)
LIVE: dict[str, tuple[str, str]] = {
    "abort": (NEEDS_TOKENIZER, "keeps a share of the engine's tokens and decodes their text"),
    "abort_all_on_weight_update": (REFUSED, "it aborts the generations in flight in the mock's own scheduler on "
                                   "a weight update; a live engine's in-flight requests are the engine's (send "
                                   "the update with abort_all_requests=true to have the engine abort them)"),
    "connection_reset": (APPLIES, "the proxy drops the connection instead of answering"),
    "context_length_error": (APPLIES, "the proxy answers the context-length 400 instead of the engine's reply"),
    "empty_completion": (NEEDS_TOKENIZER, "replaces the reply by a stop with no tokens (the stop token's id)"),
    "hold_weights": (REFUSED, "it keeps the mock's weight version from advancing between the steps of run --steps; "
                     "a live engine's weights are its trainer's to publish"),
    "http_error": (APPLIES, "the proxy answers the error status instead of the engine's reply"),
    "latency": (APPLIES, "the proxy holds the engine's reply"),
    "logprob_length_mismatch": (APPLIES, "the proxy shortens or lengthens the reply's logprob entries"),
    "malformed_json": (APPLIES, "the proxy cuts the reply's JSON"),
    "missing_logprobs": (APPLIES, "the proxy drops the reply's logprobs"),
    "missing_weight_version": (APPLIES, "the proxy drops the reply's weight_version"),
    "nan_logprob": (APPLIES, "the proxy writes one logprob as NaN"),
    "null_logprob": (APPLIES, "the proxy writes one logprob as null"),
    "outage": (APPLIES, "the proxy answers the router's 503 (or the status) while the schedule holds"),
    "oversized_tool_output": (NEEDS_TOKENIZER, "writes a tool call the engine never made: its token ids"),
    "raise_after_generate": (NEEDS_TOKENIZER, "writes a poison marker into the reply: its token ids"),
    "router_no_workers": (APPLIES, "the proxy answers the router's no-available-workers 503"),
    "slow_first_token": (APPLIES, "the proxy holds the reply's first token"),
    "stale_retry": (CLIENT_SIDE, "it is applied by the bench's target adapter, which a bare proxy in front of "
                    "your own client does not have (use it with run --upstream)"),
    "stale_weight_version": (APPLIES, "the proxy reports an older weight_version than the engine's"),
    "stall": (APPLIES, "the proxy sends nothing until the client gives up"),
    "stream_cut": (APPLIES, "the proxy ends the re-sent stream early"),
    "stream_no_finish_reason": (APPLIES, "the proxy's re-sent stream carries no finish reason"),
    "text_without_ids": (APPLIES, "the proxy drops the OpenAI reply's token-id fields"),
    "truncated_body": (APPLIES, "the proxy cuts the reply's body"),
    "wrong_content_type": (APPLIES, "the proxy sends the reply under another content type"),
    "zero_length": (NEEDS_TOKENIZER, "replaces the reply by a length finish with no tokens"),
}


def refusal(name: str, *, tokenizer: bool, adapter: bool) -> str | None:
    """Why fault `name` cannot act on live replies here (None: it can). `tokenizer`: the proxy has the model's
    tokenizer; `adapter`: a bench target adapter runs the client (`run --upstream`)."""
    fault_class(name)  # an unknown name fails with the valid choices
    kind, why = LIVE.get(name, (REFUSED, "it is not classified for live engines yet (faults/live.py)"))
    if kind == REFUSED or kind == CLIENT_SIDE and not adapter:
        return why
    if kind == NEEDS_TOKENIZER and not tokenizer:
        return f"it {why}, which needs the model's tokenizer: give --tokenizer DIR (a local tokenizer folder)"
    return None


def check_live_plan(plan: Plan, *, tokenizer: bool, adapter: bool) -> None:
    """Refuse a plan with a fault that cannot act on a live engine's replies, naming the rule, fault and why."""
    for rule in plan.rules:
        why = refusal(rule.fault.name, tokenizer=tokenizer, adapter=adapter)
        if why is not None:
            where = f" ({plan.source})" if plan.source else ""
            raise PlanError(f"plan {plan.name!r}{where}: rule {rule.name!r}: fault {rule.fault.name!r} cannot apply "
                            f"to a live engine's replies: {why}")


def unclassified() -> list[str]:
    """Fault types registered but missing from `LIVE` (a test keeps this empty)."""
    fault_class("abort")  # registers the catalogue
    return sorted(set(FAULTS) - set(LIVE))
