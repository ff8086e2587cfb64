"""The inference server verl's agent loops talk to, as verl sees it: a Ray actor with `generate`.

verl does not speak HTTP to its engine: `LLMServerClient` asks the `GlobalRequestLoadBalancer` actor for a
server handle and awaits `server.generate.remote(request_id, prompt_ids, sampling_params, ...)`, which its
SGLang server actor answers in-process. On CPU there is no engine, so this actor stands in for that
server actor: it turns the call into SGLang's native `POST /generate` against the bench server and reads
the answer the way verl 0.8.0's SGLang server does (the finish reason's `type`; logprobs from
`output_token_logprobs`, dropped with the tokens when their lengths disagree). An HTTP error or a dropped
connection raises here, as an engine failure raises in the real actor, and reaches verl's agent loop as a
`RayTaskError`. Everything from `LLMServerClient` up is verl's own code.

The bench client (`loop.BenchLLMClient`) adds one keyword to verl's call: the trajectory the agent loop works
for, which this actor sends as the request's trajectory header, so the server never has to guess among a
GRPO group's identical prompts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bench.records.attribution import TRAJECTORY_HEADER

TRAJECTORY_KEYWORD = "bench_trajectory"


class EngineRequestError(RuntimeError):
    """The bench server's answer failed (an HTTP error status, a dropped connection): the engine call fails."""


class BenchEngine:
    """The server handle's behaviour (made a Ray actor with `ray.remote` in the run, where Ray is started)."""

    def __init__(self, base_url: str, prompt_length: int, response_length: int, context_length: int) -> None:
        self.base_url = base_url.rstrip("/")
        self.prompt_length, self.response_length = prompt_length, response_length
        self.context_length = context_length
        self.finish_reasons: dict[str, str | None] = {}  # trajectory -> the finish reason of its last answer
        self.global_steps: int | None = 0  # verl's weight version, stamped on every answer (`set_global_steps`)
        self._http: aiohttp.ClientSession | None = None

    async def generate(self, prompt_ids: Any, sampling_params: dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None, **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        trajectory = kwargs.pop(TRAJECTORY_KEYWORD, None)
        prompt_ids = [int(t) for t in prompt_ids]
        params = dict(sampling_params)
        budget = self.context_length - len(prompt_ids) - 1
        if budget < 0:
            raise ValueError(f"Prompt length ({len(prompt_ids)}) exceeds the model's maximum context length "
                             f"({self.context_length}).")
        wanted = params.pop("max_new_tokens", params.pop("max_tokens", None))
        if wanted is None:  # verl's default: the response budget, within the prompt + response window
            wanted = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        params["max_new_tokens"] = max(0, min(int(wanted), budget))
        return_logprob = bool(params.pop("logprobs", False))
        body = {"rid": request_id, "input_ids": prompt_ids, "sampling_params": params,
                "return_logprob": return_logprob}
        headers = {TRAJECTORY_HEADER: trajectory} if trajectory else {}
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        try:
            async with self._http.post(f"{self.base_url}/generate", json=body, headers=headers) as answer:
                answer.raise_for_status()
                output = await answer.json()
        except aiohttp.ClientError as error:  # aiohttp's errors do not survive Ray's pickling: say it plainly
            raise EngineRequestError(f"POST /generate for {trajectory or request_id}: {type(error).__name__}: "
                                     f"{error}") from None
        meta = output.get("meta_info", {})
        finish = meta.get("finish_reason")
        finish_type = finish["type"] if finish else None
        if trajectory:
            self.finish_reasons[trajectory] = finish_type
        token_ids = list(output.get("output_ids", []))
        log_probs: list[float] | None = None
        if return_logprob:
            entries = meta.get("output_token_logprobs") or []
            if entries and len(entries) == len(token_ids):
                log_probs = [float(entry[0]) for entry in entries]
            else:  # verl's server drops both when they disagree (an abort, max_new_tokens=0)
                token_ids, log_probs = [], []
        return TokenOutput(token_ids=token_ids, log_probs=log_probs, stop_reason=finish_type,
                           extra_fields={"global_steps": self.global_steps})

    async def set_global_steps(self, global_steps: int) -> None:
        """The trainer's weight sync names the step its weights come from (SGLangHttpServer.set_global_steps).
        Until then 0, the version verl 0.9.1's trainer sets before its first step."""
        self.global_steps = global_steps

    async def finish_reasons_seen(self) -> dict[str, str | None]:
        return dict(self.finish_reasons)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            await asyncio.sleep(0)

