"""The target's output (its prints, its framework's logs, its children's), kept once and capped.

A worker's stdout and stderr go into a pipe the harness reads on a thread, not straight into a file:
a target that prints without end must not fill the disk, and a run killed outright must not leave a
log behind in the temp folder. The first `HEAD_BYTES` and the last `TAIL_BYTES` are kept (the start-up
and the end, where the crash is), with a line saying how much was left out between them; the report
writes them as `worker.log`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

HEAD_BYTES = 1 << 20
TAIL_BYTES = 1 << 20


class CappedLog:
    """Bytes fed in order; keeps the head and the tail."""

    def __init__(self, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> None:
        self._head_limit, self._tail_limit = head, tail
        self._head = bytearray()
        self._tail = bytearray()
        self._dropped = 0
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self._lock:
            room = self._head_limit - len(self._head)
            if room > 0:
                self._head += data[:room]
                data = data[room:]
            if not data:
                return
            self._tail += data
            excess = len(self._tail) - self._tail_limit
            if excess > 0:
                self._dropped += excess
                del self._tail[:excess]

    @property
    def dropped(self) -> int:
        """Bytes left out between the head and the tail."""
        return self._dropped

    def value(self) -> bytes:
        with self._lock:
            if not self._dropped:
                return bytes(self._head + self._tail)
            note = (f"\n[rollout-bench: {self._dropped} bytes of the target's output left out here; "
                    f"worker.log keeps the first {self._head_limit} and the last {self._tail_limit}]\n").encode()
            return bytes(self._head) + note + bytes(self._tail)

    def text(self) -> str:
        return self.value().decode("utf-8", "replace")

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.value())


class LogPipe:
    """A pipe whose write end a worker gets as its stdout/stderr; a daemon thread feeds a `CappedLog`."""

    def __init__(self, log: CappedLog) -> None:
        self.log = log
        self._read, self.write_fd = os.pipe()
        self._thread = threading.Thread(target=self._drain, name="rollout-bench worker log", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while chunk := os.read(self._read, 1 << 16):
                self.log.feed(chunk)
        except OSError:
            pass
        finally:
            os.close(self._read)

    def close_write_end(self) -> None:
        """Once the worker has its copy: then end of file comes when the worker and its children are gone."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def wait(self, timeout_s: float) -> bool:
        """Wait for end of file (False if something still holds the write end after `timeout_s`)."""
        self.close_write_end()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
