"""`rollout-bench sweep --ray`: each grid point as one Ray task, on whichever node has a CPU free.

The task runs exactly what the local executor runs (`run_point`: the same `rollout-bench run`
subprocess, its timeout, its lifeline) into a scratch folder on its node, then returns the run's
report folder as a gzipped tarball through the object store; the driver unpacks it into
`DIR/runs/<id>/`. The task's row is computed on the node from that folder by the same code as a local
run's, so `sweep.csv` does not depend on the executor (but for the `nodes` and `attempts` columns).

The task is a streaming generator: its first item says which node it started on, before the run, so
the driver knows where every attempt is, even one whose node then dies. Retries are the driver's, not
Ray's (`max_retries=0`): a task that fails because its worker or node died (a Ray system error) is
submitted again, up to `MAX_ATTEMPTS` attempts, and the row records them (`attempts`, and `nodes`: each
attempt's node, `;`-separated). A run whose node died on every attempt is a row with outcome `lost`.
An exception raised by the task's own code (`RayTaskError`) is not retried: it is a `crashed` row
naming it.

Before anything runs, `check_nodes` runs a tiny task on every alive node with CPUs: it imports the
bench, and reports its version, path and interpreter, and whether each target's environment is there.
A node that cannot, or has another version than the driver, stops the sweep with a message naming it.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from bench import __version__
from bench.isolation.escapees import SWEEP_MARKER, kill_marked

from .grid import GridPoint, SweepError
from .table import COLUMNS

MAX_ATTEMPTS = 3  # a run whose node dies is tried on up to this many nodes (the same one only if it comes back)
CONNECT_TIMEOUT_S = 10.0  # the head node's GCS port must accept a connection within this
PROBE_TIMEOUT_S = 300.0  # a node setting up a runtime_env (pip) may take minutes before it answers


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise SweepError("--ray: Ray is not installed here: pip install 'rollout-bench[ray]'") from None
    return ray


@dataclass(frozen=True)
class NodeInfo:
    """What the probe task found on one node."""

    id: str
    host: str
    address: str
    cpus: float
    version: str
    bench: str
    python: str

    @property
    def short(self) -> str:
        return self.id[:8]


def _probe(targets: list[str], run_args: list[str]) -> dict[str, Any]:
    """On a node: the bench that its runs would use, and what is missing for the sweep's targets."""
    import bench
    from bench.targets.frameworks.envs import TARGET_ENVS, target_python

    ray = _ray()
    missing = []
    python = run_args[run_args.index("--python") + 1] if "--python" in run_args else None
    if python is not None and not Path(python).exists():
        missing.append(f"--python {python}: no such interpreter")
    for spec in targets:
        family = spec.partition(":")[0]
        if python is None and family in TARGET_ENVS and target_python(family) is None:
            missing.append(f"target {spec}: its environment ({' or '.join(TARGET_ENVS[family])}) is not built "
                           f"(ROLLOUT_BENCH_TARGETS_DIR={os.environ.get('ROLLOUT_BENCH_TARGETS_DIR', '')!r})")
    return {"node": ray.get_runtime_context().get_node_id(), "host": os.uname().nodename,
            "version": bench.__version__, "bench": str(Path(bench.__file__).parent), "python": sys.executable,
            "missing": missing}


def check_nodes(targets: list[str], run_args: list[str]) -> list[NodeInfo]:
    """Probe every alive node with CPUs; raise naming each node that cannot run this sweep's runs."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0]
    if not nodes:
        raise SweepError("--ray: the cluster has no alive node with a CPU")
    probe = ray.remote(_probe)
    refs = [probe.options(num_cpus=0, max_retries=0,
                          scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
            .remote(targets, run_args) for node in nodes]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    found, problems = [], []
    for node, ref in zip(nodes, refs):
        where = f"node {node['NodeID'][:8]} ({node.get('NodeManagerHostname')}, {node.get('NodeManagerAddress')})"
        if ref not in ready:
            problems.append(f"{where}: did not answer the bench check in {PROBE_TIMEOUT_S:g} s")
            continue
        try:
            answer = ray.get(ref)
        except Exception as error:  # noqa: BLE001 - whatever stops the bench importing there is the message
            last = str(error).strip().splitlines()[-1:] or [type(error).__name__]
            problems.append(f"{where}: cannot import the bench ({last[0]}); install rollout-bench[ray] there")
            continue
        if answer["version"] != __version__:
            problems.append(f"{where}: rollout-bench {answer['version']} at {answer['bench']}, the driver runs "
                            f"{__version__}: install the same version on every node")
        problems += [f"{where}: {what}" for what in answer["missing"]]
        found.append(NodeInfo(answer["node"], answer["host"], node.get("NodeManagerAddress", ""),
                              node["Resources"]["CPU"], answer["version"], answer["bench"], answer["python"]))
    if problems:
        raise SweepError("--ray: not every node can run this sweep (README \"Sweeps\" says how nodes get the bench):"
                         "\n  " + "\n  ".join(problems))
    return found


def _check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast on a HOST:PORT where nothing listens: `ray.init` would retry for many minutes, silently."""
    host, colon, port = address.rpartition(":")
    if not colon or "://" in address or not port.isdigit():
        return  # "auto", or a ray:// client address: Ray resolves those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise SweepError(f"--ray {address}: nothing answers there ({error}); give the head node's GCS address, "
                         "as `ray start --head` printed it") from None


def _run_on_node(point: GridPoint, options: Any) -> Iterator[Any]:
    """The Ray task of one grid point: where it started, then its rows and report folder (a .tar.gz)."""
    from .sweeper import _Processes, run_point

    ray = _ray()
    yield {"node": ray.get_runtime_context().get_node_id(), "host": os.uname().nodename}
    with tempfile.TemporaryDirectory(prefix="rollout-bench-sweep-") as scratch:
        processes = _Processes()
        try:
            row, faults = run_point(point, Path(scratch), options, processes, say=lambda line: None)
        finally:
            kill_marked(SWEEP_MARKER, processes.marker)  # anything the run left behind on this node
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w:gz") as tar:
            tar.add(Path(scratch) / "runs" / point.id, arcname=".")
    yield row, faults, packed.getvalue()


def _unpack(data: bytes, folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")  # nothing outside the folder, no devices or links out


class RayExecutor:
    """Runs each grid point as a Ray task (num_cpus=1), `options.jobs` in flight, retrying lost nodes' runs."""

    name = "ray"

    def __init__(self, address: str, nodes: list[NodeInfo], max_attempts: int = MAX_ATTEMPTS) -> None:
        self.address, self.nodes, self.max_attempts = address, nodes, max_attempts
        self.cpus = max(1, int(sum(node.cpus for node in nodes)))
        self._lock = threading.Lock()
        self._live: set[Any] = set()
        self._stopping = False
        # one remote function for the whole sweep: Ray exports its code to the cluster once, not per run
        self._remote = _ray().remote(_run_on_node).options(num_cpus=1, max_retries=0)

    @classmethod
    def connect(cls, address: str, targets: list[str], options: Any) -> "RayExecutor":
        """Join the cluster at `address` ("auto": RAY_ADDRESS or the local one) and check its nodes."""
        ray = _ray()
        _check_reachable(address)
        on_sigterm = signal.getsignal(signal.SIGTERM)
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise SweepError(f"--ray {address}: cannot join the cluster: {error}") from None
        finally:
            # Ray's driver installs its own SIGTERM handler (a stack dump, then exit): the sweep's stops it cleanly
            if on_sigterm is not None:
                signal.signal(signal.SIGTERM, on_sigterm)
        nodes = check_nodes(targets, list(options.run_args))
        for node in nodes:
            print(f"sweep: ray node {node.short} ({node.host}, {node.address}): {node.cpus:g} CPUs, rollout-bench "
                  f"{node.version} at {node.bench}", file=sys.stderr)
        return cls(address, nodes)

    def describe(self) -> dict[str, Any]:
        return {"executor": self.name, "ray": {
            "address": self.address, "max_attempts": self.max_attempts,
            "nodes": {node.short: {"id": node.id, "host": node.host, "address": node.address, "cpus": node.cpus,
                                   "bench": node.bench, "python": node.python} for node in self.nodes}}}

    def run(self, points: list[GridPoint], out: Path, options: Any, finish: Callable[[GridPoint, Any], None],
            say: Callable[[str], None]) -> None:
        pool = ThreadPoolExecutor(max_workers=options.jobs, thread_name_prefix="sweep-ray")
        pending: dict[Future[Any], GridPoint] = {}
        try:
            for point in points:
                pending[pool.submit(self._run_point, point, out, options, say)] = point
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    finish(pending.pop(future), future.result())
        except BaseException:
            self._stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()

    def _stop(self) -> None:
        """Cancel every task in flight (force: its worker is killed, and its run with it, through the lifeline)."""
        ray = _ray()
        with self._lock:
            self._stopping = True
            live = list(self._live)
        for task in live:
            try:
                ray.cancel(task, force=True)
            except Exception:  # noqa: BLE001 - already finished or gone
                pass

    def _run_point(self, point: GridPoint, out: Path, options: Any,
                   say: Callable[[str], None]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        ray = _ray()
        nodes: list[str] = []
        failures: list[str] = []
        clock = time.monotonic()
        for attempt in range(1, self.max_attempts + 1):
            with self._lock:
                if self._stopping:
                    raise KeyboardInterrupt
                task = self._remote.remote(point, options)
                self._live.add(task)
            try:
                started = ray.get(next(task))
                nodes.append(started["node"][:8])
                say(f"sweep: run {point.id}: attempt {attempt} on node {started['node'][:8]} ({started['host']})")
                row, faults, packed = ray.get(next(task))
            except ray.exceptions.RayTaskError as error:  # the task's own code failed: a bug, not a lost node
                return self._failed_row(point, options, "crashed", f"the Ray task failed: {error}", nodes, attempt,
                                        out, time.monotonic() - clock), []
            except (ray.exceptions.RayError, StopIteration) as error:
                if self._stopping:  # cancelled by `_stop`: the sweep is ending, not the node
                    raise KeyboardInterrupt from None
                where = f"node {nodes[-1]}" if len(nodes) == attempt else "before it started"
                failures.append(f"attempt {attempt} ({where}): {type(error).__name__}")
                say(f"sweep: run {point.id}: attempt {attempt} lost ({where}: {type(error).__name__})"
                    + ("; trying again" if attempt < self.max_attempts else ""))
                continue
            finally:
                with self._lock:
                    self._live.discard(task)
            _unpack(packed, out / "runs" / point.id)
            row.update(attempts=attempt, nodes=";".join(nodes))
            return row, faults
        return self._failed_row(point, options, "lost", "; ".join(failures), nodes, self.max_attempts, out,
                                time.monotonic() - clock), []

    @staticmethod
    def _failed_row(point: GridPoint, options: Any, outcome: str, error: str, nodes: list[str], attempts: int,
                    out: Path, wall_s: float) -> dict[str, Any]:
        """The row of a run with no report: which attempts were made where, and why none finished."""
        (out / "runs" / point.id).mkdir(parents=True, exist_ok=True)
        row: dict[str, Any] = dict.fromkeys(COLUMNS)
        row.update(run=point.id, plan=point.plan_name, target=point.target, rate=float(point.rate), seed=point.seed,
                   n=options.n, trace=options.trace, outcome=outcome, error=error, wall_s=round(wall_s, 3), attempts=attempts,
                   nodes=";".join(nodes), report=f"runs/{point.id}")
        return row
