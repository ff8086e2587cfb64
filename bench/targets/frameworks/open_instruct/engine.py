"""open-instruct's generation side, with the bench's server as its vLLM engine.

In open-instruct an `LLMRayActor` owns an in-process vLLM OpenAI server and three threads: a prefetch thread
(`_prefetch_worker`) takes prompts off the prompt queue (`add_request` stamps each with the actor's
`current_model_step`), an event loop runs `process_request` per sample (`GET /health`, then `POST
/v1/completions` with token ids), and `process_from_queue` gathers a prompt's samples into a
`GenerationResult` on the results queue. All of that is its own code, run here unchanged; only the actor
object is a stand-in, holding the fields those functions read, with `server_port` and `client` pointing at the
bench's server instead of a local vLLM.

Two bench additions wrap the real `process_request`: each request names its trajectory (a header the bench
reads), and a prompt of a second epoch (the priming and replenishing run past the job's one epoch of groups)
is held, never sent, so the server sees only the job's trajectories.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import types
from concurrent.futures import Future
from typing import Any, Callable
from urllib.parse import urlparse

from bench.records.attribution import TRAJECTORY_HEADER
from bench.targets.base import RolloutJob, TrajectorySpec

TRAJECTORY: contextvars.ContextVar[str] = contextvars.ContextVar("rollout_bench_trajectory", default="")


def _named_client(base_url: str) -> Any:
    """open-instruct's `AsyncOpenAI` client (its timeout), sending the trajectory of the running request."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=3600)
    create = client.completions.create

    async def create_named(**kwargs: Any) -> Any:
        headers = {**(kwargs.pop("extra_headers", None) or {}), TRAJECTORY_HEADER: TRAJECTORY.get()}
        return await create(**kwargs, extra_headers=headers)

    client.completions.create = create_named
    return client


def _reward_stand_in() -> Callable[..., Any]:
    """The verifier: 1.0 for an answer that ended by itself (`stop`), else 0.0. Rewards are not under test."""

    async def reward(responses: Any, decoded: Any, ground_truths: Any, datasets: Any, finish_reasons: list[str],
                     infos: Any, queries: Any) -> tuple[list[float], dict]:
        return [1.0 if reason == "stop" else 0.0 for reason in finish_reasons], {}

    return reward


class Engine:
    """The actor stand-in and its three threads, running open-instruct's functions."""

    def __init__(self, job: RolloutJob, groups: list[list[TrajectorySpec]], dataset: Any, tokenizer: Any,
                 prompt_queue: Any, results_queue: Any, eval_queue: Any) -> None:
        from open_instruct import vllm_utils

        self.vllm_utils = vllm_utils
        self.groups = groups
        self.loop = asyncio.new_event_loop()
        self.held: list[asyncio.Task] = []
        self.actor = types.SimpleNamespace(
            request_metadata={}, active_tasks={}, request_outputs={}, current_model_step=0,
            server_port=urlparse(job.base_url).port, client=_named_client(job.base_url), model_name="bench",
            pools={}, per_turn_max_tokens=None, mask_tool_use=True, tool_call_timeout=1800.0, inflight_updates=True,
            llm_engine=types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=job.context_length),
                                             tokenizer=tokenizer),
            tool_parser=types.SimpleNamespace(get_tool_calls=lambda text: []), completion_queue=queue.Queue(),
            prompt_queue=prompt_queue, results_queue=results_queue, eval_results_queue=eval_queue,
            train_dataset=dataset, eval_dataset=None, _train_index_map={i: i for i in range(len(dataset))},
            _eval_index_map={}, reward_fn=_reward_stand_in(), inference_batch_size=max(job.concurrency, 1),
            _should_stop=lambda: False, loop=self.loop)

    def start(self) -> None:
        vllm_utils, actor = self.vllm_utils, self.actor
        actor.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="open-instruct-loop")
        actor.loop_thread.start()
        self._original = vllm_utils.process_request
        vllm_utils.process_request = self._process_request
        actor._prefetch_future = _daemon(vllm_utils._prefetch_worker, actor, name="open-instruct-prefetch")
        actor._process_future = _daemon(vllm_utils.LLMRayActor.process_from_queue, actor, name="open-instruct-gather")

    async def _process_request(self, actor: Any, sub_request_id: str, sampling_params: Any) -> Any:
        _prefix, epoch, index, sample = sub_request_id.rsplit("_", 3)
        if epoch != "0":
            self.held.append(asyncio.current_task())  # type: ignore[arg-type]
            await asyncio.Event().wait()
        TRAJECTORY.set(self.groups[int(index)][int(sample)].id)
        return await self._original(actor, sub_request_id, sampling_params)

    def check(self) -> None:
        """open-instruct's own health check of the engine threads and requests: re-raises what failed there.

        It iterates `active_tasks` while the loop thread removes finished requests from it; the bench checks far
        more often than open-instruct's trainer does, so a resulting "changed size during iteration" is the
        bench's timing, not a finding: the check is taken again."""
        for _attempt in range(3):
            try:
                self.vllm_utils.LLMRayActor.check_background_threads(self.actor)
                return
            except RuntimeError as error:
                if "changed size during iteration" not in str(error):
                    raise

    def set_model_step(self, step: int) -> None:
        """What the trainer's weight sync does to each engine."""
        self.vllm_utils.LLMRayActor.set_model_step(self.actor, step)

    def stop(self) -> None:
        """Cancel what is still running; the prefetch and gather threads block on queues and stay as daemons."""
        for task in list(self.actor.active_tasks.values()):
            if isinstance(task, Future):
                task.cancel()
        for task in self.held:
            self.loop.call_soon_threadsafe(task.cancel)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.vllm_utils.process_request = self._original


def _daemon(function: Callable[..., Any], *args: Any, name: str) -> Future:
    """Run `function` in a daemon thread (it loops forever on a queue: a pool thread would block the worker's
    exit); the future holds what it raised, for `check_background_threads`."""
    future: Future = Future()

    def body() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as error:  # noqa: BLE001  (handed to the future, raised where it is checked)
            future.set_exception(error)

    threading.Thread(target=body, daemon=True, name=name).start()
    return future
