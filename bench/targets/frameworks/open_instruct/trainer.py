"""The trainer's side of open-instruct's async GRPO loop, one epoch of the job's groups.

open-instruct's `DataPreparationActor` primes the generator with `async_steps * prompts_per_step` prompts,
then for each training step calls `accumulate_inference_batches` (its code, unchanged), which takes results off
the Ray results queue, drops the ones too stale for `max_result_age_steps` (from #1738), replenishes a prompt
per result taken and returns the step's batch. After each step the trainer syncs weights: the engines'
`model_step` moves on, and here the bench's server is told the new version too.

The bench's data is finite where open-instruct's is not (it keeps drawing epochs), so the end of the run is a
bench decision, taken only where open-instruct would not be stuck: once every group of the job has come back
and some prompts are still in flight (the next epoch's, which the engine holds back), the results queue reports
Empty, and open-instruct's own requeue-on-timeout hands the partial batch back for a last, smaller step. With
nothing in flight at all, nothing can ever arrive, in open-instruct as here: the wait goes on and the bench's
watchdog reports the hang.

Without replenishing (`no-replenish`), the trainer feeds `prompts_per_step` prompts after each step, the way a
caller of `accumulate_inference_batches(replenish_prompts=False)` must.
"""

from __future__ import annotations

import json
import queue
import urllib.request
from typing import Any, Callable

from bench.records.sample import SampleRecord
from bench.targets.base import RolloutJob, TrajectorySpec

POLL_S = 0.5  # how often a waiting trainer checks the engine threads (open-instruct's health check)


class ResultsQueue:
    """The Ray results queue as `accumulate_inference_batches` sees it: the real queue, plus which prompts it
    handed over, the engine's health check while waiting, and the end-of-data rule above."""

    def __init__(self, real: Any, prompts: PromptQueue, total: int, check: Callable[[], None]) -> None:
        self.real, self.prompts, self.total, self.check = real, prompts, total, check
        self.handed: dict[int, int] = {}  # dataset index -> model_step of its result

    def get(self, timeout: float | None = None) -> Any:
        while True:
            self.check()
            try:
                result = self.real.get(timeout=POLL_S)
            except queue.Empty:
                in_flight = self.prompts.added - len(self.handed)
                if len(self.handed) >= self.total and in_flight > 0:
                    raise
                continue
            self.handed[result.index] = result.model_step
            return result

    def put(self, item: Any) -> None:  # requeue-on-timeout puts a partial batch back
        self.handed.pop(item.index, None)
        self.real.put(item)

    def qsize(self) -> int:
        return self.real.qsize()


class PromptQueue:
    """The Ray prompt queue, counting the prompts put in (what the generator owes results for)."""

    def __init__(self, real: Any) -> None:
        self.real, self.added = real, 0

    def put(self, item: Any, *args: Any, **kwargs: Any) -> None:
        self.added += 1
        self.real.put(item, *args, **kwargs)


def publish_version(base_url: str, step: int) -> None:
    """The weight sync as the server sees it: its version becomes the trainer's step (requests run on)."""
    body = json.dumps({"new_version": str(step), "abort_all_requests": False}).encode()
    request = urllib.request.Request(f"{base_url}/update_weight_version", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        answer.read()


def record(spec: TrajectorySpec, outcome: str, status: str, ids: list[int], logprobs: list[float] | None,
           mask: list[int], reward: float, model_step: int, details: dict[str, Any]) -> SampleRecord:
    """A sample as open-instruct handed it to the trainer (or dropped it): its tokens, its policy step."""
    return SampleRecord(spec.id, spec.group, outcome, status=status, prompt_length=len(spec.prompt_ids),
                        response_ids=list(ids), logprobs=None if logprobs is None else list(logprobs),
                        loss_mask=list(mask), response_length=len(ids), reward=reward,
                        weight_versions=[str(model_step)], details=details)


class Trainer:
    """Runs the steps; `emit` gets each sample when its batch is trained on, or when it is dropped."""

    def __init__(self, job: RolloutJob, groups: list[list[TrajectorySpec]], dataset: Any, tokenizer: Any,
                 engine: Any, prompt_queue: Any, results_queue: Any, *, age_limit: bool, replenish: bool,
                 work_dir: str, emit: Callable[[SampleRecord], None]) -> None:
        from open_instruct import data_loader, vllm_utils
        from open_instruct.data_types import EnvConfig

        self.job, self.groups, self.dataset, self.tokenizer, self.engine = job, groups, dataset, tokenizer, engine
        self.data_loader, self.emit, self.replenish = data_loader, emit, replenish
        self.async_steps = int(job.options.get("async_steps", 1))
        self.prompts_per_step = int(job.options.get("prompts_per_step", 2))
        sampling = groups[0][0].sampling_params
        self.config = vllm_utils.SamplingConfig(
            temperature=sampling.get("temperature", 1.0), top_p=sampling.get("top_p", 1.0),
            max_tokens=sampling.get("max_new_tokens", 1024), n=len(groups[0]))
        self.env = EnvConfig()
        self.prompts = PromptQueue(prompt_queue)
        self.results = ResultsQueue(results_queue, self.prompts, len(groups), engine.check)
        self.loader = data_loader.HFDataLoader(
            dataset=dataset, batch_size=1, seed=job.seed, dp_rank=0, dp_world_size=1, work_dir=work_dir,
            automatic_reshuffle=True, collator=data_loader.single_example_collator)
        self.options: dict[str, Any] = {}
        if age_limit:
            self.options["max_result_age_steps"] = self.async_steps  # as the DataPreparationActor wires it
        self.emitted: set[int] = set()

    def _feed(self, count: int) -> None:
        for _ in range(count):
            self.data_loader.add_prompt_to_generator(next(self.loader), self.loader._epoch, self.prompts, self.config,
                                                     is_eval=False, base_env_config=self.env)

    def run(self) -> None:
        publish_version(self.job.base_url, 0)
        self._feed(self.async_steps * self.prompts_per_step)
        step, want = 0, self.prompts_per_step
        while True:
            try:
                result, batch, metrics, _stats = self.data_loader.accumulate_inference_batches(
                    self.results, self.config, num_prompts=want, model_dims=None, tokenizer=self.tokenizer,
                    dataset=self.dataset, base_env_config=self.env, training_step=step,
                    replenish_prompts=self.replenish, iter_dataloader=self.loader, param_prompt_Q=self.prompts,
                    **self.options)
            except queue.Empty:  # the end of the job's data: open-instruct requeued its partial batch
                want = self.results.qsize()
                if want == 0:
                    self._drop_untrained()
                    return
                continue
            if result is None:
                continue
            self._train(step, result, batch, metrics)
            step += 1
            publish_version(self.job.base_url, step)
            self.engine.set_model_step(step)
            if not self.replenish:
                self._feed(self.prompts_per_step)

    def _train(self, step: int, result: Any, batch: Any, metrics: dict) -> None:
        n = self.config.n
        for i, (index, response) in enumerate(zip(batch.indices, result.responses)):
            spec = self.groups[index][i % n]
            finish = result.finish_reasons[i]
            self.emitted.add(index)
            details = {"training_step": step, "stale_results_dropped": metrics.get("stale_results_dropped")}
            self.emit(record(spec, "completed" if finish == "stop" else "truncated", finish.upper(), response,
                             result.logprobs[i], result.masks[i], batch.scores[i], batch.model_steps[i], details))
        self._drop_untrained()

    def _drop_untrained(self) -> None:
        """Groups whose result `accumulate_inference_batches` took and threw away (too stale): never trained,
        never generated again (replenishing draws the next prompt, not this one)."""
        for index, model_step in list(self.results.handed.items()):
            if index not in self.emitted:
                self.emitted.add(index)
                for spec in self.groups[index]:
                    self.emit(record(spec, "dropped", "STALE", [], None, [], 0.0, model_step,
                                     {"dropped_by": "max_result_age_steps"}))
