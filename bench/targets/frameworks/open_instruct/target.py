"""`open-instruct`: open-instruct's async GRPO data path from a source checkout, in its own environment.

One run is the job's groups through open-instruct's own code: `add_prompt_to_generator` onto a
real Ray prompt queue, its engine functions (`_prefetch_worker`, `add_request`, `process_request`,
`process_from_queue`; see `engine`) generating against the bench's vLLM-shaped `/v1/completions`, and
`accumulate_inference_batches` taking each training step's batch off a real Ray results queue (see `trainer`).
A sample is emitted when its batch is trained on, carrying the `model_step` open-instruct stamped on its
request, or as `dropped` when open-instruct threw its result away for being too stale.

Options (`--target-option`): `async_steps` (1; how many steps generation may run ahead, and open-instruct's
`max_result_age_steps`, which the adapter declares as its `max_weight_lag`), `prompts_per_step` (2).

Variants:
- `shipped` (default): as the checkout's `DataPreparationActor` calls it: replenishing, and with
  `max_result_age_steps = async_steps` where the checkout has that option (#1738 and later). Seed 001: before
  #1738 a result whose answer came back late is trained on however stale (`staleness`); from #1738 on it is
  dropped and a fresh prompt replenished.
- `no-replenish`: `max_result_age_steps` without replenishing, the configuration #1738's review warned drains
  the pipeline. #1738 refuses it with a ValueError before any result is taken (the bench reports that crash,
  `batch_survival`, with open-instruct's traceback); the hang the review predicted is `ref-accumulator:unfixed`'s
  (on the real code the trainer never runs ahead of a held answer without replenishing, so nothing goes stale).

In a run of many steps (`run --steps K`) one trainer and one engine serve every step, as open-instruct's trainer
keeps its `DataPreparationActor` and engines across training steps: each bench step is a whole number of its
training steps (see `trainer`: the generator runs `async_steps` training steps ahead, so what a step trains on was
partly generated in the step before, under older weights), the weight sync after a step's last training step is
`update_weights`, and every record reaches the bench while the step that trains on it runs (the lag `step_lag`
judges against `max_weight_lag`). The groups of one step must make whole training steps of `prompts_per_step`,
more than `async_steps` of them.

Ray runs for the job only (`prepare` starts it, `run` stops it after the last step; see `local_ray`).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
from pathlib import Path
from typing import Any

from bench.steps.loop import stamped
from bench.targets.base import Emit, RolloutJob
from bench.targets.frameworks import local_ray

from ..checkout import Checkout, named_source, read_checkout
from ..options import check_options
from .trainer import publish_version

VARIANTS = ("shipped", "no-replenish")
OPTIONS = ("source", "async_steps", "prompts_per_step")
PATH_ENV = "ROLLOUT_BENCH_OPEN_INSTRUCT_PATH"
MARKER = "open_instruct/data_loader.py"
RAY_CPUS = 4  # three queue actors and their workers
STUBS_HOOK = "bench.targets.frameworks.open_instruct.stubs.install"
CODE_ROOT = Path(__file__).resolve().parents[4]  # the checkout holding `bench`: Ray's workers import it


class OpenInstructTarget:
    variants = VARIANTS
    fail_fast = True  # a failed request surfaces in the trainer's health check of the engines and ends the run

    def __init__(self, variant: str = "shipped") -> None:
        if variant not in VARIANTS:
            raise ValueError(f"open-instruct has variants {', '.join(VARIANTS)}, not {variant!r}")
        self.variant = variant
        self.name = f"open-instruct:{variant}"
        self.checkout: Checkout | None = None

    def warm_up(self, options: dict[str, Any]) -> None:
        """The checkout onto the import path and open-instruct's modules imported (torch, transformers, Ray:
        tens of seconds); Ray itself starts with the job."""
        check_options("open-instruct", options, OPTIONS, {"async_steps": 1, "prompts_per_step": 1})
        named = named_source(options, PATH_ENV)
        if named is None:
            raise ValueError(f"open-instruct runs from a source checkout: give --source DIR (or set {PATH_ENV})")
        checkout = read_checkout("open-instruct", named, MARKER)
        if self.checkout is not None and self.checkout.path != checkout.path:
            raise ValueError(f"open-instruct: this worker imported {self.checkout.path}, not {checkout.path}")
        self.checkout = checkout
        self.async_steps = int(options.get("async_steps", 1))
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if str(checkout.path) not in sys.path:
            sys.path.insert(0, str(checkout.path))
        from . import stubs

        stubs.install()
        try:
            from open_instruct import data_loader, vllm_utils  # noqa: F401  (the slow imports, before any fork)
        except ModuleNotFoundError as missing:
            raise ModuleNotFoundError(f"open-instruct at {checkout.path} imports {missing.name!r}, which this "
                                      f"interpreter ({sys.executable}) lacks: build its environment with "
                                      "`make open-instruct-env`, or name one with --python") from missing
        if self.variant == "no-replenish" and not _has_age_limit(data_loader):
            raise ValueError(f"open-instruct at {checkout.path} has no max_result_age_steps (it came with #1738): "
                             "the no-replenish variant drops stale results, which this code never does")

    def framework_info(self) -> dict[str, str]:
        """The checkout and its commit, and the staleness open-instruct is configured to accept: results up to
        `async_steps` policies behind (its `max_result_age_steps`); the bench's bound widens to it."""
        info = self.checkout.info() if self.checkout else {"framework": "open-instruct"}
        return info | {"max_weight_lag": str(getattr(self, "async_steps", 1))}

    def prepare(self, job: RolloutJob) -> None:
        """Ray and its three queue actors up; each actor has imported open-instruct (its first `put` unpickles
        open-instruct objects), so none of that start-up counts against the run. Once per run: a later step finds
        them up (the steps loop calls `prepare` before every step)."""
        if getattr(self, "queues", None) is not None:
            return
        self.warm_up(job.options)
        from open_instruct import vllm_utils
        from ray.util import queue as ray_queue

        self.session = local_ray.session_dir()
        try:
            local_ray.start(self.session, RAY_CPUS, [CODE_ROOT, self.checkout.path], STUBS_HOOK)
            self.queues = [ray_queue.Queue() for _ in range(3)]  # prompts, results, eval results
            probe = vllm_utils.SamplingConfig(temperature=1.0)
            for actor_queue in self.queues:
                actor_queue.put(probe)
                actor_queue.get(timeout=300)
        except BaseException:
            self._stop_ray()
            raise

    async def update_weights(self, job: RolloutJob) -> str:
        """The trainer's weight sync before step `job.step` (`run --steps K`): the sync after the previous step's
        last training step (`grpo_fast.py`, `weight_sync_thread`), which sets the server's version and the engines'
        `model_step` to the training steps done. Before step 0 nothing has trained: the engines hold the initial
        weights, version 0 (open-instruct's engines start at `model_step` 0)."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            await asyncio.to_thread(publish_version, job.base_url, 0)
            return "0"
        return str(await asyncio.to_thread(trainer.sync, job.base_url))

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        """One step: its groups through the trainer and engine the run keeps (made at the first step); both, and
        Ray, are torn down after the last step, or after a step that raised when the run stops there."""
        if getattr(self, "queues", None) is None:
            await asyncio.to_thread(self.prepare, job)
        loop = asyncio.get_running_loop()
        ended = job.step == job.steps - 1
        try:
            # stamped in the trainer's thread: it syncs weights right after handing over (`steps.loop.stamped`)
            await asyncio.to_thread(self._step, job, lambda record: loop.call_soon_threadsafe(emit, stamped(record)))
        except BaseException:
            ended = ended or job.on_step_failure == "stop"
            raise
        finally:
            if ended:
                await asyncio.to_thread(self._stop)

    def _step(self, job: RolloutJob, emit: Emit) -> None:
        if getattr(self, "trainer", None) is None:
            self._start_trainer(job)
        self.trainer.step(job, emit)

    def _start_trainer(self, job: RolloutJob) -> None:
        from open_instruct import data_loader
        from transformers import AutoTokenizer

        from .engine import Engine
        from .trainer import Trainer

        tokenizer = AutoTokenizer.from_pretrained(str(job.tokenizer_path))
        prompts, results, evals = self.queues
        groups: list[list[Any]] = []  # the run's groups, one list: the engine names each request's trajectory in it
        engine = Engine(job, groups, tokenizer, prompts, results, evals)
        age_limit = _has_age_limit(data_loader)  # `no-replenish` needs it: checked in warm-up
        trainer = Trainer(job, groups, tokenizer, engine, prompts, results, age_limit=age_limit,
                          replenish=self.variant == "shipped")
        if job.steps == 1:  # no steps loop calls `update_weights`: the trainer states its initial version itself
            publish_version(job.base_url, 0)
        engine.start()
        self.trainer = trainer

    def _stop(self) -> None:
        trainer, self.trainer = getattr(self, "trainer", None), None
        try:
            if trainer is not None:
                trainer.engine.stop()
        finally:
            self._stop_ray()

    def _stop_ray(self) -> None:
        self.queues = None
        local_ray.stop(self.session)


def _has_age_limit(data_loader: Any) -> bool:
    """Whether this open-instruct can drop stale results (#1738's `max_result_age_steps`)."""
    return "max_result_age_steps" in inspect.signature(data_loader.accumulate_inference_batches).parameters
