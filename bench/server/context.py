"""What every handler shares: configuration, the trace, identification, state and logs."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ..replay import GenerateParams, Generation, Identifier, Identity, TraceStore, build_generation, pack
from ..tokenizer import ByteBPETokenizer
from .profiles import SglangProfile
from .request_log import RequestLog
from .state import ServerState

TRAJECTORY_HEADER = "X-Bench-Trajectory"


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
    def __init__(self, config: ServerConfig, store: TraceStore, tokenizer: ByteBPETokenizer) -> None:
        self.config = config
        self.store = store
        self.tokenizer = tokenizer
        self.identifier = Identifier(store)
        self.state = ServerState()
        self.log = RequestLog()
        self.url = ""

    def generate(self, ids: list[int], params: GenerateParams, hint: str | None) -> Generation:
        """Identify a request and build its (not yet paced) answer."""
        packed = pack(ids)
        identity = self.identifier.identify(packed, hint)
        return build_generation(identity, self._recorded(identity), params, self.tokenizer, seed_bytes=packed)

    def _recorded(self, identity: Identity):  # type: ignore[no-untyped-def]
        if identity.trajectory is None or identity.turn is None or identity.drift == "extra_turn":
            return None
        turns = self.store.by_id[identity.trajectory].turns
        return turns[identity.turn] if identity.turn < len(turns) else None


CONTEXT_KEY: web.AppKey[ServerContext] = web.AppKey("bench.context", ServerContext)


def context_of(request: web.Request) -> ServerContext:
    return request.app[CONTEXT_KEY]
