"""The bench's side of a multi-step run, kept by the server: what each step was given and what it reported.

At the start of every step the board puts the fault plan's rules for that step in the server's plan (a rule
with `steps = "3-5"` is there only during steps 3 to 5; one without `steps`, always) and publishes the step's
weights: the server's weight version becomes the step's number, the way a trainer's weight sync moves it, with
the plan's `abort_all_on_weight_update` rules acting on it as on any weight update. A `hold_weights` rule for
the step keeps the previous version instead. Served replies carry the version current when they were generated.

An adapter that drives the trainer side (`update_weights(job)`, called by the worker before each step) publishes
the weights itself, through the server's admin routes, as its framework's trainer does: the board then publishes
nothing after step 0, and a step's weights are what the server held when its rollout began (`version_at`), beside
the version the adapter says its trainer published. During a step a `hold_weights` rule names, the server's weight
update routes answer as usual but leave the version where it was (`hold`): the sync did not happen.

The worker reports each step's end on `POST /bench/step` (`loop.post_step`): when the rollout returned, its error
if it raised, who published its weights, and what the process held afterwards. The board then starts the next step
and answers, so the worker never starts a step before its weights are published.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bench.records.sample import ErrorInfo
from faults import Plan

HOLD_WEIGHTS = "hold_weights"
BENCH, ADAPTER = "bench", "adapter"  # who published a step's weights


@dataclass
class StepState:
    """One step as the bench saw it."""

    step: int
    started: float  # unix time the bench published its weights (the worker starts it right after)
    weight_version: str
    held_by: list[str] = field(default_factory=list)  # `hold_weights` rules that kept the previous version
    rules: list[str] = field(default_factory=list)  # the plan's rules in force during the step
    began: float | None = None  # unix time the worker started the step (after the adapter's weight sync; `prepare` in)
    returned: float | None = None  # unix time (the worker's clock: the same machine) the rollout returned
    error: ErrorInfo | None = None
    resources: dict[str, Any] | None = None
    published_by: str = BENCH  # ADAPTER: the adapter's trainer side published them through the admin routes
    trainer_version: str | None = None  # the version the adapter's trainer says it published for the step
    ignored_updates: list[dict[str, Any]] = field(default_factory=list)  # weight updates a `hold_weights` rule kept out
    applied_updates: list[dict[str, Any]] = field(default_factory=list)  # weight updates the server applied
    versionless_sync: bool = False  # the adapter declares its framework's syncs name no version (`loop.run_steps`)

    @property
    def ended(self) -> bool:
        return self.returned is not None

    @property
    def trainer_weights(self) -> str:
        """The weights the step's trainer holds, what a sample it trains on lags behind: the version the adapter's
        trainer published (whether or not it reached the server), else the one the bench published or held."""
        return self.trainer_version if self.trainer_version is not None else self.weight_version


def plan_for_step(plan: Plan | None, step: int) -> Plan | None:
    """The plan's rules in force during `step`: those without `steps`, and those whose `steps` name it."""
    if plan is None:
        return None
    rules = tuple(rule for rule in plan.rules if rule.schedule.steps is None or step in rule.schedule.steps)
    return plan if len(rules) == len(plan.rules) else dataclasses.replace(plan, rules=rules)


def plan_for_steps(plan: Plan | None, steps: range) -> Plan | None:
    """The plan's rules in force during any of `steps` (what a run that ran those steps can be judged on)."""
    if plan is None:
        return None
    rules = tuple(rule for rule in plan.rules
                  if rule.schedule.steps is None or any(step in rule.schedule.steps for step in steps))
    return plan if len(rules) == len(plan.rules) else dataclasses.replace(plan, rules=rules)


class StepBoard:
    """Per-step state of one run; `context` is the server's `ServerContext` (its fault engine and state)."""

    def __init__(self, context: Any, plan: Plan | None, steps: int, step_of: dict[str, int]) -> None:
        self.context, self.plan, self.steps, self.step_of = context, plan, steps, step_of
        self.states: list[StepState] = []
        self.closed = False  # the runner stopped waiting (a hang, the deadline, a signal): no step ends or starts

    def close(self) -> None:
        """The run is over for the bench: a step report arriving now is too late, and no further step starts (the
        worker is told so and returns; it is being killed anyway)."""
        self.closed = True

    def begin(self, step: int, publish: bool = True) -> StepState:
        """Start `step`: its rules in the server's plan, its weights published (unless a rule holds them, or the
        adapter publishes them itself: `publish=False`)."""
        step_plan = plan_for_step(self.plan, step)
        if step_plan is not None and step_plan is not self.context.faults.plan:
            self.context.faults.swap(step_plan, keep_clock=True)  # a window counts from the run's start
        rules = list(step_plan.rules) if step_plan is not None else []
        held = [rule.name for rule in rules if rule.fault.name == HOLD_WEIGHTS]
        state = self.context.state
        if step > 0 and not held and publish:
            self.context.weight_update("/bench/step")  # abort_all_on_weight_update rules act on it
            state.weight_version = str(step)
        elif step == 0 and not held:
            state.weight_version = "0"
        current = StepState(step, time.time(), state.weight_version, held, [rule.name for rule in rules],
                            published_by=BENCH if publish else ADAPTER)  # step 0's: known from its report
        self.states.append(current)
        return current

    def end(self, report: dict[str, Any]) -> dict[str, Any]:
        """The worker's report of a step's end; starts the next step unless this was the last."""
        step = report.get("step")
        if self.closed:
            return {"next": None, "closed": True}
        if not isinstance(step, int) or not self.states or step != self.states[-1].step:
            raise ValueError(f"a report for step {step!r}, but the running step is "
                             f"{self.states[-1].step if self.states else None}")
        current = self.states[-1]
        current.returned = float(report.get("returned") or time.time())
        current.began = float(report.get("started") or current.started)
        error = report.get("error")
        current.error = None if error is None else ErrorInfo(str(error.get("type")), str(error.get("message")),
                                                             str(error.get("traceback", "")), error.get("trajectory"))
        current.resources = report.get("resources")
        weights = report.get("weights")
        if isinstance(weights, dict) and weights.get("by") == ADAPTER:
            version = weights.get("version")
            current.published_by, current.trainer_version = ADAPTER, None if version is None else str(version)
            current.versionless_sync = bool(weights.get("versionless"))
            current.weight_version = self.context.state.version_at(current.began)  # after the adapter's update
        if report.get("last") or step + 1 >= self.steps:
            return {"next": None}
        following = self.begin(step + 1, publish=current.published_by != ADAPTER)
        return {"next": following.step, "weight_version": following.weight_version}

    def hold(self, endpoint: str, version: str | None) -> list[str]:
        """A weight update arriving on the server's admin route `endpoint`: the `hold_weights` rules of the running
        step, which keep it from taking effect (recorded on the step), or [] when it goes through."""
        if self.closed or not self.states or not self.states[-1].held_by:
            return []
        current = self.states[-1]
        current.ignored_updates.append({"endpoint": endpoint, "weight_version": version, "at": time.time()})
        return current.held_by

    def applied(self, endpoint: str, version: str | None) -> None:
        """A weight update the server applied (`version`: the one it named, None if it named none), on the running
        step: `checks.weights_not_served` reads it when the update could not move the server's version label."""
        if not self.closed and self.states:
            self.states[-1].applied_updates.append({"endpoint": endpoint, "weight_version": version,
                                                    "at": time.time()})

    def version_at(self, moment: float) -> str | None:
        """The server's weight version at unix time `moment` (None: no server state to ask, as in a unit test)."""
        state = getattr(self.context, "state", None)
        return None if state is None else state.version_at(moment)

    def ran(self) -> int:
        """How many steps started."""
        return len(self.states)

    def first_error(self) -> tuple[int, ErrorInfo] | None:
        return next(((s.step, s.error) for s in self.states if s.error is not None), None)


async def step_route(request: web.Request) -> web.Response:
    """`POST /bench/step`: a multi-step run's worker reports a step's end (`loop.post_step`)."""
    from bench.server import wire
    from bench.server.context import context_of

    board = getattr(context_of(request), "steps", None)
    if board is None:
        return wire.json_response({"error": "no multi-step run (`run --steps K`) on this server"}, 404)
    try:
        body = wire.decode_json(await request.read())
        if not isinstance(body, dict):
            raise ValueError(f"expected a JSON object, got {type(body).__name__}")
        return wire.json_response(board.end(body))
    except (ValueError, wire.NotJson) as error:
        return wire.json_response({"error": f"{request.path}: {error}"}, 400)
