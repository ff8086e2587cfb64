"""verl's trainer side between rollout steps: what its sync trainer makes its SGLang server do around a step, as HTTP
calls on the bench's server (`run --steps K`: the adapter's `update_weights`, `bench.steps`).

What the trainers do in their default configuration (SGLang in hybrid mode, colocated with the actor;
`checkpoint_engine.backend` "naive", `free_cache_engine` true; verl 0.8.0 `trainer/main_ppo_sync.py`
`PPOTrainer.init_workers`/`fit`/`step`, verl 0.9.1 `trainer/ppo/v1/trainer_base.py` `PPOTrainer._setup`/`fit` and
`trainer_sync.py` `PPOTrainerSync`):

- `sleep` (`CheckpointEngineManager.sleep_replicas` -> `SGLangHttpServer.sleep`): once the trainer is built, and
  after every step's `ReplayBuffer.sample()`, the engine frees its memory, `release_memory_occupation` with tags
  `kv_cache` and `weights`. The server actor calls its in-process tokenizer manager; here that is the HTTP route.
- `update_weights` (`CheckpointEngineManager.update_weights`, naive backend -> the actor worker's `update_weights`
  in `workers/engine_workers.py` -> `ServerAdapter` in `workers/rollout/sglang_rollout/sglang_rollout.py`, over
  `AsyncHttpServerAdapter` in `http_server_engine.py`): before the first step, and after every training step:
  `POST /resume_memory_occupation {"tags": ["weights"]}`; one `POST /update_weights_from_tensor` per bucket of
  tensors (`serialized_named_tensors`, `load_format` null, `flush_cache` true, as SGLang's
  `weight_sync.utils.update_weights` builds the request: no `weight_version`); `GET /flush_cache`, asked again
  after 2 s while refused, 12 times at most, then given up with a logged error, not raised; then, when the trainer
  passed its step, the server actor's `set_global_steps` (a Ray call, not HTTP); `POST /resume_memory_occupation
  {"tags": ["kv_cache"]}`. An HTTP error on the other calls raises (`raise_for_status`): the step fails.

The version: verl's update names no `weight_version`, so SGLang's stays where it was and the replies carry the
same version at every step (the bench's "0"). verl keeps its own: 0.9.1's trainer passes `global_steps` (0
before the first step, then the step just trained: rollout k is generated under `global_steps` k), which its server
actor stamps on every `TokenOutput` (`extra_fields["global_steps"]`); 0.8.0's `fit` passes none, so it stays unset.

No weights are sent (CPU, no model): the update call carries an empty `serialized_named_tensors`.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import aiohttp

FLUSH_ATTEMPTS = 12  # AsyncHttpServerAdapter.flush_cache: max_attempts (3) * 4
FLUSH_RETRY_S = 2.0  # its retry_delay
TIMEOUT_S = 60.0  # its request timeout
SLEEP_TAGS = ["kv_cache", "weights"]


async def sleep(base_url: str) -> None:
    """The trainer putting its rollout server to sleep (after building it, after each step's sample)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        await _post(http, base_url, "/release_memory_occupation", {"tags": SLEEP_TAGS})


async def wake_and_update(base_url: str, set_global_steps: Callable[[], Awaitable[None]] | None = None) -> bool:
    """One weight sync: resume weights, update, flush, (`set_global_steps`, awaited), resume the KV cache.
    False if the flush was refused every time (verl logs that and goes on)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        await _post(http, base_url, "/resume_memory_occupation", {"tags": ["weights"]})
        await _post(http, base_url, "/update_weights_from_tensor", {
            "serialized_named_tensors": [], "load_format": None, "flush_cache": True})
        flushed = await _flush(http, base_url)
        if set_global_steps is not None:
            await set_global_steps()
        await _post(http, base_url, "/resume_memory_occupation", {"tags": ["kv_cache"]})
    return flushed


async def _post(http: aiohttp.ClientSession, base_url: str, route: str, body: dict[str, Any]) -> None:
    async with http.post(f"{base_url}{route}", json=body) as reply:
        if reply.status >= 400:
            raise RuntimeError(f"verl weight sync: POST {route} answered {reply.status}: {(await reply.text())[:300]}")


async def _flush(http: aiohttp.ClientSession, base_url: str) -> bool:
    for _ in range(FLUSH_ATTEMPTS):
        try:
            async with http.get(f"{base_url}/flush_cache") as reply:
                if reply.status == 200:
                    return True
        except aiohttp.ClientError:
            pass  # verl logs a warning and asks again
        await asyncio.sleep(FLUSH_RETRY_S)
    return False
