"""Known findings: violations a team has triaged (an upstream bug, reported, not theirs to fix tonight).

A nightly run against real framework code finds the same upstream bug every night; left as is,
the job is red forever and a new regression hides behind it. A known-findings file declares such
findings narrowly, each with its reason:

    [[known]]
    invariant = "context_budget"           # required: the invariant it breaks
    reason = "..."                         # required: one line, printed in every report
    target = "miles*"                      # fnmatch on the target name (default "*")
    recorded_outcome = "context_overflow"  # only trajectories the trace recorded with this outcome
    trajectories = ["g00023-3"]            # only these trajectories
    fault = "missing_logprobs"             # only violations that fault preceded (the violation's `fault`)
    link = "..."                           # an issue or PR

A violation matching an entry is *known*: still in `summary.json`, the terminal summary and the JUnit
XML (as skipped), but not a failure, and not what `repro.toml` reproduces. Everything else fails
as before. A violation of the whole run (no trajectory) only matches an entry naming no
trajectories and no recorded outcome. `rollout-bench run --known NAME|PATH`: a shipped file by name
(`bench/targets/frameworks/<name>/known_findings.toml`), or a path.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from bench.invariants import INVARIANTS, Violation
from bench.targets.frameworks import FRAMEWORKS_DIR, KNOWN_FINDINGS
from faults.base import FaultError, fault_class

_KEYS = {"invariant", "reason", "target", "recorded_outcome", "trajectories", "fault", "link"}


class KnownFindingsError(ValueError):
    """A known-findings file that cannot be used as written."""


@dataclass(frozen=True)
class KnownFinding:
    invariant: str
    reason: str
    source: str  # FILE:entry N, for the report
    target: str = "*"
    recorded_outcome: str | None = None
    trajectories: tuple[str, ...] | None = None
    link: str | None = None
    fault: str | None = None  # the fault type the violation names as having preceded it

    def matches(self, violation: Violation, target: str, recorded_outcomes: dict[str, str | None]) -> bool:
        if violation.invariant != self.invariant or not fnmatchcase(target, self.target):
            return False
        if self.fault is not None and (violation.fault or {}).get("fault") != self.fault:
            return False
        if violation.trajectory is None:
            return self.recorded_outcome is None and self.trajectories is None
        if self.trajectories is not None and violation.trajectory not in self.trajectories:
            return False
        return self.recorded_outcome is None or recorded_outcomes.get(violation.trajectory) == self.recorded_outcome


@dataclass(frozen=True)
class KnownViolation:
    violation: Violation
    finding: KnownFinding

    def to_dict(self) -> dict[str, Any]:
        return {**self.violation.to_dict(), "reason": self.finding.reason, "link": self.finding.link,
                "known_by": self.finding.source}


def shipped_known() -> dict[str, Path]:
    """The known findings shipped beside each framework's adapter, by framework name."""
    return {path.parent.name: path for path in sorted(FRAMEWORKS_DIR.glob(f"*/{KNOWN_FINDINGS}"))}


def resolve_known(spec: str) -> tuple[Path, list[KnownFinding]]:
    """`--known`: a TOML path, or the name of a shipped file."""
    path = Path(spec)
    if not path.exists():
        shipped = shipped_known()
        if spec not in shipped:
            raise KnownFindingsError(f"known findings {spec!r}: no such file, and not a shipped name "
                                     f"({', '.join(shipped) or 'none'})")
        path = shipped[spec]
    return path, load_known(path)


def load_known(path: str | Path) -> list[KnownFinding]:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise KnownFindingsError(f"{path}: not valid TOML: {error}") from None
    extra = set(data) - {"known"}
    if extra:
        raise KnownFindingsError(f"{path}: unknown top-level key(s) {', '.join(sorted(extra))}; expected [[known]]")
    entries = data.get("known", [])
    if not isinstance(entries, list):
        raise KnownFindingsError(f"{path}: known must be an array of tables ([[known]]), got {type(entries).__name__}")
    if not entries:
        raise KnownFindingsError(f"{path}: no [[known]] entries")
    return [_finding(path, number, entry) for number, entry in enumerate(entries, 1)]


def _finding(path: Path, number: int, entry: Any) -> KnownFinding:
    where = f"{path}: [[known]] entry {number}"
    if not isinstance(entry, dict):
        raise KnownFindingsError(f"{where}: expected a table")
    unknown = set(entry) - _KEYS
    if unknown:
        raise KnownFindingsError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(sorted(_KEYS))}")
    for key in ("invariant", "reason"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            raise KnownFindingsError(f"{where}: {key} is required (a non-empty string)")
    if entry["invariant"] not in INVARIANTS:
        raise KnownFindingsError(f"{where}: invariant {entry['invariant']!r} is not one of "
                                 f"{', '.join(INVARIANTS)}")
    for key in ("target", "recorded_outcome", "link", "fault"):
        if key in entry and not isinstance(entry[key], str):
            raise KnownFindingsError(f"{where}: {key} must be a string, got {entry[key]!r}")
    if "fault" in entry:  # a misspelt fault type would never match: the entry would silently know nothing
        try:
            fault_class(entry["fault"])
        except FaultError as error:
            raise KnownFindingsError(f"{where}: fault: {error}") from None
    trajectories = entry.get("trajectories")
    if trajectories is not None and (not isinstance(trajectories, list) or not trajectories
                                     or not all(isinstance(t, str) for t in trajectories)):
        raise KnownFindingsError(f"{where}: trajectories must be a non-empty list of trajectory ids")
    return KnownFinding(entry["invariant"], entry["reason"].strip(), f"{path.name}: entry {number}",
                        entry.get("target", "*"), entry.get("recorded_outcome"),
                        tuple(trajectories) if trajectories is not None else None, entry.get("link"),
                        entry.get("fault"))


def split(violations: list[Violation], findings: list[KnownFinding], target: str,
          recorded_outcomes: dict[str, str | None]) -> tuple[list[Violation], list[KnownViolation]]:
    """(new violations, known ones with the entry that knew them), each in the run's order."""
    new: list[Violation] = []
    known: list[KnownViolation] = []
    for violation in violations:
        finding = next((f for f in findings if f.matches(violation, target, recorded_outcomes)), None)
        if finding is None:
            new.append(violation)
        else:
            known.append(KnownViolation(violation, finding))
    return new, known
