"""open-instruct's generation side, with the bench's server as its vLLM engine.

In open-instruct an `LLMRayActor` owns an in-process vLLM OpenAI server and three threads: a prefetch thread
(`_prefetch_worker`) takes prompts off the prompt queue (`add_request` stamps each with the actor's
`current_model_step`), an event loop runs `process_request` per sample (`GET /health`, then `POST
/v1/completions` with token ids), and `process_from_queue` gathers a prompt's samples into a
`GenerationResult` on the results queue. All of that is its own code, run here unchanged; only the actor
object is a stand-in, holding the fields those functions read, with `server_port` and `client` pointing at the
bench's server instead of a local vLLM.

Bench additions: the real `process_request` is wrapped so that each request names its trajectory (a header
the bench reads), the real `compute_rewards` so that the verifier stand-in knows the group it scores, and the
client notes when a request's body has been sent (`wait_sent`: a bench step ends once
the prompts it drew have gone out, so none of its requests reaches the server during the next step). The engine
and its threads live across the steps of a run, as open-instruct's `LLMRayActor` lives across training steps.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import time
import types
from concurrent.futures import Future
from typing import Any, Callable
from urllib.parse import urlparse

from bench.records.attribution import TRAJECTORY_HEADER, stamp
from bench.targets.base import RolloutJob
from faults.hooks import InjectedFault, raise_if_poisoned

TRAJECTORY: contextvars.ContextVar[str] = contextvars.ContextVar("rollout_bench_trajectory", default="")
SCORED: contextvars.ContextVar[int] = contextvars.ContextVar("rollout_bench_scored_group", default=-1)
SENT_EVENT = "send_request_body.complete"  # the HTTP transport's trace event once a request's body is written
WAIT_SENT_S = 60.0


def _named_client(base_url: str, sent: set[str]) -> Any:
    """open-instruct's `AsyncOpenAI` client (its timeout), sending the trajectory of the running request and noting
    in `sent` each trajectory whose request has been written to the socket (the transport's `trace` extension)."""
    import openai

    async def note_sent(request: Any) -> None:
        trajectory = request.headers.get(TRAJECTORY_HEADER)
        if trajectory:
            async def trace(event: str, _info: dict) -> None:
                if event.endswith(SENT_EVENT):
                    sent.add(trajectory)

            request.extensions["trace"] = trace

    http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [note_sent]})
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=3600, http_client=http)
    create = client.completions.create

    async def create_named(**kwargs: Any) -> Any:
        headers = {**(kwargs.pop("extra_headers", None) or {}), TRAJECTORY_HEADER: TRAJECTORY.get()}
        return await create(**kwargs, extra_headers=headers)

    client.completions.create = create_named
    return client


def _reward_stand_in(named: Callable[[int], str]) -> Callable[..., Any]:
    """The verifier: 1.0 for an answer that ended by itself (`stop`), else 0.0. Rewards are not under test; a reply
    the fault engine poisoned (`raise_after_generate`) makes it raise, as a crashing verifier would, the error
    stamped with the trajectory of the poisoned sample (`named(i)`: the i-th sample of the group being scored)."""

    async def reward(responses: Any, decoded: Any, ground_truths: Any, datasets: Any, finish_reasons: list[str],
                     infos: Any, queries: Any) -> tuple[list[float], dict]:
        for i, text in enumerate(decoded):
            try:
                raise_if_poisoned(text)
            except InjectedFault as error:
                stamp(error, named(i))
                raise
        return [1.0 if reason == "stop" else 0.0 for reason in finish_reasons], {}

    return reward


class Engine:
    """The actor stand-in and its three threads, running open-instruct's functions."""

    def __init__(self, job: RolloutJob, groups: list[list[Any]], tokenizer: Any, prompt_queue: Any,
                 results_queue: Any, eval_queue: Any) -> None:
        from open_instruct import vllm_utils

        self.vllm_utils = vllm_utils
        self.groups = groups  # the trainer's list of the run's groups (it grows with each step)
        self.loop = asyncio.new_event_loop()
        self.sent: set[str] = set()
        self.actor = types.SimpleNamespace(
            request_metadata={}, active_tasks={}, request_outputs={}, current_model_step=0,
            server_port=urlparse(job.base_url).port, client=_named_client(job.base_url, self.sent), model_name="bench",
            pools={}, per_turn_max_tokens=None, mask_tool_use=True, tool_call_timeout=1800.0, inflight_updates=True,
            llm_engine=types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=job.context_length),
                                             tokenizer=tokenizer),
            tool_parser=types.SimpleNamespace(get_tool_calls=lambda text: []), completion_queue=queue.Queue(),
            prompt_queue=prompt_queue, results_queue=results_queue, eval_results_queue=eval_queue,
            train_dataset=None, eval_dataset=None, _train_index_map={},
            _eval_index_map={}, reward_fn=_reward_stand_in(self._scored_sample),
            inference_batch_size=max(job.concurrency, 1), _should_stop=lambda: False, loop=self.loop)

    def start(self) -> None:
        vllm_utils, actor = self.vllm_utils, self.actor
        actor.loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="open-instruct-loop")
        actor.loop_thread.start()
        self._original = vllm_utils.process_request, vllm_utils.compute_rewards
        vllm_utils.process_request, vllm_utils.compute_rewards = self._process_request, self._compute_rewards
        actor._prefetch_future = _daemon(vllm_utils._prefetch_worker, actor, name="open-instruct-prefetch")
        actor._process_future = _daemon(vllm_utils.LLMRayActor.process_from_queue, actor, name="open-instruct-gather")

    def set_dataset(self, dataset: Any) -> None:
        """The run's rows so far (a step's groups are added as it starts); the row index is the group's number."""
        self.actor.train_dataset = dataset
        self.actor._train_index_map = {i: i for i in range(len(dataset))}

    def wait_sent(self, trajectories: set[str]) -> None:
        """Until every request of `trajectories` has been written to the server, checking the engine threads."""
        deadline = time.monotonic() + WAIT_SENT_S
        while not trajectories <= self.sent:
            self.check()
            if time.monotonic() > deadline:
                missing = sorted(trajectories - self.sent)
                raise TimeoutError(f"open-instruct's engine sent no request for {len(missing)} prompts' samples "
                                   f"within {WAIT_SENT_S:g} s of being asked (first: {', '.join(missing[:3])})")
            time.sleep(0.01)

    async def _process_request(self, actor: Any, sub_request_id: str, sampling_params: Any) -> Any:
        _prefix, _epoch, index, sample = sub_request_id.rsplit("_", 3)
        TRAJECTORY.set(self.groups[int(index)][int(sample)].id)
        return await self._original[0](actor, sub_request_id, sampling_params)

    async def _compute_rewards(self, actor: Any, result: Any, example: dict) -> Any:
        """open-instruct's `compute_rewards`, noting which group it scores (the verifier stand-in names it)."""
        SCORED.set(result.index)
        return await self._original[1](actor, result, example)

    def _scored_sample(self, sample: int) -> str:
        return self.groups[SCORED.get()][sample].id

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
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.vllm_utils.process_request, self.vllm_utils.compute_rewards = self._original


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
