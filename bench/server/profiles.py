"""SGLang version profiles: which keys a response carries, in which order, per release.

Everything version-dependent in the native API's wire shapes is data here; the handlers
only ask the profile. Facts per WIRE.md sections 1.2-1.8 and 2.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SglangProfile:
    name: str  # as given to --sglang-version
    version: str  # as the server reports it
    output_ids: bool  # top-level output_ids in /generate items
    weight_version: bool  # meta_info.weight_version
    retractions_key: str | None  # num_retractions / total_retractions
    output_logprobs_length: bool  # meta_info.output_token_logprobs_length
    reasoning_tokens: bool
    cached_details_and_dp_rank: bool  # cached_tokens_details, dp_rank
    response_sent_ts: bool  # response_sent_to_client_ts
    legacy_input_logprobs: bool  # default input_token_logprobs is [[null, last_prompt_id, null]]
    queued_abort: str  # "waiting_queue" (0.5.15+), "reduced" (0.5.6), "before_prefill" (<=0.5.2)
    rich_stream_errors: bool  # in-band stream error carries type/code/retryable
    schema_precheck: bool  # 0.5.23: unknown / mistyped sampling keys -> 400 {"error": "<string>"}
    legacy_context_check: bool  # 0.4.10: prompt + max_new >= context is already too long
    weight_version_route: str  # "none" | "json" | "deprecated" | "removed"


PROFILES: dict[str, SglangProfile] = {
    p.name: p
    for p in [
        SglangProfile("0.4.10", "0.4.10.post2", output_ids=False, weight_version=False, retractions_key=None,
                      output_logprobs_length=False, reasoning_tokens=False, cached_details_and_dp_rank=False,
                      response_sent_ts=False, legacy_input_logprobs=True, queued_abort="before_prefill",
                      rich_stream_errors=False, schema_precheck=False, legacy_context_check=True,
                      weight_version_route="none"),
        SglangProfile("0.5.2", "0.5.2", output_ids=True, weight_version=True, retractions_key=None,
                      output_logprobs_length=False, reasoning_tokens=False, cached_details_and_dp_rank=False,
                      response_sent_ts=False, legacy_input_logprobs=True, queued_abort="before_prefill",
                      rich_stream_errors=False, schema_precheck=False, legacy_context_check=False,
                      weight_version_route="json"),
        SglangProfile("0.5.6", "0.5.6", output_ids=True, weight_version=True, retractions_key="total_retractions",
                      output_logprobs_length=False, reasoning_tokens=False, cached_details_and_dp_rank=False,
                      response_sent_ts=True, legacy_input_logprobs=True, queued_abort="reduced",
                      rich_stream_errors=False, schema_precheck=False, legacy_context_check=False,
                      weight_version_route="json"),
        SglangProfile("0.5.15", "0.5.15.post1", output_ids=True, weight_version=True,
                      retractions_key="num_retractions", output_logprobs_length=True, reasoning_tokens=True,
                      cached_details_and_dp_rank=True, response_sent_ts=True, legacy_input_logprobs=False,
                      queued_abort="waiting_queue", rich_stream_errors=True, schema_precheck=False,
                      legacy_context_check=False, weight_version_route="json"),
        SglangProfile("0.5.23", "0.5.23", output_ids=True, weight_version=True, retractions_key="num_retractions",
                      output_logprobs_length=True, reasoning_tokens=True, cached_details_and_dp_rank=True,
                      response_sent_ts=True, legacy_input_logprobs=False, queued_abort="waiting_queue",
                      rich_stream_errors=True, schema_precheck=True, legacy_context_check=False,
                      weight_version_route="removed"),
    ]
}
DEFAULT_PROFILE = "0.5.15"

# slime patches 0.5.15 to keep GET /get_weight_version; upstream 0.5.15 answers a 404 there.
UPSTREAM_0515_WEIGHT_ROUTE = "deprecated"


@dataclass(frozen=True)
class EngineBuild:
    """Which build of SGLang the server plays where a framework pins a fork, not a release: behaviour no wire
    profile holds, because the same release tag behaves differently in the fork."""

    name: str  # as given to ServerConfig(engine=...)
    # `/flush_cache` while generation is paused in `retract` or `in_place` mode with nothing running: allowed
    paused_flush: bool


# `/flush_cache` decides with the scheduler's `flush_cache` (`python/sglang/srt/managers/scheduler.py`):
# - "sglang", upstream (read in 0.5.10.post1, `Scheduler.flush_cache` -> `is_fully_idle`): no request running and
#   none in the scheduler's waiting queue, paused or not. A `retract` pause moves the running requests back into that
#   queue (`Scheduler.pause_generation`), so they keep the flush refused until they end (every profile above).
# - "sglang-miles", the sgl-project/sglang branch miles builds its engines from (miles 0.0.2: `SGLANG_BRANCH` in
#   docker/Dockerfile; the copy the miles-rl 0.0.2 wheel ships as its top-level `sglang` package): `flush_cache`
#   also flushes while the engine is paused (`_engine_paused`, set by a `retract` or `in_place` pause, not by an
#   `abort` one, which the tokenizer manager handles alone) and its running batch is empty. What a retract pause put
#   back in the queue holds no cache then, and does not block the flush; after an `in_place` pause the running
#   requests stay running, and do.
ENGINES: dict[str, EngineBuild] = {e.name: e for e in (EngineBuild("sglang", paused_flush=False),
                                                      EngineBuild("sglang-miles", paused_flush=True))}
DEFAULT_ENGINE = "sglang"


def get_engine(name: str) -> EngineBuild:
    if name not in ENGINES:
        raise ValueError(f"unknown SGLang build {name!r}; valid: {', '.join(ENGINES)}")
    return ENGINES[name]


def get_profile(name: str) -> SglangProfile:
    key = name.removesuffix(".post1").removesuffix(".post2")
    if key not in PROFILES:
        raise ValueError(f"unknown SGLang version {name!r}; valid: {', '.join(PROFILES)}")
    return PROFILES[key]
