"""The served-token store: which request each one continued, and what it costs to keep."""

from __future__ import annotations

import math
import tracemalloc

from bench.records.request_log import RequestLog, RequestRecord
from bench.records.served_tokens import EARLIER, PREFIX, ROOT, ServedTokens, token_digest
from bench.replay import pack


class Client:
    """Sends requests for one trajectory the way rollout code does, into one store."""

    def __init__(self, store: ServedTokens | None = None) -> None:
        self.store = store if store is not None else ServedTokens()
        self.log = RequestLog()

    def send(self, prompt: list[int], reply: list[int] | None, turn: int = 0, trajectory: str = "t",
             logprobs: list[float | None] | None = None) -> RequestRecord:
        """`reply` None: identified, never played (refused, or still in flight)."""
        record = RequestRecord(0.0, "/generate", trajectory=trajectory, group="g", turn=turn, attempt=1)
        self.log.append(record)
        self.store.begin(record, pack(prompt))
        if reply is not None:
            self.store.finish(record, prompt, reply, logprobs if logprobs is not None else [-0.5] * len(reply), "v")
        return record

    def link(self, record: RequestRecord) -> tuple[int | None, str]:
        entry = self.store.entry_of(record)
        assert entry is not None
        parent = None if entry.parent is None else self.store.entries[entry.parent].record.seq
        return parent, entry.link


def test_a_multi_turn_loop_links_each_turn_to_the_one_before() -> None:
    client = Client()
    first = client.send([1, 2], [5, 6])
    second = client.send([1, 2, 5, 6, 9, 9], [7], turn=1)
    third = client.send([1, 2, 5, 6, 9, 9, 7, 9], [8], turn=2)
    assert client.link(first) == (None, ROOT)
    assert client.link(second) == (first.seq, PREFIX) and client.link(third) == (second.seq, PREFIX)
    chain = client.store.chain(client.store.entry_of(third))
    assert [list(client.store.tokens(e)) for e in chain] == [[5, 6], [7], [8]]
    assert third.continues == second.seq and third.served_tokens == 1 and third.served_digest == token_digest([8])


def test_a_retry_of_the_same_turn_continues_what_the_failed_attempt_continued() -> None:
    client = Client()
    first = client.send([1, 2], [5, 6])
    refused = client.send([1, 2, 5, 6, 9], None, turn=1)  # a 503: never played
    retry = client.send([1, 2, 5, 6, 9], [7], turn=1)
    again = client.send([1, 2, 5, 6, 9], [7], turn=1)  # a second try at the same turn after a played one
    assert client.link(refused) == client.link(retry) == client.link(again) == (first.seq, PREFIX)
    assert refused.served_tokens == 0 and retry.served_tokens == 1


def test_a_partial_rollout_resumes_the_aborted_request() -> None:
    client = Client()
    aborted = client.send([1, 2], [5, 6])  # aborted after two tokens
    resumed = client.send([1, 2, 5, 6], [7, 8])
    assert client.link(resumed) == (aborted.seq, PREFIX)
    assert [t for e in client.store.chain(client.store.entry_of(resumed)) for t in client.store.tokens(e)] == \
        [5, 6, 7, 8]


def test_a_restart_from_turn_zero_starts_a_new_chain() -> None:
    client = Client()
    client.send([1, 2], [5, 6])
    client.send([1, 2, 5, 6, 9], [7], turn=1)
    restart = client.send([1, 2], [5, 6])
    second = client.send([1, 2, 5, 6, 9], [7], turn=1)
    assert client.link(restart) == (None, ROOT) and client.link(second) == (restart.seq, PREFIX)


def test_a_context_the_client_altered_goes_on_from_its_latest_shorter_request() -> None:
    """A reply re-tokenized without its last token, then a tool message: no served context is a prefix of
    the next prompt but the first turn's; the loop's previous step is still the one it went on from."""
    client = Client()
    first = client.send([1, 2], [5, 6])
    second = client.send([1, 2, 5, 6, 9], [7, 0], turn=1)
    third = client.send([1, 2, 5, 6, 9, 7, 9], [8], turn=2)  # the 0 that ended turn 1 was dropped
    assert client.link(third) == (second.seq, EARLIER)
    assert client.link(second) == (first.seq, PREFIX)


def test_a_request_still_in_flight_is_never_continued() -> None:
    client = Client()
    pending = client.send([1, 2], None)
    other = client.send([1, 2, 3], [4])
    assert client.link(other) == (None, ROOT) and client.link(pending) == (None, ROOT)


def test_trajectories_do_not_mix_and_unidentified_requests_are_not_kept() -> None:
    store = ServedTokens()
    a, b = Client(store), Client(store)
    a.send([1, 2], [5])
    second = b.send([1, 2, 5, 9], [6], trajectory="u")
    assert b.link(second) == (None, ROOT)
    loose = RequestRecord(0.0, "/generate")
    store.finish(loose, [1], [2], None, None)  # never begun: not identified
    assert len(store) == 2 and loose.served_tokens is None


def test_logprobs_the_answer_did_not_show_are_nan() -> None:
    client = Client()
    client.send([1], [5, 6, 7], logprobs=[-0.1, None])  # a null one, and one entry short
    shown = list(client.store.logprobs_of(client.store.entries[0]))
    assert shown[0] == -0.1 and math.isnan(shown[1]) and math.isnan(shown[2])
    record = RequestRecord(0.0, "/generate", trajectory="t", turn=1)
    client.store.begin(record, pack([1, 5, 6, 7, 9]))
    client.store.finish(record, [1, 5, 6, 7, 9], [8], None, None)  # no logprobs at all
    assert record.logprobs_served is False and math.isnan(client.store.logprobs[-1])


def test_keeping_a_long_runs_tokens_costs_about_the_tokens_themselves() -> None:
    """500 trajectories x 20 turns x 200 tokens: the store's memory stays within 1.5x the served data (token
    ids and logprobs, 12 bytes a token), per-request bookkeeping included; no list per request survives."""
    store = ServedTokens()
    records = [RequestRecord(0.0, "/generate", trajectory=f"t{i // 20}", group="g", turn=i % 20, attempt=1)
               for i in range(10_000)]
    reply = list(range(200))
    logprobs = [-0.25] * 200
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i, record in enumerate(records):
        prompt = [7] * (i % 20)  # short prompts: the prompt is hashed, never kept
        store.begin(record, pack(prompt))
        store.finish(record, prompt, reply, logprobs, "v")
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    data = store.nbytes()
    assert data == 10_000 * 200 * 12
    assert grown < 1.5 * data, f"{grown / 1e6:.1f} MB kept for {data / 1e6:.1f} MB of served data"
