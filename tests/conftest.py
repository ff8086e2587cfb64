"""Shared fixtures: small valid traces to break in specific ways; rlvr-500 servers per OpenAI flavor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.server import ServerThread
from bench.synth import synthesize


@pytest.fixture(scope="session", autouse=True)
def private_trace_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Loaded traces are cached in a folder of this session's (this process's and the CLIs it starts), never the
    user's: a test sees only what the suite itself cached."""
    import os

    from bench.replay.cache import CACHE_ENV

    folder = tmp_path_factory.mktemp("trace-cache")
    before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = before


@pytest.fixture
def import_state() -> Iterator[None]:
    """A framework warm-up changes the import system (a checkout on sys.path, a placeholder finder): undone after."""
    import sys

    path, finders, modules = list(sys.path), list(sys.meta_path), set(sys.modules)
    yield
    sys.path[:], sys.meta_path[:] = path, finders
    for name in set(sys.modules) - modules:
        del sys.modules[name]


@pytest.fixture(scope="session")
def small_agentic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8-trajectory agentic trace, uncompressed so tests can edit lines."""
    return synthesize("agentic", 8, 7, tmp_path_factory.mktemp("traces") / "agentic-8.jsonl")


@pytest.fixture(scope="session")
def small_rlvr(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize("rlvr", 8, 7, tmp_path_factory.mktemp("traces") / "rlvr-8.jsonl")


@pytest.fixture(scope="module")
def vllm() -> Iterator[ServerThread]:
    """rlvr-500 served with the vLLM flavor of the OpenAI routes (fresh logs per test module)."""
    with ServerThread("rlvr-500") as thread:
        yield thread


@pytest.fixture(scope="module")
def sglang() -> Iterator[ServerThread]:
    """rlvr-500 served with SGLang's flavor of the OpenAI routes."""
    with ServerThread("rlvr-500", openai_flavor="sglang") as thread:
        yield thread


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_lines(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path
