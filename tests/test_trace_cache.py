"""The cache of loaded traces (`bench.replay.cache`): never stale, never trusted when damaged, bounded, optional."""

from __future__ import annotations

import gzip
import os
import shutil
import time
import warnings
from pathlib import Path

import pytest

from bench.replay import cache as trace_cache
from bench.replay.cache import CACHE_ENV, LIMIT_ENV, TraceCache, TraceCacheWarning, default_cache
from bench.replay.store import TraceStore
from bench.trace import TraceFormatError
from bench.trace.shipped import resolve_trace

from tests.conftest import read_lines, write_lines

AN_HOUR_AGO = time.time() - 3600


def settled(path: Path, when: float = AN_HOUR_AGO) -> Path:
    """Dated in the past: a file modified in the last seconds is loaded, never cached (`RACY_S`)."""
    os.utime(path, (when, when))
    return path


def same_store(a: TraceStore, b: TraceStore) -> bool:
    return (a.header == b.header and a.trajectories == b.trajectories and list(a.by_id) == list(b.by_id)
            and list(a.groups) == list(b.groups)
            and all(a.groups[g].prompt == b.groups[g].prompt
                    and [m.id for m in a.groups[g].members] == [m.id for m in b.groups[g].members] for g in a.groups))


@pytest.fixture
def cache(tmp_path: Path) -> TraceCache:
    return TraceCache(tmp_path / "cache", 2**30)


@pytest.fixture
def trace(tmp_path: Path, small_agentic: Path) -> Path:
    return settled(Path(shutil.copy(small_agentic, tmp_path / "agentic.jsonl")))


def entries(cache: TraceCache) -> list[Path]:
    return sorted(cache.folder.glob("*.store")) if cache.folder.exists() else []


def test_a_cached_load_is_the_load_it_kept(cache: TraceCache) -> None:
    shipped = resolve_trace("agentic-500")
    cold = TraceStore.load(shipped, cache=None)
    first = TraceStore.load(shipped, cache=cache)
    assert len(entries(cache)) == 1
    served_from_disk = trace_cache.read(cache, shipped, trace_cache.file_key(shipped))
    assert served_from_disk is not None
    assert same_store(cold, first) and same_store(cold, served_from_disk)
    assert same_store(cold, TraceStore.load(shipped, cache=cache))
    assert served_from_disk.path == cold.path


def test_an_edited_trace_is_loaded_again_not_served_from_the_cache(trace: Path, cache: TraceCache) -> None:
    before = TraceStore.load(trace, cache=cache)
    assert entries(cache)
    records = read_lines(trace)
    records[1]["turns"][0]["response"]["text"] = "edited"
    write_lines(trace, records)
    after = TraceStore.load(trace, cache=cache)  # a fresh edit: loaded, and not cached while racy
    assert after.trajectories[0].turns[0].text == "edited" != before.trajectories[0].turns[0].text
    settled(trace)
    assert TraceStore.load(trace, cache=cache).trajectories[0].turns[0].text == "edited"
    assert len(entries(cache)) == 1  # the new version replaced the old one


def test_an_edit_in_place_that_keeps_size_and_mtime_still_misses(trace: Path, cache: TraceCache) -> None:
    """An edit that keeps the size, the inode and (restored) the mtime still changes the ctime."""
    before = TraceStore.load(trace, cache=cache)
    data = bytearray(trace.read_bytes())
    at = data.index(b'"ttft":') + len(b'"ttft":')
    while chr(data[at]) in "0123456789.eE-+":
        at += 1
    while data[at - 1] == ord("0") or data[at - 1] == ord("."):  # the last digit that can go down keeps ttft <= total
        at = data.index(b'"ttft":', at) + len(b'"ttft":')
        while chr(data[at]) in "0123456789.eE-+":
            at += 1
    data[at - 1] -= 1
    time.sleep(0.01)
    with trace.open("r+b") as handle:  # in place: same inode, same size
        handle.write(bytes(data))
    settled(trace)  # the old mtime back
    after = TraceStore.load(trace, cache=cache)
    assert same_store(after, TraceStore.load(trace, cache=None))
    assert not same_store(after, before)


def test_a_damaged_entry_is_ignored_named_and_rewritten(trace: Path, cache: TraceCache) -> None:
    expected = TraceStore.load(trace, cache=cache)
    [entry] = entries(cache)
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF  # a flipped bit in the payload: only the checksum can tell
    entry.write_bytes(bytes(data))
    with pytest.warns(TraceCacheWarning, match=str(entry)):
        again = TraceStore.load(trace, cache=cache)
    assert same_store(again, expected)
    assert entry.read_bytes() != bytes(data)  # rewritten
    assert trace_cache.read(cache, trace, trace_cache.file_key(trace)) is not None

    entry.write_bytes(b"not an entry")
    with pytest.warns(TraceCacheWarning, match="damaged"):
        assert same_store(TraceStore.load(trace, cache=cache), expected)


def test_an_entry_cut_inside_its_header_is_damaged_not_trusted(trace: Path, cache: TraceCache) -> None:
    expected = TraceStore.load(trace, cache=cache)
    [entry] = entries(cache)
    entry.write_bytes(entry.read_bytes()[: len(trace_cache.MAGIC) + 10])  # the header's length, then the end
    with pytest.warns(TraceCacheWarning, match="ends inside its header"):
        assert same_store(TraceStore.load(trace, cache=cache), expected)


def test_a_trace_the_entry_cannot_encode_still_loads_and_is_not_kept(tmp_path: Path, small_agentic: Path,
                                                                     cache: TraceCache) -> None:
    """JSON allows integers past 64 bits (a sampling seed); the entry's encoding does not: the run must not fail."""
    rows = read_lines(small_agentic)
    trajectory = next(row for row in rows if row.get("turns"))
    trajectory["turns"][0]["request"]["sampling_params"]["seed"] = 2**65
    big = settled(write_lines(tmp_path / "big.jsonl", rows))
    with pytest.warns(TraceCacheWarning, match="cannot be kept"):
        store = TraceStore.load(big, cache=cache)
    assert store.by_id[trajectory["id"]].first_sampling_params["seed"] == 2**65
    assert not entries(cache)


def test_a_corrupt_trace_fails_naming_its_line_every_time(tmp_path: Path, small_agentic: Path,
                                                          cache: TraceCache) -> None:
    lines = small_agentic.read_text(encoding="utf-8").splitlines(keepends=True)
    broken = settled(write_lines(tmp_path / "broken.jsonl", [*(line.rstrip("\n") for line in lines[:4]), "{oops"]))
    for _ in range(2):
        with pytest.raises(TraceFormatError, match=r"broken\.jsonl:5: "):
            TraceStore.load(broken, cache=cache)
    assert not entries(cache)


def test_a_truncated_gzip_trace_is_never_cached(tmp_path: Path, small_agentic: Path, cache: TraceCache) -> None:
    data = gzip.compress(small_agentic.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    settled(cut)
    for _ in range(2):
        with pytest.raises(TraceFormatError, match="gzip stream is corrupt or truncated"):
            TraceStore.load(cut, cache=cache)
    assert not entries(cache)


def test_the_loader_is_part_of_the_key(trace: Path, cache: TraceCache, monkeypatch: pytest.MonkeyPatch) -> None:
    TraceStore.load(trace, cache=cache)
    key = trace_cache.file_key(trace)
    assert trace_cache.read(cache, trace, key) is not None
    monkeypatch.setattr(trace_cache, "loader_version", lambda: "another loader")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # another loader's entry is a plain miss, not damage
        assert trace_cache.read(cache, trace, trace_cache.file_key(trace)) is None
        TraceStore.load(trace, cache=cache)
    assert trace_cache.read(cache, trace, trace_cache.file_key(trace)) is not None  # rewritten for this loader


def test_a_repro_load_reads_its_groups_from_a_cached_trace(trace: Path, cache: TraceCache) -> None:
    full = TraceStore.load(trace, cache=cache)
    wanted = [full.trajectories[-1].id]
    cut = TraceStore.load(trace, groups_of=wanted, cache=cache)
    assert same_store(cut, TraceStore.load(trace, groups_of=wanted, cache=None))
    assert len(cut.trajectories) < len(full.trajectories)
    with pytest.raises(KeyError, match="no trajectory nope"):
        TraceStore.load(trace, groups_of=["nope"], cache=cache)


def test_the_cache_is_bounded_least_recently_used_first(tmp_path: Path, small_agentic: Path,
                                                       small_rlvr: Path) -> None:
    one = settled(Path(shutil.copy(small_agentic, tmp_path / "one.jsonl")))
    two = settled(Path(shutil.copy(small_rlvr, tmp_path / "two.jsonl")))
    roomy = TraceCache(tmp_path / "cache", 2**30)
    TraceStore.load(one, cache=roomy)
    [first] = entries(roomy)
    bound = TraceCache(roomy.folder, first.stat().st_size + 1)  # room for one entry of this size, not two
    old = time.time() - 60
    os.utime(first, (old, old))
    TraceStore.load(two, cache=bound)
    assert [e.name for e in entries(bound)] == [bound.entry(two.resolve()).name]
    writing = bound.folder / f"{trace_cache.WRITING}other{trace_cache.SUFFIX}"  # another process's write, going on
    writing.write_bytes(b"x" * 1000)
    abandoned = bound.folder / f"{trace_cache.WRITING}dead{trace_cache.SUFFIX}"  # a dead process's, hours old
    abandoned.write_bytes(b"x")
    os.utime(abandoned, (AN_HOUR_AGO - 60, AN_HOUR_AGO - 60))
    trace_cache.trim(TraceCache(bound.folder, 0))
    assert writing.exists() and not abandoned.exists()
    tiny = TraceCache(tmp_path / "tiny", 100)  # an entry bigger than the whole cache is not written
    TraceStore.load(one, cache=tiny)
    assert not entries(tiny)


def test_the_environment_turns_it_off_or_moves_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, "off")
    assert default_cache() is None
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    monkeypatch.setenv(LIMIT_ENV, "5")
    assert default_cache() == TraceCache(tmp_path / "here", 5 * 2**20)
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.delenv(LIMIT_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache() == TraceCache(tmp_path / "xdg" / "rollout-bench" / "traces", 1024 * 2**20)
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(ValueError, match=LIMIT_ENV):
        default_cache()


def test_the_default_load_uses_the_environments_cache(trace: Path, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env-cache"))
    TraceStore.load(trace)
    assert list((tmp_path / "env-cache").glob("*.store"))
    monkeypatch.setenv(CACHE_ENV, "off")
    other = settled(Path(shutil.copy(trace, tmp_path / "other.jsonl")))
    TraceStore.load(other)
    assert len(list((tmp_path / "env-cache").glob("*.store"))) == 1
