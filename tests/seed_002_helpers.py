"""What seed-002 tests ask of a run, for the reference replay buffer and for real verl alike."""

from __future__ import annotations

from collections import defaultdict

from bench import RunResult

SEED_002_FAULTS = {"http_error", "connection_reset"}


def faulted_groups(result: RunResult) -> dict[str, set[str]]:
    """group -> trajectories a plan fault hit."""
    out: dict[str, set[str]] = defaultdict(set)
    for event in result.fault_events:
        assert event.group is not None
        out[event.group].add(event.trajectory)
    return dict(out)


def assert_partial_groups_named(result: RunResult, members: int = 4) -> set[str]:
    """Every faulted group is reported partial, missing exactly the faulted members; returns those members."""
    faulted = faulted_groups(result)
    partial = [v for v in result.violations if v.invariant == "group_completeness"]
    assert {v.evidence["group"] for v in partial} == set(faulted)
    for violation in partial:
        group, missing = violation.evidence["group"], set(violation.evidence["missing"])
        assert missing == faulted[group]
        assert len(violation.evidence["kept"]) == members - len(missing)
        assert violation.fault is not None and violation.fault["fault"] in SEED_002_FAULTS
        assert violation.fault["group"] == group and violation.fault["trajectory"] in missing
        assert set(violation.evidence["missing_faults"]) == missing
        assert violation.trajectory == violation.fault["trajectory"]
    return {t for members_hit in faulted.values() for t in members_hit}
