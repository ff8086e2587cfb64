"""JUnit XML: one test case per invariant, a failure for each violated one (CI systems read it); an invariant
broken only on known findings is skipped, with the reason."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench.invariants import INVARIANTS, Violation
from bench.orchestration.runner import RunResult
from bench.records.atomic_write import atomic_path
from bench.steps.checks import CHECKS as STEP_CHECKS
from bench.steps.fresh import FRESH_CHECK


def _tracebacks(violations: list[Violation]) -> str:
    """The exceptions behind the violations, each whole (chain included) and once: CI shows the failing line."""
    texts = dict.fromkeys(str(v.evidence["traceback"]) for v in violations if v.evidence.get("traceback"))
    return "".join(f"\n\n{text.rstrip()}" for text in texts)


def _after_fault(violation: Violation) -> str:
    """The injected fault that preceded a finding, as CI shows it: what was injected, where, and by which rule."""
    event = violation.fault
    if not event:
        return ""
    return (f" (after the injected fault {event['fault']}, rule {event['rule']}, turn {event['turn']}, attempt "
            f"{event['attempt']}, request {event['request_id']})")


def _provenance_properties(case: ET.Element, provenance: dict[str, Any]) -> str:
    """Per fault type, how many checked samples it hit hold tokens other than those served: as properties of the
    provenance test case, and as a line its failure text ends with."""
    properties = ET.SubElement(case, "properties")
    for key in ("match", "mismatch"):
        ET.SubElement(properties, "property", name=f"provenance.{key}", value=str(provenance[key]))
    lines = []
    for fault, stats in provenance["by_fault"].items():
        value = f"{stats['mismatch']} of {stats['checked']}"
        ET.SubElement(properties, "property", name=f"provenance.mismatch.{fault}", value=value)
        if stats["mismatch"]:
            lines.append(f"{fault}: {value} checked samples")
    return "\n\nmismatch by fault type: " + "; ".join(lines) if lines else ""


def _cases(result: RunResult) -> list[str]:
    """The test cases: the invariants checked, a multi-step run's checks across steps, and any other check a finding
    came from, so that no failure the run counts is missing from the file."""
    cases = list(result.config.invariants or INVARIANTS)
    if result.config.steps > 1:
        cases += [*STEP_CHECKS, *([FRESH_CHECK] if result.config.compare_fresh else [])]
    found = [v.invariant for v in result.violations] + [k.violation.invariant for k in result.known_violations]
    return list(dict.fromkeys(cases + found))


def write_junit(result: RunResult, path: Path, provenance: dict[str, Any] | None = None) -> Path:
    """`provenance`: the summary's provenance block, for that test case's per-fault properties."""
    checked = _cases(result)
    suite = ET.Element("testsuite", name=f"rollout-bench {result.target}",
                       tests=str(len(checked) + bool(result.interrupted)),
                       failures=str(len({v.invariant for v in result.violations})),
                       errors=str(int(bool(result.interrupted))),
                       skipped=str(len({k.violation.invariant for k in result.known_violations}
                                       - {v.invariant for v in result.violations})
                                   + (result.config.upstream is not None and "replay_fidelity" in checked)),
                       time=f"{result.duration_s:.3f}")
    for name in checked:
        case = ET.SubElement(suite, "testcase", classname=f"rollout_bench.{result.target}", name=name)
        found = [v for v in result.violations if v.invariant == name]
        known = [k for k in result.known_violations if k.violation.invariant == name]
        by_fault = _provenance_properties(case, provenance) if name == "provenance" and provenance else ""
        if found:
            failure = ET.SubElement(case, "failure", message=found[0].message, type=name)
            failure.text = "\n".join(f"{v.trajectory or '-'}: {v.message}{_after_fault(v)}" for v in found) \
                + _tracebacks(found) + by_fault
        elif name == "replay_fidelity" and result.config.upstream is not None:
            ET.SubElement(case, "skipped", message=f"does not apply: the answers came from the live engine at "
                          f"{result.config.upstream}, not from the recording")
        elif known:  # only known findings: skipped with the reason, so CI shows them without failing
            skipped = ET.SubElement(case, "skipped", message=f"{len(known)} known: {known[0].finding.reason}")
            skipped.text = "\n".join(f"{k.violation.trajectory or '-'}: {k.violation.message}" for k in known)
    if result.interrupted:  # CI must not read an interrupted run's unjudged invariants as passes
        case = ET.SubElement(suite, "testcase", classname=f"rollout_bench.{result.target}", name="run")
        ET.SubElement(case, "error", type="interrupted",
                      message=f"the run was interrupted by {result.interrupted}: only what came back until then "
                              f"was judged ({result.violations_not_judged} findings not judged)")
    tree = ET.ElementTree(suite)
    ET.indent(tree)
    path.parent.mkdir(parents=True, exist_ok=True)  # `--junit reports/junit/nightly.xml`, made as an --out is
    with atomic_path(path) as temporary:
        tree.write(temporary, encoding="utf-8", xml_declaration=True)
    return path
