"""Findings across the steps of one run, each with its evidence per step.

- `step_resources`: a resource the worker holds grows with steps. Counts (live asyncio tasks, threads, open file
  descriptors, sockets, child processes) leak when, over at least three measured steps, the count is higher after
  every step than after the step before: a pool or cache the first steps fill (a thread pool, a connection pool
  that grows to the concurrency) stops growing, a leak does not. Resident memory leaks when it ends
  more than `RSS_BOUND_BYTES` (64 MiB) above its level after the first step, having grown in at least half of
  the steps after it.
- `step_late_requests`: requests of a step's trajectories that arrived once a later step had begun (its weights
  published, after the step's rollout returned): something the step started (an orphaned task, a thread) still
  calls the server. Requests arriving between a step's return and the next step's start are not counted: a
  request sent just before the rollout raised can reach the server after it. A trajectory's step here is the one
  that trained on it (handed over in it) when it was handed over: an asynchronous rollout (AReaL's
  `prepare_batch`) generates a trajectory on through later steps until a step takes it, by design.
- `step_carryover`: a step that failed after an earlier step had failed, on a trajectory no injected fault that
  fired during the step reached (or naming none), or with an earlier failed step's very error (its type, message and
  trajectory: a dead worker thread's, which a health check re-raises each step): what the earlier failure left
  behind (a dirtied singleton, a half-closed client, a dead thread) is the first suspect. The evidence has both
  errors and what the process held after each.
- `step_weights`: a step whose weights the adapter's trainer side published (`update_weights`) but the server did
  not serve: the version the server held when the step's rollout began is not the one the trainer says it
  published (an update never sent, refused, or kept out by a `hold_weights` rule). The evidence has both versions,
  what the step was served, and the requests without a trajectory (the trainer's admin calls) that reached the
  server between the previous step's return and the step's start. An update the server applied before the step
  began that named no version is the sync having taken effect: SGLang moves its version label only when an update
  names one (`tokenizer_communicator_mixin.py`, `_update_weight_version_if_provided`), and AReaL's never do
  (`sglang_remote.py`, `build_distributed_weight_update_requests`): its label stays where it was. Only an adapter
  that declares such syncs (`versionless_weight_sync`) is judged so; for the others such an update is a miss.
"""

from __future__ import annotations

from typing import Any

from bench.invariants.base import Violation
from bench.invariants.root_cause import root_cause
from bench.records.request_log import RequestRecord
from bench.records.sample import ErrorInfo, SampleRecord
from faults import FaultEvent

from .board import ADAPTER, StepBoard, StepState

CHECKS = ("step_resources", "step_late_requests", "step_carryover", "step_weights", "step_lag")  # a multi-step run's
COUNTED = ("tasks", "threads", "sockets", "fds", "children")  # sockets before fds: see `resource_growth`
RSS_BOUND_BYTES = 64 * 1024 * 1024
# A count is judged from the end of step 1 on: the first step fills the pools (a client's connections growing to
# the concurrency, a thread pool), so it is warm-up; a leak then grows after each of at least 3 more steps.
WARM_UP_STEPS = 1
MIN_STEPS_FOR_GROWTH = WARM_UP_STEPS + 3
_LISTED = 5


def check_steps(board: StepBoard, requests: list[RequestRecord], fault_events: list[FaultEvent],
                consumed: dict[str, int] | None = None) -> list[Violation]:
    """`consumed`: the step each trajectory was handed over in (default: its own step)."""
    return [*resource_growth(board.states), *late_requests(board, requests, consumed),
            *carryover(board.states, fault_events), *weights_not_served(board, requests)]


def _measured(states: list[StepState], key: str) -> list[tuple[int, Any]]:
    return [(s.step, s.resources.get(key)) for s in states
            if s.resources is not None and s.resources.get(key) is not None]


def resource_growth(states: list[StepState]) -> list[Violation]:
    out = []
    growth: dict[str, int] = {}
    for kind in COUNTED:
        series = _measured(states, kind)
        if len(series) < MIN_STEPS_FOR_GROWTH:
            continue
        counts = [count for _, count in series]
        judged = counts[WARM_UP_STEPS:]
        if all(later > earlier for earlier, later in zip(judged, judged[1:])):  # more after every step past warm-up
            growth[kind] = counts[-1] - counts[0]
            if kind == "fds" and growth["fds"] <= growth.get("sockets", 0):
                continue  # the sockets account for every new descriptor: one finding, not two
            first = next(step for step, count in series if count > counts[0])
            out.append(_growth(kind, series, first, states))
    rss = _measured(states, "rss_bytes")
    if len(rss) >= MIN_STEPS_FOR_GROWTH:
        values = [value for _, value in rss]
        grew = sum(later > earlier for earlier, later in zip(values, values[1:]))
        if values[-1] - values[0] > RSS_BOUND_BYTES and grew * 2 >= len(values) - 1:
            first = next(step for step, value in rss if value - values[0] > RSS_BOUND_BYTES)
            out.append(_growth("rss_bytes", rss, first, states))
    return out


def _growth(kind: str, series: list[tuple[int, Any]], first: int, states: list[StepState]) -> Violation:
    named_kind = {"fds": "files", "rss_bytes": None}.get(kind, kind)
    by_step = {s.step: s for s in states}
    new: list[str] = []
    if named_kind is not None:
        before = set((by_step[series[0][0]].resources or {}).get("named", {}).get(named_kind, []))
        after = (by_step[series[-1][0]].resources or {}).get("named", {}).get(named_kind, [])
        new = [name for name in after if name not in before][:_LISTED]
    shown = (lambda v: f"{v / 2**20:.0f} MiB") if kind == "rss_bytes" else str
    return Violation(
        "step_resources", None,
        f"{kind} grow with steps: {' -> '.join(shown(v) for _, v in series)} after steps "
        f"{series[0][0]}-{series[-1][0]}; first above step {series[0][0]}'s level after step {first}"
        + (f"; new since step {series[0][0]}: {'; '.join(new)}" if new else ""),
        {"check": "resources", "resource": kind, "first_step": first,
         "per_step": {str(step): value for step, value in series}, "new": new,
         "bound": (f"more than {RSS_BOUND_BYTES // 2**20} MiB above step {series[0][0]}'s level, growing in at least "
                   "half of the steps" if kind == "rss_bytes" else
                   "higher after every step than after the step before")})


def late_requests(board: StepBoard, requests: list[RequestRecord],
                  consumed: dict[str, int] | None = None) -> list[Violation]:
    """Requests of step k's trajectories (those handed over in step k) that arrived after step k returned and step
    k+1 began."""
    by_step: dict[int, list[tuple[RequestRecord, int]]] = {}
    states = board.states
    consumed = consumed or {}
    for request in requests:
        trajectory = request.trajectory or ""
        step = consumed.get(trajectory, board.step_of.get(trajectory))
        if step is None or step >= len(states) - 1:
            continue  # the last step that ran: nothing ran after it (its leftovers died with the worker)
        returned, following = states[step].returned, states[step + 1].started
        if returned is None or request.started <= max(returned, following):
            continue  # arrived before the next step began: sent before the step returned, or in its last moments
        running = max((s.step for s in states if s.started <= request.started), default=step)
        by_step.setdefault(step, []).append((request, running))
    out = []
    for step, late in sorted(by_step.items()):
        returned = states[step].returned or 0.0
        listed = [{"trajectory": r.trajectory, "turn": r.turn, "endpoint": r.endpoint, "seq": r.seq,
                   "after_return_s": round(r.started - returned, 3), "during_step": running,
                   "weight_version": r.weight_version} for r, running in late[:_LISTED]]
        during = sorted({running for _, running in late})
        out.append(Violation(
            "step_late_requests", late[0][0].trajectory,
            f"{len(late)} requests for step {step} arrived after its rollout returned (during step"
            f"{'s' if len(during) > 1 else ''} {', '.join(map(str, during))}): something step {step} started still "
            f"calls the server", {"check": "late_requests", "step": step, "first_step": during[0],
                                  "count": len(late), "during_steps": during, "first": listed},
            occurrences=len(late)))
    return out


def carryover(states: list[StepState], fault_events: list[FaultEvent]) -> list[Violation]:
    """A failed step after an earlier failed step that its own faults do not explain: it repeats an earlier failed
    step's error (same type, message and trajectory: a dead thread's exception raised again), or no injected fault
    that fired during the step reached the trajectory that raised. A fault's time, not the trajectory's slice,
    says which step it belongs to: a rollout that generates ahead runs a slice-k trajectory in step k+1."""
    failed = [s for s in states if s.error is not None]
    if len(failed) < 2:
        return []
    first = failed[0]
    out = []
    for state in failed[1:]:
        assert state.error is not None and first.error is not None
        repeated = next((s for s in failed if s.step < state.step and _same_error(s.error, state.error)), None)
        end = state.returned if state.returned is not None else float("inf")
        cause = root_cause(state.error, [e for e in fault_events if state.started <= e.time <= end])
        if cause.fault is not None and repeated is None:
            continue  # an injected fault reached the code that raised, in this step: that explains it
        out.append(Violation(
            "step_carryover", state.error.trajectory,
            f"step {state.step} failed after step {first.step} had failed ({first.error.type}): "
            + (f"step {repeated.step}'s error raised again: " if repeated is not None else "")
            + cause.explain()[:500],
            {"check": "carried_over", "step": state.step, "after_step": first.step, "first_step": state.step,
             "repeats_step": None if repeated is None else repeated.step,
             "error": {"type": state.error.type, "message": state.error.message, "trajectory": state.error.trajectory,
                       "traceback": state.error.last_frames(12)},
             "first_error": {"type": first.error.type, "message": first.error.message,
                             "trajectory": first.error.trajectory, "traceback": first.error.last_frames(12)},
             "held_after": {str(s.step): _counts(s) for s in states if first.step <= s.step <= state.step}}))
    return out


def _same_error(earlier: ErrorInfo | None, later: ErrorInfo) -> bool:
    return earlier is not None and (earlier.type, earlier.message, earlier.trajectory) == (
        later.type, later.message, later.trajectory)


def _counts(state: StepState) -> dict[str, Any] | None:
    if state.resources is None:
        return None
    return {key: state.resources.get(key) for key in (*COUNTED, "rss_bytes")}


def weights_not_served(board: StepBoard, requests: list[RequestRecord]) -> list[Violation]:
    """Steps the adapter's trainer published weights for that the server did not hold when the step began."""
    out = []
    for index, state in enumerate(board.states):
        if state.published_by != ADAPTER or state.trainer_version is None or state.began is None \
                or state.trainer_version == state.weight_version or _unlabelled_update(state):
            continue
        since = (board.states[index - 1].returned or 0.0) if index > 0 else 0.0
        calls = [{"endpoint": q.endpoint, "status": q.status, "seq": q.seq} for q in requests
                 if q.trajectory is None and not q.endpoint.startswith("/bench/") and since <= q.started <= state.began]
        served = sorted({q.weight_version for q in requests if board.step_of.get(q.trajectory or "") == state.step
                         and q.weight_version is not None})
        why = (f"kept out by {', '.join(state.held_by)}: {len(state.ignored_updates)} update "
               f"request{'s' if len(state.ignored_updates) != 1 else ''} answered, not applied"
               if state.ignored_updates else
               f"no update took effect ({', '.join(c['endpoint'] for c in calls)} reached the server)" if calls else
               "no admin request reached the server before the step")
        out.append(Violation(
            "step_weights", None,
            f"weights not updated for step {state.step}: the trainer published v{state.trainer_version}, the server "
            f"still held v{state.weight_version} when the step began ({why}); the step was served "
            f"{', '.join(f'v{v}' for v in served) or 'nothing'}",
            {"check": "weights", "step": state.step, "first_step": state.step,
             "trainer_version": state.trainer_version, "server_version": state.weight_version,
             "versions_served": served, "held_by": state.held_by, "ignored_updates": state.ignored_updates,
             "admin_requests": calls[:3 * _LISTED]}))
    return out


def _unlabelled_update(state: StepState) -> bool:
    """Did the server apply, before the step began, a weight update naming no version (the label could not move),
    for an adapter that declares its framework's syncs never name one (`versionless_weight_sync`: AReaL, verl)?
    Elsewhere (slime, miles) an update that drops its version is the regression the check is for."""
    assert state.began is not None
    return state.versionless_sync and any(u["weight_version"] is None and u["at"] <= state.began
                                          for u in state.applied_updates)


_TRAINED = ("completed", "truncated")


def trained_against(board: StepBoard, state: StepState, record: SampleRecord) -> int | None:
    """The weight version a record was trained against: the later of the version the step's trainer published
    (`trainer_weights`, held before the step's rollout began) and the one the server held when the record was
    handed over. A trainer that trains several times in one step (open-instruct: one bench step is several of its
    training steps) syncs after each, moving the server's label under the step; a sync that names no version
    (AReaL's, verl's) leaves the label behind and the trainer's version stands. None: neither is a number."""
    versions = [state.trainer_weights]
    if record.handed_over_at is not None:
        versions.append(board.version_at(record.handed_over_at) or "")
    numbers = [int(v) for v in versions if v.isdigit()]
    return max(numbers) if numbers else None


def sample_lag(board: StepBoard, state: StepState, record: SampleRecord) -> int | None:
    """Versions between what a trained-on record (completed or truncated) was trained against and the oldest
    version it says it was served (0: on policy); None when it was not trained on or no version is a number."""
    versions = [int(v) for v in record.weight_versions if v.isdigit()]
    against = trained_against(board, state, record)
    if record.outcome not in _TRAINED or not versions or against is None:
        return None
    return against - min(versions)


def lag_bound(board: StepBoard, records: list[SampleRecord], consumed: dict[str, int], bound: int) -> list[Violation]:
    """`step_lag`: a trained-on sample whose oldest served weight version lags the weights it was trained against
    (`trained_against`: those of the step that trained on it, the step running when the rollout handed it over,
    or the server's then if the trainer synced since) by more than `bound` versions. An async rollout hands over
    samples generated under earlier weights; how old it may hand them is the framework's configured bound
    (`max_weight_lag`, declared by the adapter, or `--max-weight-lag`)."""
    by_step = {s.step: s for s in board.states}
    late: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        step = consumed.get(record.trajectory)
        state = by_step.get(step) if step is not None else None
        lag = None if state is None else sample_lag(board, state, record)
        if state is not None and lag is not None and lag > bound:
            late.setdefault(state.step, []).append({
                "trajectory": record.trajectory, "generated_in_step": record.step, "trained_in_step": state.step,
                "weight_versions": record.weight_versions, "step_weights": state.trainer_weights,
                "trained_against": trained_against(board, state, record), "lag": lag})
    out = []
    for step, samples in sorted(late.items()):
        worst = max(samples, key=lambda s: s["lag"])
        out.append(Violation(
            "step_lag", worst["trajectory"],
            f"step {step} trained on {len(samples)} samples more than {bound} version{'s' if bound != 1 else ''} "
            f"behind the weights they were trained against "
            f"(v{by_step[step].trainer_weights} at the step's start); the oldest was served "
            f"v{min(worst['weight_versions'], key=lambda v: int(v) if v.isdigit() else -1)} in step "
            f"{worst['generated_in_step']} and trained against v{worst['trained_against']} (lag {worst['lag']})",
            {"check": "lag", "step": step, "first_step": step, "bound": bound, "count": len(samples),
             "max_lag": worst["lag"], "samples": sorted(samples, key=lambda s: -s["lag"])[:_LISTED]},
            occurrences=len(samples)))
    return out
