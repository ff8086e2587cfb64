"""AReaL over steps when step 0's weight sync failed (`--on-step-failure continue`): AReaL's trainer makes its
engine once, before step 0, so a later step is refused naming step 0's failure rather than building an engine from
its own slice (no AReaL needed: the refusal comes before any of its code runs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.targets.frameworks.areal.target import ArealTarget


def test_a_later_step_after_step_0_s_sync_failed_names_that_failure() -> None:
    target = ArealTarget()
    target.start_error = "ConnectionError: /health answered 503"  # what `_sync` keeps when step 0's start raised
    with pytest.raises(RuntimeError, match=r"areal step 2: .*step 0's weight sync failed \(ConnectionError: /health"):
        target._sync(SimpleNamespace(step=2))  # type: ignore[arg-type]
    assert target.session is None  # no engine was made from step 2's job
