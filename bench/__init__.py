"""rollout-bench: trace-replay fault injection for the rollout code of LLM RL stacks.

The public API, for plug-ins, notebooks and scripts; everything else under `bench` is internal and may move:

    from bench import RunConfig, run_blocking          # one run in code (`await run(config)` inside a loop)
    from faults import resolve_plan                     # plans, rules and the fault catalogue: `faults`
    result = run_blocking(RunConfig(target="mymodule:MyTarget", plan=resolve_plan("seed-000").with_seed(3), n=40))
    result.violations, result.records                  # RunResult: the verdict and every sample

    from bench import load_report, format_summary, wilson_interval   # notebooks: a report or sweep folder
    tables = load_report("reports/nightly")             # pandas tables: "trajectories", "requests", "faults", ...
    print(format_summary(tables["summary"]))            # wilson_interval(k, n): a drop rate's 95% interval

    from bench import TargetAdapter, RolloutJob, TrajectorySpec, Emit, SampleRecord, ErrorInfo   # a plug-in
    from bench import OUTCOMES, DROPPED_OUTCOMES, TRAJECTORY_HEADER, trajectory_scope, raise_if_poisoned

Names resolve on first use, so `import bench` stays cheap (the worker and the pytest plugin import it in
every process). Old import paths from before the layout by concept keep working with a DeprecationWarning
(`bench._moved`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bench import _moved

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "run": "bench.orchestration.runner",
    "run_blocking": "bench.orchestration.runner",
    "RunConfig": "bench.orchestration.runner",
    "RunResult": "bench.orchestration.runner",
    "load_report": "bench.report",
    "format_summary": "bench.report",
    "wilson_interval": "bench.report.intervals",
    "TargetAdapter": "bench.targets.base",
    "RolloutJob": "bench.targets.base",
    "TrajectorySpec": "bench.targets.base",
    "Emit": "bench.targets.base",
    "SampleRecord": "bench.records.sample",
    "ErrorInfo": "bench.records.sample",
    "OUTCOMES": "bench.records.sample",
    "DROPPED_OUTCOMES": "bench.records.sample",
    "TRAJECTORY_HEADER": "bench.records.attribution",
    "trajectory_scope": "bench.records.attribution",
    "raise_if_poisoned": "faults.hooks",
}
_RENAMED = {"load_report": "load", "wilson_interval": "wilson"}  # public name -> its name in the defining module

if TYPE_CHECKING:
    from bench.orchestration.runner import RunConfig as RunConfig
    from bench.orchestration.runner import RunResult as RunResult
    from bench.orchestration.runner import run as run
    from bench.orchestration.runner import run_blocking as run_blocking
    from bench.records.attribution import TRAJECTORY_HEADER as TRAJECTORY_HEADER
    from bench.records.attribution import trajectory_scope as trajectory_scope
    from bench.records.sample import DROPPED_OUTCOMES as DROPPED_OUTCOMES
    from bench.records.sample import OUTCOMES as OUTCOMES
    from bench.records.sample import ErrorInfo as ErrorInfo
    from bench.records.sample import SampleRecord as SampleRecord
    from bench.report import format_summary as format_summary
    from bench.report import load as load_report
    from bench.report.intervals import wilson as wilson_interval
    from bench.targets.base import Emit as Emit
    from bench.targets.base import RolloutJob as RolloutJob
    from bench.targets.base import TargetAdapter as TargetAdapter
    from bench.targets.base import TrajectorySpec as TrajectorySpec
    from faults.hooks import raise_if_poisoned as raise_if_poisoned


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'bench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = ["DROPPED_OUTCOMES", "Emit", "ErrorInfo", "OUTCOMES", "RolloutJob", "RunConfig", "RunResult", "SampleRecord",
           "TRAJECTORY_HEADER", "TargetAdapter", "TrajectorySpec", "format_summary", "load_report", "raise_if_poisoned",
           "run", "run_blocking", "trajectory_scope", "wilson_interval"]

_moved.install()
