"""The `record` command: probe the upstream, serve the recording proxy, show progress, end cleanly."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from aiohttp import web

from bench import __version__

from .recorder import Recorder, recording_header
from .journal import COMPACT_EVERY_S
from .upstream import UpstreamError, probe, split_credentials, tokenizer_for

PROGRESS_EVERY_S = 10.0


class RecordingProxy:
    """The recorder on 127.0.0.1 (or `host`): `url = await proxy.start()`, then `path = await proxy.stop()`."""

    def __init__(self, upstream: str, out: str | Path, *, host: str = "127.0.0.1", port: int = 0,
                 redact_text: bool = False, force: bool = False, tokenizer_dir: str | None = None,
                 context_length: int | None = None) -> None:
        self.upstream, self.out, self.host, self.port = upstream, Path(out), host, port
        self._options = dict(redact_text=redact_text, force=force)
        self._tokenizer_dir, self._context_length = tokenizer_dir, context_length
        self.recorder: Recorder | None = None
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._compactor: asyncio.Task[None] | None = None

    async def start(self) -> str:
        info = await probe(self.upstream)
        tokenizer, record, source = tokenizer_for(info, self._tokenizer_dir)
        shown, _ = split_credentials(self.upstream)
        header = recording_header(info, record, source, shown, self._context_length, __version__)
        self.recorder = Recorder(self.upstream, self.out, info, header, tokenizer, **self._options)
        self._runner = web.AppRunner(self.recorder.app(), access_log=None, shutdown_timeout=5.0)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as error:
            await self._runner.cleanup()
            self._runner = None
            self.recorder.journal.discard()  # nothing was recorded: leave no file behind
            raise UpstreamError(f"cannot listen on {self.host}:{self.port} ({error.strerror or error}); "
                                "pick another --port") from None
        self._compactor = asyncio.create_task(self._compact_while_idle())
        self.port = self._runner.addresses[0][1]
        self.url = f"http://{self.host}:{self.port}"
        return self.url

    async def _compact_while_idle(self) -> None:
        """Traffic triggers compaction; this catches fragments left when traffic stops."""
        assert self.recorder is not None
        while True:
            await asyncio.sleep(COMPACT_EVERY_S)
            try:
                self.recorder.compact_if_due()
            except OSError as error:  # e.g. a full disk: the fragments stay (valid), the next try may succeed
                print(f"rollout-bench record: joining the recording failed ({error}); its fragments stay valid",
                      file=sys.stderr, flush=True)

    async def stop(self) -> Path:
        """Stop serving (in-flight exchanges get `shutdown_timeout` to finish), then write the whole trace."""
        if self._compactor is not None:
            self._compactor.cancel()
            self._compactor = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        assert self.recorder is not None
        return self.recorder.close()


async def record(upstream: str, out: str | Path, *, host: str = "127.0.0.1", port: int = 30001,
                 redact_text: bool = False, force: bool = False, tokenizer_dir: str | None = None,
                 context_length: int | None = None) -> Path:
    """Record until SIGINT or SIGTERM; returns the finished trace's path."""
    proxy = RecordingProxy(upstream, out, host=host, port=port, redact_text=redact_text, force=force,
                           tokenizer_dir=tokenizer_dir, context_length=context_length)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    url = await proxy.start()
    recorder = proxy.recorder
    assert recorder is not None
    print(f"recording {split_credentials(upstream)[0]} ({recorder.info.server}, model {recorder.info.model}) on {url} into {out}; "
          "Ctrl-C ends the recording", file=sys.stderr, flush=True)
    shown = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), PROGRESS_EVERY_S)
        except asyncio.TimeoutError:
            pass
        if recorder.stats.exchanges != shown:
            shown = recorder.stats.exchanges
            print(f"  {shown} exchanges recorded ({recorder.stats.errors} errors)", file=sys.stderr, flush=True)
    path = await proxy.stop()
    trajectories = len(recorder.recording.trajectories())
    unreadable = recorder.stats.unreadable
    print(f"recorded {recorder.stats.exchanges} exchanges in {trajectories} trajectories -> {path}"
          + (f"; {unreadable} requests not readable (forwarded, not recorded)" if unreadable else ""),
          file=sys.stderr, flush=True)
    return path
