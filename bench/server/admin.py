"""SGLang's admin endpoints a rollout stack calls (WIRE.md section 2)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from . import wire
from .context import ServerContext, context_of

FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
           "requests, the operation will not be performed.)\n")


_KINDS: dict[str, tuple[tuple[type, ...], str, str]] = {
    "str": ((str,), "string_type", "Input should be a valid string"),
    "bool": ((bool,), "bool_type", "Input should be a valid boolean"),
    "list": ((list,), "list_type", "Input should be a valid list"),
    "int": ((int,), "int_type", "Input should be a valid integer"),
}


def _schema_error(kind: str, location: tuple[Any, ...], message: str, value: Any) -> web.HTTPBadRequest:
    """A body of the wrong shape: FastAPI's validation error as SGLang remaps it (400, the pydantic detail)."""
    return web.HTTPBadRequest(text=wire.dumps({"object": "error", "message": wire.validation_detail(
        kind, location, message, value), "type": "Bad Request", "param": None, "code": 400}).decode(),
        content_type=wire.JSON)


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = wire.decode_json(raw)
    except wire.NotJson:
        raise _schema_error("json_invalid", (0,), "JSON decode error", {}) from None
    if not isinstance(body, dict):
        raise _schema_error("model_attributes_type", (), "Input should be a valid dictionary or object to extract "
                            "fields from", body)
    return body


def _field(body: dict[str, Any], key: str, kind: str, default: Any = None, *, required: bool = False) -> Any:
    """`body[key]` checked as the engine's request model checks it; `default` when absent (or null, if optional)."""
    if key not in body or (body[key] is None and not required):
        if required:
            raise _schema_error("missing", (key,), "Field required", body)
        return default
    value = body[key]
    kinds, code, message = _KINDS[kind]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise _schema_error(code, (key,), message, value)
    return value


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


def _model_info(ctx: ServerContext) -> dict[str, Any]:
    model = ctx.config.model
    info: dict[str, Any] = {"model_path": model, "tokenizer_path": model, "is_generation": True,
                            "preferred_sampling_params": None, "weight_version": ctx.state.weight_version,
                            "has_image_understanding": False, "has_audio_understanding": False,
                            "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    if ctx.config.profile.name == "0.5.23":
        info |= {"served_model_name": ctx.config.model_name, "load_format": "auto", "reasoning_parser": None,
                 "tool_call_parser": None, "disaggregation_mode": "null"}
    return info


async def model_info(request: web.Request) -> web.Response:
    return wire.json_response(_model_info(context_of(request)))


async def server_info(request: web.Request) -> web.Response:
    ctx = context_of(request)
    info = {"model_path": ctx.config.model, "tokenizer_path": ctx.config.model, "tp_size": 1, "dp_size": 1,
            "pp_size": 1, "ep_size": 1, "context_length": ctx.config.context_length, "disaggregation_mode": "null",
            "weight_version": ctx.state.weight_version, "served_model_name": ctx.config.model_name,
            "max_running_requests": 1024, "max_total_num_tokens": 100000,
            "internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {}}],
            "version": ctx.config.profile.version}
    return wire.json_response(info)


async def get_weight_version(request: web.Request) -> web.Response:
    ctx = context_of(request)
    route = ctx.config.weight_version_route or ctx.config.profile.weight_version_route
    if route == "json":
        return wire.json_response({"weight_version": ctx.state.weight_version})
    if route == "deprecated":
        return wire.json_response({"object": "error", "message": "Endpoint '/get_weight_version' or "
                                   "'/weight_version' is deprecated. Please use '/model_info' instead.",
                                   "type": "404", "param": None, "code": 404}, 404)
    return wire.json_response({"detail": "Not Found"}, 404)


def _held(ctx: ServerContext, endpoint: str, version: str | None) -> bool:
    """Is a weight update kept out? During a step of a multi-step run that a `hold_weights` rule names, the
    update routes answer as usual and change nothing (no new version, no abort): a sync that did not happen
    (`bench.steps.board.StepBoard.hold` records it on the step)."""
    return ctx.steps is not None and bool(ctx.steps.hold(endpoint, version))


async def update_weight_version(request: web.Request) -> web.Response:
    ctx = context_of(request)
    body = await _json_body(request)
    new = _field(body, "new_version", "str", required=True)
    abort_all = _field(body, "abort_all_requests", "bool", True)
    if _held(ctx, request.path, new):
        return wire.json_response({"success": True, "message": f"Weight version updated to {new}",
                                   "new_version": new})
    ctx.weight_update(request.path)
    if abort_all:
        ctx.state.abort(abort_all=True)
    ctx.state.weight_version = new
    return wire.json_response({"success": True, "message": f"Weight version updated to {new}", "new_version": new})


async def _update_weights(request: web.Request, message: str, extra: dict[str, Any]) -> web.Response:
    ctx = context_of(request)
    body = await _json_body(request)
    abort_all = _field(body, "abort_all_requests", "bool", False)
    version = _field(body, "weight_version", "str")
    _field(body, "model_path", "str")
    if _held(ctx, request.path, version):
        return wire.json_response({"success": True, "message": message} | extra)
    if ctx.steps is not None:  # a multi-step run: the step's sync took effect (`StepBoard.applied`)
        ctx.steps.applied(request.path, version)
    ctx.weight_update(request.path)
    if abort_all:
        ctx.state.abort(abort_all=True)
    if version is not None:
        ctx.state.weight_version = version
    return wire.json_response({"success": True, "message": message} | extra)


async def update_weights_from_disk(request: web.Request) -> web.Response:
    return await _update_weights(request, "Succeeded to update model weights.", {"num_paused_requests": 0})


async def update_weights_online(request: web.Request) -> web.Response:
    return await _update_weights(request, "Succeeded to update parameter online.", {})


async def post_process_weights(request: web.Request) -> web.Response:
    """slime's patched server (0.5.15.post1; miles calls it after every weight update): nothing to post-process here."""
    body = await _json_body(request)
    for key in ("restore_weights_before_load", "post_process_quantization", "post_load_weights"):
        _field(body, key, "bool")
    return wire.json_response({"success": True, "message": "Success"})


async def weights_update_group(request: web.Request) -> web.Response:
    await _json_body(request)
    return wire.json_response({"success": True, "message": "Succeeded to initialize custom process group."
                               if request.path.startswith("/init") else "Succeeded to destroy process group."})


async def memory_occupation(request: web.Request) -> web.Response:
    await _json_body(request)
    return wire.json_response(None)


async def flush_cache(request: web.Request) -> web.Response:
    """Refused while requests run or wait, as the played SGLang build decides (`profiles.ENGINES`)."""
    ctx = context_of(request)
    if not ctx.state.can_flush(ctx.config.build.paused_flush):
        return wire.text_response("Flush cache failed.\n", 400)
    return wire.text_response(FLUSHED, 200)


async def abort_request(request: web.Request) -> web.Response:
    ctx = context_of(request)
    body = await _json_body(request)
    rid = _field(body, "rid", "str", "")
    ctx.state.abort(rid or None, abort_all=_field(body, "abort_all", "bool", False))
    return web.Response(status=200)


async def pause_generation(request: web.Request) -> web.Response:
    body = await _json_body(request)
    mode = body.get("mode", "abort")
    if mode not in ("abort", "retract", "in_place"):
        return wire.value_error(f"Invalid mode: {mode}")
    context_of(request).state.pause(mode)
    return wire.json_response({"message": "Generation paused successfully.", "status": "ok"})


async def continue_generation(request: web.Request) -> web.Response:
    await _json_body(request)
    context_of(request).state.resume()
    return wire.json_response({"message": "Generation continued successfully.", "status": "ok"})


# prime-rl's vLLM server adds its own admin routes (`src/prime_rl/inference/vllm/server.py`: `/pause`, `/resume`,
# `/update_weights`); its orchestrator calls them around each weight update (`src/prime_rl/utils/client.py`,
# `update_weights`: pause with `mode=keep`, update with the checkpoint's directory, resume). vLLM keeps no weight
# version: the mock's version is the checkpoint's step, from the directory's name (prime-rl's `step_<n>` layout,
# `get_step_path`); a directory not so named updates nothing the bench can tell apart, so the version stays.
_VLLM_PAUSE_MODES = {"keep": "in_place", "abort": "abort"}  # vLLM's pause modes the mock plays, as its own


async def pause_engine(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "keep")
    if mode not in _VLLM_PAUSE_MODES:
        return wire.value_error(f"Invalid mode: {mode}")
    context_of(request).state.pause(_VLLM_PAUSE_MODES[mode])
    return wire.json_response({"status": "paused"})


async def resume_engine(request: web.Request) -> web.Response:
    context_of(request).state.resume()
    return wire.json_response({"status": "resumed"})


async def update_weights_from_path(request: web.Request) -> web.Response:
    ctx = context_of(request)
    body = await _json_body(request)
    weight_dir = _field(body, "weight_dir", "str")
    name = (weight_dir or "").rstrip("/").rsplit("/", 1)[-1]
    step = name.removeprefix("step_")
    version = step if name.startswith("step_") and step.isdigit() else None
    if _held(ctx, request.path, version):
        return wire.json_response({"status": "ok"})
    ctx.weight_update(request.path)
    if version is not None:
        ctx.state.weight_version = version
    return wire.json_response({"status": "ok"})


def _counts(ctx: ServerContext) -> tuple[int, int]:
    waiting = ctx.state.waiting + sum(1 for e in ctx.state.inflight.values() if not e.prefilled)
    running = sum(1 for e in ctx.state.inflight.values() if e.prefilled)
    return running, waiting


async def loads(request: web.Request) -> web.Response:
    ctx = context_of(request)
    running, waiting = _counts(ctx)
    load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting, "num_waiting_uncached_tokens": 0,
            "num_used_tokens": 0, "num_total_tokens": 0, "max_total_num_tokens": 100000,
            "max_running_requests": 1024, "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
            "utilization": 0.0}
    stamp = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    return wire.json_response({"timestamp": stamp, "version": ctx.config.profile.version, "loads": [load]})


async def get_load(request: web.Request) -> web.Response:
    running, waiting = _counts(context_of(request))
    return wire.json_response([{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting,
                                "num_tokens": 0, "num_pending_tokens": 0, "ts_tic": round(time.monotonic(), 3)}])


async def models(request: web.Request) -> web.Response:
    ctx = context_of(request)
    name, created = ctx.config.model_name, int(time.time())
    entry: dict[str, Any] = {"id": name, "object": "model", "created": created,
                             "owned_by": "vllm" if ctx.config.openai_flavor == "vllm" else "sglang",
                             "root": name, "parent": None, "max_model_len": ctx.config.context_length}
    if ctx.config.openai_flavor == "vllm":
        entry["permission"] = []
    return wire.json_response({"object": "list", "data": [entry]})


async def tokenize(request: web.Request) -> web.Response:
    ctx = context_of(request)
    body = await _json_body(request)
    messages = _field(body, "messages", "list")
    if messages is not None:
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise _schema_error("model_type", ("messages",), "Input should be a list of chat messages with a role",
                                messages)
        try:
            text = ctx.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except Exception as error:  # the template failed on the client's message shape: its error, not ours
            return wire.json_response({"error": {"message": f"Chat template error: {error}", "type": "BadRequestError",
                                                 "param": None, "code": 400}}, 400)
    else:
        text = _field(body, "prompt", "str", required=True)
    tokens = ctx.tokenizer.encode(text)
    return wire.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": ctx.config.context_length})


async def detokenize(request: web.Request) -> web.Response:
    ctx = context_of(request)
    body = await _json_body(request)
    tokens = _field(body, "tokens", "list", required=True)
    for index, token in enumerate(tokens):
        if not isinstance(token, int) or isinstance(token, bool):
            raise _schema_error("int_type", ("tokens", index), "Input should be a valid integer", token)
    outside = [t for t in tokens if not 0 <= t < ctx.tokenizer.vocab_size]
    if outside:  # vLLM's wording for an id its tokenizer does not have
        return wire.json_response({"error": {"message": f"Token id {max(outside)} is out of vocabulary",
                                             "type": "BadRequestError", "param": None, "code": 400}}, 400)
    return wire.json_response({"text": ctx.tokenizer.decode(tokens)})


def add_admin_routes(app: web.Application) -> None:
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, health)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    for path in ("/get_weight_version", "/weight_version"):
        app.router.add_get(path, get_weight_version)
    app.router.add_post("/update_weight_version", update_weight_version)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_post("/update_weights_from_distributed", update_weights_online)
    app.router.add_post("/update_weights_from_tensor", update_weights_online)
    app.router.add_post("/post_process_weights", post_process_weights)
    app.router.add_post("/init_weights_update_group", weights_update_group)
    app.router.add_post("/destroy_weights_update_group", weights_update_group)
    app.router.add_post("/release_memory_occupation", memory_occupation)
    app.router.add_post("/resume_memory_occupation", memory_occupation)
    app.router.add_route("*", "/flush_cache", flush_cache)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/pause", pause_engine)
    app.router.add_post("/resume", resume_engine)
    app.router.add_post("/update_weights", update_weights_from_path)
    app.router.add_get("/v1/loads", loads)
    app.router.add_get("/get_load", get_load)
    app.router.add_get("/v1/models", models)
    for prefix in ("", "/v1"):
        app.router.add_post(f"{prefix}/tokenize", tokenize)
        app.router.add_post(f"{prefix}/detokenize", detokenize)
