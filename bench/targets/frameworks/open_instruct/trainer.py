"""The trainer's side of open-instruct's async GRPO loop, kept across the steps of a run.

open-instruct's `DataPreparationActor` (`data_loader.py`, `_data_preparation_loop`) primes the generator with
`async_steps * prompts_per_step` prompts, then for each training step calls `accumulate_inference_batches` (its
code, unchanged), which takes results off the Ray results queue, drops the ones too stale for
`max_result_age_steps` (from #1738), replenishes a prompt per result taken and returns the step's batch. After each
training step the trainer syncs weights (`grpo_fast.py`, `weight_sync_thread`: the engines get the new weights and
their `model_step`, which `add_request` stamps on every prompt it takes from then on).

One bench step (`run`) is `prompts_per_step`-sized training steps of this one trainer: as many as the step's groups
make (T = groups / prompts_per_step), shifted by the priming: the generator runs `async_steps` training steps ahead
of the trainer, so the first step trains T - async_steps of them and the last one T + async_steps (it drains the
pipeline: the end of the data). Between bench steps nothing is torn down: the prompts in flight and the results
waiting on the queue are the next step's first batch, generated under the weights of the step before (that is the
lag `step_lag` judges). The weight sync after a bench step's last training step is the adapter's
`update_weights` before the next step; the syncs between the training steps inside one bench step stay here.

The bench's data is finite where open-instruct's is not, so a wait ends on a bench decision taken only where
open-instruct would not be stuck: once every prompt put in has come back and none can arrive without data the bench
has not handed over (draws are owed, `feed`), the results queue reports Empty and open-instruct's own
requeue-on-timeout hands the partial batch back: the last step trains it as a last, smaller batch; an earlier step
(more results dropped as stale than the pipeline's depth) ends there and the next step takes it up. With prompts
still in flight, or none in flight and no draw owed (a starved pipeline: nothing was put in to replace what was
taken), nothing ends: open-instruct waits, and the bench's watchdog reports a hang.

Without replenishing (`no-replenish`), the trainer feeds `prompts_per_step` prompts after each training step, the way
a caller of `accumulate_inference_batches(replenish_prompts=False)` must.
"""

from __future__ import annotations

import json
import queue
import urllib.request
from typing import Any, Callable

from bench.records.sample import SampleRecord
from bench.targets.base import RolloutJob, TrajectorySpec

from .feed import PromptQueue, StepFeed

POLL_S = 0.5  # how often a waiting trainer checks the engine threads (open-instruct's health check)


class ResultsQueue:
    """The Ray results queue as `accumulate_inference_batches` sees it: the real queue, plus which prompts it
    handed over, the engine's health check while waiting, and the end-of-data rule above."""

    def __init__(self, real: Any, prompts: PromptQueue, check: Callable[[], None]) -> None:
        self.real, self.prompts, self.check = real, prompts, check
        self.handed: dict[int, int] = {}  # dataset index -> model_step of its result

    def get(self, timeout: float | None = None) -> Any:
        while True:
            self.check()
            try:
                result = self.real.get(timeout=POLL_S)
            except queue.Empty:
                if self.prompts.added - len(self.handed) <= 0 and self.prompts.owed > 0:
                    raise  # nothing in flight and draws owed: only data not handed over yet could bring a result
                continue  # in flight, or starved with nothing owed (open-instruct hangs: the watchdog says so)
            self.handed[result.index] = result.model_step
            return result

    def put(self, item: Any) -> None:  # requeue-on-timeout puts a partial batch back
        self.handed.pop(item.index, None)
        self.real.put(item)

    def qsize(self) -> int:
        return self.real.qsize()


def publish_version(base_url: str, version: int) -> None:
    """The weight sync as the server sees it: its version becomes the trainer's `model_step` (requests run on)."""
    body = json.dumps({"new_version": str(version), "abort_all_requests": False}).encode()
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
    """The trainer's state across bench steps (its data, queues, training-step count); `step` runs one bench step,
    handing each sample to `emit` when its batch is trained on, or when it is dropped."""

    def __init__(self, job: RolloutJob, groups: list[list[TrajectorySpec]], tokenizer: Any, engine: Any,
                 prompt_queue: Any, results_queue: Any, *, age_limit: bool, replenish: bool) -> None:
        from open_instruct import data_loader
        from open_instruct.data_types import EnvConfig

        self.job, self.tokenizer, self.engine = job, tokenizer, engine
        self.data_loader, self.replenish = data_loader, replenish
        self.async_steps = int(job.options.get("async_steps", 1))
        self.prompts_per_step = int(job.options.get("prompts_per_step", 2))
        self.groups = groups  # the run's groups so far, in hand-over order (the engine reads this list too)
        self.dataset: Any = None
        self.config: Any = None
        self.env = EnvConfig()
        self.feed = StepFeed()
        self.prompts = PromptQueue(prompt_queue, lambda index: [spec.id for spec in self.groups[index]])
        self.results = ResultsQueue(results_queue, self.prompts, engine.check)
        self.options: dict[str, Any] = {}
        if age_limit:
            self.options["max_result_age_steps"] = self.async_steps  # as the DataPreparationActor wires it
        self.emitted: set[int] = set()
        self.model_step = 0  # training steps done: the version the engines stamp once synced
        self.emit: Callable[[SampleRecord], None] = lambda record: None

    def planned(self, groups: int, first: bool) -> int:
        """Training steps a bench step of `groups` groups makes (not the last: that one drains)."""
        per_step, ahead = self.prompts_per_step, self.async_steps
        if groups % per_step or groups // per_step - (ahead if first else 0) < 1:
            size = len(self.groups[0])
            raise ValueError(
                f"open-instruct over --steps {self.job.steps}: use --n a multiple of {per_step * size} trajectories, "
                f"at least {(ahead + 1) * per_step * size}: each step's {groups} groups must make whole training steps "
                f"of prompts_per_step={per_step} groups, more than async_steps={ahead} of them in the first step (the "
                "generator is primed that far ahead)")
        return groups // per_step - (ahead if first else 0)

    def step(self, job: RolloutJob, emit: Callable[[SampleRecord], None]) -> None:
        """One bench step: its groups handed over, the owed draws made, then its training steps."""
        self.emit = emit
        first = not self.groups
        self._hand_over(list(job.groups().values()))
        last = job.step == job.steps - 1
        planned = None if last else self.planned(len(job.groups()), first)
        if first:
            self._feed(self.async_steps * self.prompts_per_step)
        else:
            owed, self.prompts.owed = self.prompts.owed, 0
            self._feed(owed)
        trained, want = 0, self.prompts_per_step
        while planned is None or trained < planned:
            try:
                result, batch, metrics, _stats = self.data_loader.accumulate_inference_batches(
                    self.results, self.config, num_prompts=want, model_dims=None, tokenizer=self.tokenizer,
                    dataset=self.dataset, base_env_config=self.env, training_step=self.model_step,
                    replenish_prompts=self.replenish, iter_dataloader=self.feed, param_prompt_Q=self.prompts,
                    **self.options)
            except queue.Empty:  # nothing can come without more data: open-instruct requeued its partial batch
                want = self.results.qsize()
                if want == 0 or not last:
                    break
                continue
            if result is None:
                continue
            self._train(result, batch, metrics)
            trained += 1
            self.model_step += 1
            if planned is None or trained < planned:  # the sync after the step's last one is `update_weights`
                self.sync(job.base_url)
            if not self.replenish:
                self._feed(self.prompts_per_step)
        self._drop_untrained()
        self.engine.wait_sent(self.prompts.expected)

    def sync(self, base_url: str) -> int:
        """The weight sync after a training step: the server's weights and the engines' `model_step`."""
        publish_version(base_url, self.model_step)
        self.engine.set_model_step(self.model_step)
        return self.model_step

    def _hand_over(self, groups: list[list[TrajectorySpec]]) -> None:
        """A step's groups become dataset rows (the row index is the group's number in the run) and the feed's."""
        from datasets import concatenate_datasets
        from open_instruct import vllm_utils

        self.feed.skip_undrawn()
        start = len(self.groups)
        self.groups.extend(groups)
        rows = _dataset(groups, start)
        self.dataset = rows if self.dataset is None else concatenate_datasets([self.dataset, rows])
        self.engine.set_dataset(self.dataset)
        self.feed.add([rows[i] for i in range(len(rows))])
        if self.config is None:
            sampling = groups[0][0].sampling_params
            self.config = vllm_utils.SamplingConfig(
                temperature=sampling.get("temperature", 1.0), top_p=sampling.get("top_p", 1.0),
                max_tokens=sampling.get("max_new_tokens", 1024), n=len(groups[0]))

    def _feed(self, count: int) -> None:
        for _ in range(count):
            self.data_loader.add_prompt_to_generator(next(self.feed), self.feed._epoch, self.prompts, self.config,
                                                     is_eval=False, base_env_config=self.env)

    def _train(self, result: Any, batch: Any, metrics: dict) -> None:
        n = self.config.n
        for i, (index, response) in enumerate(zip(batch.indices, result.responses)):
            spec = self.groups[index][i % n]
            finish = result.finish_reasons[i]
            self.emitted.add(index)
            details = {"training_step": self.model_step, "stale_results_dropped": metrics.get("stale_results_dropped")}
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


def _dataset(groups: list[list[TrajectorySpec]], start: int) -> Any:
    """One dataset row per group, in open-instruct's column names; the row index names the group."""
    from datasets import Dataset
    from open_instruct.dataset_transformation import (
        GROUND_TRUTHS_KEY,
        INPUT_IDS_PROMPT_KEY,
        RAW_PROMPT_KEY,
        VERIFIER_SOURCE_KEY,
    )

    return Dataset.from_dict({
        "index": list(range(start, start + len(groups))), INPUT_IDS_PROMPT_KEY: [g[0].prompt_ids for g in groups],
        GROUND_TRUTHS_KEY: [""] * len(groups), VERIFIER_SOURCE_KEY: ["bench"] * len(groups),
        RAW_PROMPT_KEY: [g[0].prompt_text for g in groups]})
