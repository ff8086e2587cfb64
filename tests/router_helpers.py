"""The real sglang-router (PyPI) as a subprocess in front of bench servers, for tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.server_helpers import request


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(router: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if router.poll() is not None:
            pytest.fail(f"sglang-router exited with {router.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if request(url, "/readiness", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"sglang-router not ready after 60 s:\n{log.read_text()[-2000:]}")


def require_router() -> None:
    try:
        import sglang_router
    except ImportError:
        pytest.skip("sglang-router has no wheel for this platform: the real-router test did not run")
    assert sglang_router.__version__ == "0.3.2"


@contextlib.contextmanager
def real_router(worker_urls: list[str], folder: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """A router on a free port routing to `worker_urls` (round robin); killed, by its PID, on the way out."""
    require_router()
    port, metrics = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / "router.log"
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
               "--worker-urls", *worker_urls, "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(metrics), "--log-level", "warn", *extra]
    with open(log, "wb") as sink:
        router = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_ready(router, url, log)
        yield url, router
    finally:
        router.kill()
        router.wait(timeout=10)
