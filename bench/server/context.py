"""What every handler shares: configuration, the trace, identification, state and logs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from bench.records.request_log import RequestLog
from bench.records.served_tokens import ServedTokens
from bench.replay import GenerateParams, Generation, Identifier, Identity, TraceStore, build_generation, pack
from bench.tokenizer import ByteBPETokenizer
from faults import Exchange, FaultEngine, FaultEvent, Plan, Rule, Target

from .profiles import SglangProfile
from .state import ServerState


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

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


class ServerContext:
    def __init__(self, config: ServerConfig, store: TraceStore, tokenizer: ByteBPETokenizer,
                 plan: Plan | None = None) -> None:
        self.config = config
        self.store = store
        self.tokenizer = tokenizer
        self.identifier = Identifier(store)
        self.state = ServerState()
        self.log = RequestLog()
        self.served = ServedTokens()  # what each identified request was served, token by token
        self.faults = FaultEngine(plan)
        self.url = ""

    def target(self, identity: Identity, endpoint: str) -> Target:
        """What fault schedules decide about: this attempt at this turn of this trajectory."""
        trajectory = self.store.by_id.get(identity.trajectory) if identity.trajectory else None
        return Target(trajectory=identity.trajectory or f"request:{identity.digest}",
                      index=trajectory.index if trajectory else None, group=identity.group,
                      turn=identity.turn or 0, attempt=identity.attempt, endpoint=endpoint)

    def exchange(self, generation: Generation, *, api: str, endpoint: str, stream: bool, rid: str,
                 forced: tuple[Rule, ...] = ()) -> Exchange:
        """The answer to send, after the fault plan (and any forced faults) had their say."""
        flavor = "sglang" if api == "native" else self.config.openai_flavor
        exchange = Exchange(api=api, flavor=flavor, endpoint=endpoint, stream=stream, generation=generation,
                            weight_version=self.state.weight_version, context_length=self.config.context_length,
                            tokenizer=self.tokenizer, tools=self._tools(generation.identity))
        decision = self.faults.decide(self.target(generation.identity, endpoint), forced)
        if decision.rules:
            self.faults.apply(decision, exchange, rid)
        return exchange

    def _tools(self, identity: Identity) -> tuple[str, ...]:
        """The names of the tools the trajectory's recorded prompt announces (none for an unknown request)."""
        trajectory = self.store.by_id.get(identity.trajectory) if identity.trajectory else None
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

    def generate(self, ids: list[int], params: GenerateParams, hint: str | None) -> Generation:
        """Identify a request and build its (not yet paced) answer."""
        packed = pack(ids)
        identity = self.identifier.identify(packed, hint)
        self.faults.observe(identity.trajectory, packed, self.tokenizer)  # did it act on an earlier faulted answer?
        return build_generation(identity, self._recorded(identity), params, self.tokenizer, seed_bytes=packed)

    def _recorded(self, identity: Identity):  # type: ignore[no-untyped-def]
        if identity.trajectory is None or identity.turn is None or identity.drift == "extra_turn":
            return None
        turns = self.store.by_id[identity.trajectory].turns
        return turns[identity.turn] if identity.turn < len(turns) else None


CONTEXT_KEY: web.AppKey[ServerContext] = web.AppKey("bench.context", ServerContext)


def context_of(request: web.Request) -> ServerContext:
    return request.app[CONTEXT_KEY]
