"""A local Ray runtime for one run, as the Ray-based frameworks (verl, open-instruct) need it on CPU.

Started in the run's own worker process, never in warm-up (a warm worker forks after warm-up and Ray does
not survive a fork); usage stats off and no dashboard (nothing leaves 127.0.0.1). The session folder is short
(Ray's socket paths are limited to 107 bytes), named after the process that owns it, and removed at the end;
folders of processes that died (a worker killed for a hang never reaches its teardown) go at the next start.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SESSION_PREFIX = "rb-ray-"


def session_dir() -> Path:
    """A fresh session folder for this process, after removing those whose owner is gone."""
    import psutil

    for folder in Path("/tmp").glob(f"{SESSION_PREFIX}*"):
        owner = folder.name[len(SESSION_PREFIX):].partition("-")[0]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{os.getpid()}-", dir="/tmp"))


def start(session: Path, num_cpus: int, code_paths: list[Path], setup_hook: str | None = None) -> None:
    """`ray.init` whose workers import `code_paths` first (the bench, a framework checkout) and, when given, run
    `setup_hook` (a `module.function`) before anything is unpickled in them."""
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    path = [str(p) for p in code_paths] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {"PYTHONPATH": os.pathsep.join(path), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "RAY_USAGE_STATS_ENABLED": "0"}
    runtime_env: dict[str, object] = {"env_vars": env}
    if setup_hook:
        runtime_env["worker_process_setup_hook"] = setup_hook
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, _temp_dir=str(session),
             runtime_env=runtime_env, configure_logging=False)


def stop(session: Path, grace_s: float = 15.0) -> None:
    """`ray.shutdown()`, then wait for every process Ray started to be gone: shutdown returns while its
    actor processes are still exiting. Stragglers after `grace_s` are killed; all of them are ours."""
    import psutil
    import ray

    started = psutil.Process().children(recursive=True)  # raylet, GCS and, beneath them, actors and workers
    try:
        ray.shutdown()
    finally:
        _gone, alive = psutil.wait_procs(started, timeout=grace_s)
        for process in alive:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        shutil.rmtree(session, ignore_errors=True)
