"""`open-instruct`: open-instruct's async GRPO data path from a source checkout, in its own environment.

One run is one epoch of the job's groups through open-instruct's own code: `add_prompt_to_generator` onto a
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

Ray runs for the job only (`prepare` starts it, `run` stops it; see `local_ray`).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.targets.base import Emit, RolloutJob
from bench.targets.frameworks import local_ray

from ..checkout import Checkout, named_source, read_checkout
from ..options import check_options

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
        open-instruct objects), so none of that start-up counts against the run."""
        self.warm_up(job.options)
        from open_instruct import vllm_utils
        from ray.util import queue as ray_queue

        self.session = local_ray.session_dir()
        self.scratch = tempfile.TemporaryDirectory(prefix="rollout-bench-open-instruct-")
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

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        if getattr(self, "queues", None) is None:
            await asyncio.to_thread(self.prepare, job)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.to_thread(self._train, job, lambda record: loop.call_soon_threadsafe(emit, record))
        finally:
            await asyncio.to_thread(self._stop_ray)

    def _train(self, job: RolloutJob, emit: Emit) -> None:
        from open_instruct import data_loader
        from transformers import AutoTokenizer

        from .engine import Engine
        from .trainer import Trainer

        groups = list(job.groups().values())
        dataset = _dataset(groups)
        tokenizer = AutoTokenizer.from_pretrained(str(job.tokenizer_path))
        prompts, results, evals = self.queues
        engine = Engine(job, groups, dataset, tokenizer, prompts, results, evals)
        age_limit = _has_age_limit(data_loader)  # `no-replenish` needs it: checked in warm-up
        trainer = Trainer(job, groups, dataset, tokenizer, engine, prompts, results, age_limit=age_limit,
                          replenish=self.variant == "shipped", work_dir=self.scratch.name, emit=emit)
        engine.start()
        try:
            trainer.run()
        finally:
            engine.stop()

    def _stop_ray(self) -> None:
        self.queues = None
        try:
            local_ray.stop(self.session)
        finally:
            self.scratch.cleanup()


def _has_age_limit(data_loader: Any) -> bool:
    """Whether this open-instruct can drop stale results (#1738's `max_result_age_steps`)."""
    return "max_result_age_steps" in inspect.signature(data_loader.accumulate_inference_batches).parameters


def _dataset(groups: list[list[Any]]) -> Any:
    """One dataset row per group, in open-instruct's column names; the row index names the group."""
    from datasets import Dataset
    from open_instruct.dataset_transformation import (
        GROUND_TRUTHS_KEY,
        INPUT_IDS_PROMPT_KEY,
        RAW_PROMPT_KEY,
        VERIFIER_SOURCE_KEY,
    )

    return Dataset.from_dict({
        "index": list(range(len(groups))), INPUT_IDS_PROMPT_KEY: [g[0].prompt_ids for g in groups],
        GROUND_TRUTHS_KEY: [""] * len(groups), VERIFIER_SOURCE_KEY: ["bench"] * len(groups),
        RAW_PROMPT_KEY: [g[0].prompt_text for g in groups]})
