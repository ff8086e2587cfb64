"""Retry discipline: no retry storm, and terminal errors (the router's no-workers 503) fail fast.

Two checks over the server's request log (joined with the fault log), per trajectory:

- storm: the requests for one turn of one trajectory (its attempts: retries, replacement
  rollouts) stay within `bounds.max_requests_per_trajectory`. Counting per turn keeps long
  multi-turn trajectories, which legitimately send one request per turn, out of it. Attempts
  are the same request sent again: same turn and same prompt length. A conversation that left
  the recording (a drifted reply) keeps being identified as its last recorded turn, but each of
  its new turns is longer, so they are not mistaken for retries.
- terminal: once the trajectory got a terminal answer (a 503 carrying a `router_no_workers` or
  `outage` fault: "No available workers"), at most `bounds.max_requests_after_terminal` further
  requests are sent for it, up to and including the first that succeeds. Retrying into a dead fleet is what turns an outage
  into churn; once a request succeeds the fleet is back, and a multi-turn client's next turns are
  progress, not retries (a later terminal answer is judged on its own).

An outage event whose answer another rule replaced (a 429 fired on the same attempt) is not a
terminal answer: the logged status of that request tells which answer the client saw.

And one check over the whole batch, for churn spread too thin for the per-trajectory ones (a
scheduler replacing errored groups sends each trajectory only a few times, but the batch keeps
re-sending and finishes nothing):

- batch churn: re-sends (requests beyond the first for each (trajectory, turn, prompt length),
  the same unit of work as above) stay within `bounds.max_resends_per_finished_turn` for each
  turn of a finished sample, plus one group's worth of the per-trajectory bound (group size x
  (`max_requests_per_trajectory` - 1): what one group may spend without tripping the storm check,
  e.g. the group a fail-fast scheduler stops on). Finished means a completed or truncated record;
  its turns are the distinct units its trajectory sent, so multi-turn samples count as the
  requests their work needed. First attempts are free: a batch that sends everything once into
  an outage and reports it failed is not churning. When the target raised, its `lost`
  trajectories are left out: what a batch that stopped had in flight is the stop's
  (batch_survival, the summary's orphaned_requests), not churn. The evidence also gives
  requests per finished sample and groups started (reached, plus replacement rounds: a
  group's first turn sent again to every member) against groups with a finished sample.
  The log cannot tell a replacement group from a client's own retry of the same request, and
  the check does not try: a client retrying every request into an outage that outlasts the
  run (an SDK's `max_retries=1`, each trajectory within its per-trajectory allowance) doubles
  the load on a dead fleet and finishes nothing, which is the same churn.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from bench.records.request_log import RequestRecord

from .base import RunView, Violation, preceding
from .churn import measure_churn

NAME = "retry_discipline"
TERMINAL = {"router_no_workers", "outage"}  # faults answering the router's no-available-workers 503
TERMINAL_STATUS = 503


def _statuses(requests: list[RequestRecord]) -> dict[str, int]:
    return dict(sorted(Counter(str(r.status) for r in requests).items()))


def check(view: RunView) -> list[Violation]:
    by_trajectory: dict[str, list[RequestRecord]] = defaultdict(list)
    for request in view.requests:  # the log is in arrival order
        if request.trajectory is not None:
            by_trajectory[request.trajectory].append(request)
    terminal_keys = {(e.trajectory, e.turn, e.attempt) for e in view.fault_events if e.fault in TERMINAL}
    outcomes = {r.trajectory: r.outcome for r in view.records}
    bound = view.bounds.max_requests_per_trajectory
    limit = view.bounds.max_requests_after_terminal
    out = []
    for trajectory, requests in by_trajectory.items():
        per_request: dict[tuple[int, int], list[RequestRecord]] = defaultdict(list)
        for request in requests:
            per_request[(request.turn or 0, request.prompt_tokens or 0)].append(request)
        (turn, _), attempts = max(per_request.items(), key=lambda item: (len(item[1]), -item[0][0]))
        if len(attempts) > bound:
            failed = sum(1 for r in attempts if r.status != 200)
            out.append(Violation(
                NAME, trajectory,
                f"retry storm: {len(attempts)} requests for turn {turn} of one trajectory ({failed} failed; "
                f"bound {bound})",
                {"requests": len(attempts), "failed_requests": failed, "turn": turn, "bound": bound,
                 "statuses": _statuses(attempts), "outcome": outcomes.get(trajectory)},
                preceding(view, trajectory)))
        terminal = [i for i, r in enumerate(requests) if r.status == TERMINAL_STATUS
                    and (trajectory, r.turn or 0, r.attempt) in terminal_keys]
        if not terminal:
            continue
        start, after = _worst_terminal_streak(requests, terminal)
        first = requests[start]
        if len(after) > limit:
            out.append(Violation(
                NAME, trajectory,
                f"kept retrying a terminal error: {len(after)} requests after a no-available-workers answer, up to "
                f"and including the first that succeeded, {len(terminal)} such answers in all (bound {limit} after it)",
                {"terminal_answers": len(terminal), "requests_after_terminal": len(after), "bound": limit,
                 "first_terminal": {"turn": first.turn, "attempt": first.attempt},
                 "statuses_after": _statuses(after), "outcome": outcomes.get(trajectory)},
                preceding(view, trajectory)))
    return out + _batch_churn(view)


def _worst_terminal_streak(requests: list[RequestRecord], terminal: list[int]) -> tuple[int, list[RequestRecord]]:
    """The terminal answer followed by the most requests before the trajectory's next success, and those requests.

    A success (2xx) ends the streak: the fleet answered, and what a multi-turn client sends next is its next
    turn, not a retry into a dead fleet. A later terminal answer starts a streak of its own."""
    best: tuple[int, list[RequestRecord]] = (terminal[0], [])
    pending = set(terminal)
    index = 0
    while index < len(requests):
        if index not in pending:
            index += 1
            continue
        streak: list[RequestRecord] = []
        following = index + 1
        while following < len(requests):
            streak.append(requests[following])
            if 200 <= (requests[following].status or 0) < 300:
                break
            following += 1
        if len(streak) > len(best[1]):
            best = (index, streak)
        index = following + 1
    return best


def _batch_churn(view: RunView) -> list[Violation]:
    churn = measure_churn(view)
    group_budget = churn.largest_group * (view.bounds.max_requests_per_trajectory - 1)
    per_turn = view.bounds.max_resends_per_finished_turn
    allowed = per_turn * churn.finished_turns + group_budget
    if churn.resends <= allowed:
        return []
    return [Violation(
        NAME, None,
        f"batch retry storm: {churn.resends} re-sends ({churn.failed_resends} failed) for {churn.finished_turns} "
        f"turns of {churn.finished} finished samples (bound {per_turn:g} per finished turn + {group_budget} for one "
        f"group = {allowed:g}); {churn.requests} requests over {churn.trajectories} trajectories; "
        f"{churn.groups_started} group rounds started for {churn.groups_reached} groups, "
        f"{churn.groups_finished} finished",
        {**churn.as_evidence(), "bound_per_finished_turn": per_turn, "group_budget": group_budget,
         "allowed_resends": allowed},
        None)]
