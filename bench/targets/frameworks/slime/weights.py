"""The slime family's trainer side between rollout steps: the weight sync its trainer makes with its SGLang engines,
as HTTP calls on the bench's server (`run --steps K`: the adapter's `update_weights`, `bench.steps`).

What the trainers do, in their default configuration (engines on their own GPUs, full weights broadcast over NCCL;
slime at 624b824, `UpdateWeightFromDistributed`; miles 0.0.2, the same class in its `broadcast` transfer mode):

- once, when the trainer connects to its engines: `POST /init_weights_update_group` (master address and port,
  `rank_offset` 1, `world_size` engines' GPUs + 1, `group_name` `slime-pp_0` / `miles-pp_0`, `backend` "nccl");
- once the weights are loaded (before the first rollout: slime's `train.py`), and again after every training step,
  the trainer's `weight_version` counter goes up by one (rollout k is served version k + 1), then:
  - slime: `POST /pause_generation {}`, `GET /flush_cache` (asked again 1 s later while the engine refuses it, 60
    times at most), `POST /update_weights_from_distributed` per bucket of tensors (`names`, `dtypes`, `shapes`,
    `group_name`, `flush_cache` false, `weight_version`), `POST /continue_generation {}`;
  - miles: `POST /pause_generation {"mode": "retract"}` (`--pause-generation-mode`, `retract` by default),
    `GET /flush_cache` unless the mode is `in_place` (asked again at once while refused, 60 times at most), the same
    update calls, `POST /post_process_weights` (`post_process_quantization` true: miles calls it after every
    update), `POST /continue_generation {}`. A retract pause puts running requests back in the waiting queue.
    Upstream SGLang refuses a flush while any request waits; the `sglang-miles` build miles runs (the bench's
    server plays it for miles: `bench.server.profiles.ENGINES`) flushes while paused with nothing running. On
    upstream's rule, requests a step left behind make the next sync fail with a `TimeoutError`.

The trainer addresses each engine directly, never its router; the bench's server is both, so the calls go to the
job's server. No weights are sent (CPU, no model): one update call carries the new version and empty `names`,
`dtypes` and `shapes`, and nothing is broadcast; the mock applies the version as the engine would. A refused call
(an HTTP error) raises, as the frameworks' `raise_for_status` does: the step fails before its rollout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

FLUSH_ATTEMPTS = 60
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class WeightSync:
    """What one framework's trainer sends to its engines around a weight update."""

    group_name: str  # the weight-update process group (pipeline rank 0's)
    pause: dict[str, Any] = field(default_factory=dict)  # the body of /pause_generation
    flush: bool = True  # /flush_cache after the pause (miles: not after an `in_place` one)
    flush_retry_s: float = 1.0  # the wait before asking /flush_cache again once it refused
    post_process: bool = False  # /post_process_weights after the update (miles)


SLIME = WeightSync("slime-pp_0")
MILES = WeightSync("miles-pp_0", pause={"mode": "retract"}, flush_retry_s=0.0, post_process=True)


def configured(sync: WeightSync, args: dict[str, Any]) -> WeightSync:
    """`sync` under the run's framework arguments (the `args` target option): miles' `pause_generation_mode`."""
    mode = args.get("pause_generation_mode")
    if mode is None or "mode" not in sync.pause:  # slime pauses without a mode (the engine's default, abort)
        return sync
    return replace(sync, pause={"mode": mode}, flush=mode != "in_place")


async def connect(base_url: str, sync: WeightSync) -> None:
    """The trainer joining its engines' weight-update group (one engine of one GPU: world size 2)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        await _post(http, base_url, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": 0, "rank_offset": 1, "world_size": 2,
            "group_name": sync.group_name, "backend": "nccl"})


async def publish(base_url: str, sync: WeightSync, version: str) -> None:
    """One weight update: pause, flush, the update carrying `version`, (post-process,) continue."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as http:
        await _post(http, base_url, "/pause_generation", sync.pause)
        if sync.flush:
            await _flush(http, base_url, sync)
        await _post(http, base_url, "/update_weights_from_distributed", {
            "names": [], "dtypes": [], "shapes": [], "group_name": sync.group_name, "flush_cache": False,
            "weight_version": version})
        if sync.post_process:
            await _post(http, base_url, "/post_process_weights", {
                "restore_weights_before_load": False, "post_process_quantization": True, "post_load_weights": False})
        await _post(http, base_url, "/continue_generation", {})


async def _post(http: aiohttp.ClientSession, base_url: str, route: str, body: dict[str, Any]) -> None:
    async with http.post(f"{base_url}{route}", json=body) as reply:
        if reply.status >= 400:
            raise RuntimeError(f"weight sync: POST {route} answered {reply.status}: {(await reply.text())[:300]}")


async def _flush(http: aiohttp.ClientSession, base_url: str, sync: WeightSync) -> None:
    """`GET /flush_cache` until the engine flushes (it refuses while requests run or wait)."""
    for _ in range(FLUSH_ATTEMPTS):
        async with http.get(f"{base_url}/flush_cache") as reply:
            if reply.status == 200:
                return
        await asyncio.sleep(sync.flush_retry_s)
    raise TimeoutError(f"weight sync: {base_url}/flush_cache refused {FLUSH_ATTEMPTS} times")
