"""What every handler shares: configuration, the trace, identification, state and logs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bench.records.request_log import RequestLog
from bench.records.served_tokens import ServedTokens
from bench.replay import GenerateParams, Generation, Identifier, Identity, TraceStore, build_generation, pack
from bench.replay.store import RecordedTrajectory, RecordedTurn
from bench.tokenizer import ByteBPETokenizer, tokenizer_path
from faults import Exchange, FaultEngine, FaultEvent, Plan, Rule, Target
from faults.engine import Decision

from .limits import Limits
from .native_fast import ReplyCache
from .openai_fast import ChatReplies
from .profiles import DEFAULT_ENGINE, EngineBuild, SglangProfile, get_engine
from .state import ServerState

if TYPE_CHECKING:  # the capture layer loads only in upstream mode
    from bench.capture.parse import CapturedAnswer

    from .upstream import Upstream


@dataclass(frozen=True)
class ServerConfig:
    profile: SglangProfile
    model: str
    context_length: int
    time_scale: float = 0.0
    router_version: str = "0.3.2"  # "0.3.2" JSON router answers, "0.2" text/plain ones
    served_model_name: str | None = None
    incremental_streaming: bool = False  # SGLang's --incremental-streaming-output
    weight_version_route: str | None = None  # override the profile's (e.g. "deprecated": upstream 0.5.15)
    openai_flavor: str = "vllm"  # "vllm" or "sglang": shape of the OpenAI-compatible routes
    engine: str = DEFAULT_ENGINE  # the SGLang build played where a fork differs (`profiles.ENGINES`)

    def __post_init__(self) -> None:
        get_engine(self.engine)  # an unknown build fails here, naming the valid ones

    @property
    def build(self) -> EngineBuild:
        return get_engine(self.engine)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def played(self) -> dict[str, str]:
        """What the server played, for the report: a run judged against one SGLang's behaviour says which."""
        return {"sglang_version": self.profile.name, "sglang_build": self.engine, "openai_flavor": self.openai_flavor,
                "router_version": self.router_version}


class ServerContext:
    def __init__(self, config: ServerConfig, store: TraceStore | None, tokenizer: ByteBPETokenizer,
                 plan: Plan | None = None, upstream: Upstream | None = None,
                 tokenizer_folder: Path | None = None) -> None:
        self.config = config
        self.store = store  # None: a proxy with no trace (upstream mode only)
        self.tokenizer = tokenizer
        self.tokenizer_folder = tokenizer_folder or tokenizer_path()  # what a target loads as the job's tokenizer
        self.upstream = upstream  # set: answers come from a live engine (`bench.server.upstream`)
        # who each request is, and how its attempt ended: the trace's identifier, or the upstream's tracker
        self.identifier: Identifier | Upstream = (upstream if upstream is not None
                                                  else Identifier(store))  # type: ignore[arg-type]
        self.state = ServerState()
        self.limits = Limits()  # the server's (BenchServer sets its own): parsers bound `n` by it
        self.log = RequestLog()
        self.served = ServedTokens()  # what each identified request was served, token by token
        self.faults = FaultEngine(plan)
        self.replies = ReplyCache()  # the fast path's saved replies (`native_fast`)
        self.chat_replies = ChatReplies()  # the chat route's (`openai_fast`)
        self.fast_path = True  # False: every request takes the slow path (tests compare the two)
        self.steps: Any = None  # a multi-step run's `bench.steps.board.StepBoard` (`POST /bench/step`)
        self.url = ""

    def retain(self, window: int, spill_dir: Path | None) -> None:
        """A long-lived server: keep the latest `window` requests' log rows and served tokens in memory; older log
        rows and fault events spill to `spill_dir` (None: dropped, counted), older served tokens are let go
        (`ServedTokens.retain`)."""
        from bench.records.fault_log_spill import SpilledFaultLog

        self.log.retain(window, spill_dir)
        self.served.retain(window)
        self.faults.log = SpilledFaultLog(window, spill_dir, self.faults.log.events)

    def target(self, identity: Identity, endpoint: str) -> Target:
        """What fault schedules decide about: this attempt at this turn of this trajectory."""
        trajectory = self._recorded_trajectory(identity)
        index = trajectory.index if trajectory else self.upstream.index_of(identity) if self.upstream else None
        return Target(trajectory=identity.trajectory or f"request:{identity.digest}",
                      index=index, group=identity.group,
                      turn=identity.turn or 0, attempt=identity.attempt, endpoint=endpoint)

    def decide(self, identity: Identity, endpoint: str, api: str | None = None) -> Decision | None:
        """`faults.decide(target(identity, endpoint))`, or None when no rule fires (no target or decision made); with
        `api`, its rules only those that act on that API (the others `FaultEngine.apply` passes by)."""
        trajectory = self._recorded_trajectory(identity)
        index = trajectory.index if trajectory else self.upstream.index_of(identity) if self.upstream else None
        rules = self.faults.fired_at(identity.trajectory or f"request:{identity.digest}", index, identity.group,
                                     identity.turn or 0, identity.attempt, endpoint, api)
        return Decision(rules, self.target(identity, endpoint)) if rules else None

    def exchange(self, generation: Generation, *, api: str, endpoint: str, stream: bool, rid: str,
                 forced: tuple[Rule, ...] = (), decision: Decision | None = None) -> Exchange:
        """The answer to send, after the fault plan (and any forced faults) had their say (`decision`: already
        taken, in upstream mode, before the engine was asked)."""
        exchange = self._blank_exchange(generation, api=api, endpoint=endpoint, stream=stream)
        if decision is None:
            decision = self.faults.decide(self.target(generation.identity, endpoint), forced)
        if decision.rules:
            self.faults.apply(decision, exchange, rid)
        if self.upstream is not None:
            self.upstream.keep_logprobs_missing(exchange)
        return exchange

    def _recorded_trajectory(self, identity: Identity) -> RecordedTrajectory | None:
        if identity.trajectory is None or self.store is None:
            return None
        return self.store.by_id.get(identity.trajectory)

    def _blank_exchange(self, generation: Generation, *, api: str, endpoint: str, stream: bool) -> Exchange:
        flavor = "sglang" if api == "native" else self.config.openai_flavor
        return Exchange(api=api, flavor=flavor, endpoint=endpoint, stream=stream, generation=generation,
                        weight_version=self.state.weight_version, context_length=self.config.context_length,
                        tokenizer=self.tokenizer, tools=self._tools(generation.identity))

    def plan_live(self, ids: list[int], hint: str | None, *, api: str, endpoint: str, stream: bool,
                  forced: tuple[Rule, ...] = ()) -> Planned:
        """Upstream mode, before the engine is asked: who sent the request, what the plan decided for it, and
        whether a fault answers in the generation's place (then the engine is not asked)."""
        assert self.upstream is not None
        identity = self.upstream.place(ids, hint)
        self.faults.observe(identity.trajectory, pack(ids), self.tokenizer)  # did it act on an earlier faulted answer?
        decision = self.faults.decide(self.target(identity, endpoint), forced)
        scratch = self._blank_exchange(self.upstream.no_answer(identity, len(ids), scratch=True), api=api,
                                       endpoint=endpoint, stream=stream)
        return Planned(identity, decision, bool(decision.rules) and self.faults.preempts(decision, scratch))

    def _tools(self, identity: Identity) -> tuple[str, ...]:
        """The names of the tools the trajectory's recorded prompt announces (none for an unknown request)."""
        trajectory = self._recorded_trajectory(identity)
        if trajectory is None or not trajectory.prompt_tools:
            return ()
        return tuple(str(tool.get("function", tool).get("name", "")) for tool in trajectory.prompt_tools)

    def weight_update(self, endpoint: str) -> None:
        """A weight-version change: `abort_all_on_weight_update` rules abort everything in flight."""
        rules = [r for r in self.faults.plan.rules if r.fault.on_weight_update]
        if not rules:
            return
        for entry in list(self.state.inflight.values()):
            if entry.identity is not None:
                target = self.target(entry.identity, endpoint)
                self.faults.log.append(FaultEvent(rules[0].name, rules[0].fault.name, target.trajectory, target.group,
                                                  target.turn, target.attempt, endpoint, entry.rid, time.time(),
                                                  "aborted by a weight update"))
        self.state.abort(abort_all=True)

    def generate(self, ids: list[int], params: GenerateParams, hint: str | None,
                 answer: CapturedAnswer | None = None, planned: Planned | None = None) -> Generation:
        """Identify a request and build its (not yet paced) answer: the recording's, or in upstream mode
        `answer`, the live engine's, for the request `plan_live` placed (none when a fault answers instead)."""
        packed = pack(ids)
        if self.upstream is not None:
            assert planned is not None, "upstream mode: the request was planned before the engine was asked"
            if answer is None:
                return self.upstream.no_answer(planned.identity, len(ids))
            self._follow_version(answer.weight_version)
            return self.upstream.generation(planned.identity, answer, params, self.tokenizer.eos_token_id)
        identity = self.identifier.identify(packed, hint)
        self.faults.observe(identity.trajectory, packed, self.tokenizer)  # did it act on an earlier faulted answer?
        return build_generation(identity, self.recorded(identity), params, self.tokenizer, seed_bytes=packed)

    def _follow_version(self, reported: object) -> None:
        """Upstream mode: the server's weight version is the newest the engine reported (answers in flight
        during an update may report the older one: a number never goes back)."""
        if reported is None or str(reported) == self.state.weight_version:
            return
        new, old = str(reported), self.state.weight_version
        if new.isdigit() and old.isdigit() and int(new) < int(old):
            return
        self.state.weight_version = new

    def recorded(self, identity: Identity) -> RecordedTurn | None:
        """The recorded turn an identified request replays (None: drifted past the recording, or unknown)."""
        if identity.trajectory is None or identity.turn is None or identity.drift == "extra_turn" or self.store is None:
            return None
        turns = self.store.by_id[identity.trajectory].turns
        return turns[identity.turn] if identity.turn < len(turns) else None


@dataclass(frozen=True)
class Planned:
    """Upstream mode: a request placed and decided before its engine is asked (`ServerContext.plan_live`)."""

    identity: Identity
    decision: Decision
    preempted: bool  # a fault answers in the generation's place: the engine is not asked


CONTEXT_KEY: web.AppKey[ServerContext] = web.AppKey("bench.context", ServerContext)


def context_of(request: web.Request) -> ServerContext:
    return request.app[CONTEXT_KEY]
