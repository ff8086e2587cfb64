"""The per-step table of a multi-step run: what each step was given, what came back, what the process held."""

from __future__ import annotations

from typing import Any

from bench.records.request_log import RequestRecord
from bench.records.sample import DROPPED_OUTCOMES, OUTCOMES, SampleRecord

from .board import StepBoard
from .checks import COUNTED, sample_lag


def step_rows(board: StepBoard, records: list[SampleRecord], requests: list[RequestRecord],
              consumed: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """One row per step that started: samples and outcomes, drop rate, throughput, requests (late ones apart),
    the weight version the step began with and who published it (the bench, or the adapter's trainer side with
    the version its trainer published), the lag of what the step trained on (`checks.sample_lag`; `consumed`: the
    step each record was handed over in; default its trajectory's step), and the worker's resources after the
    step."""
    consumed = consumed or {}
    rows = []
    following = {earlier.step: later.started for earlier, later in zip(board.states, board.states[1:])}
    for state in board.states:
        mine = [r for r in records if r.step == state.step]
        outcomes = {o: sum(1 for r in mine if r.outcome == o) for o in OUTCOMES}
        asked = [q for q in requests if board.step_of.get(q.trajectory or "") == state.step]
        duration = (state.returned - (state.began or state.started)) if state.returned is not None else None
        finished = outcomes["completed"] + outcomes["truncated"]
        resources = state.resources or {}
        rows.append({
            "step": state.step, "weight_version": state.weight_version, "published_by": state.published_by,
            "trainer_version": state.trainer_version, "weights_held_by": state.held_by,
            "updates_kept_out": len(state.ignored_updates),
            "samples": len(mine), **{f"n_{o}": n for o, n in outcomes.items()},
            "drop_rate": round(sum(outcomes[o] for o in DROPPED_OUTCOMES) / len(mine), 4) if mine else None,
            "duration_s": None if duration is None else round(duration, 3),
            "samples_per_s": round(finished / duration, 2) if duration else None,
            "requests": len(asked),
            # arrived once the step after the one that trained on it had begun (`checks.late_requests`), or after
            # the last step returned
            "late_requests": sum(1 for q in asked if _late(board, q, consumed.get(q.trajectory or "", state.step),
                                                          following)),
            "versions_served": sorted({q.weight_version for q in asked if q.weight_version is not None}),
            "max_lag": max((lag for r in records if consumed.get(r.trajectory, r.step) == state.step
                            and (lag := sample_lag(board, state, r)) is not None), default=None),
            "error": None if state.error is None else f"{state.error.type}: {state.error.message[:200]}",
            **{key: resources.get(key) for key in COUNTED},
            "rss_mb": round(resources["rss_bytes"] / 2**20, 1) if resources.get("rss_bytes") is not None else None,
        })
    return rows


def _late(board: StepBoard, request: RequestRecord, step: int, following: dict[int, float]) -> bool:
    """A request arriving once the step after `step` (the one that trained on its trajectory) had begun."""
    returned = board.states[step].returned if step < len(board.states) else None
    return returned is not None and request.started > max(returned, following.get(step, 0.0))
