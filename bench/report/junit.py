"""JUnit XML: one test case per invariant, a failure for each violated one (CI systems read it)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from ..invariants import INVARIANTS
from ..runner import RunResult


def write_junit(result: RunResult, path: Path) -> Path:
    checked = result.config.invariants or list(INVARIANTS)
    suite = ET.Element("testsuite", name=f"rollout-bench {result.target}", tests=str(len(checked)),
                       failures=str(len({v.invariant for v in result.violations})), errors="0",
                       time=f"{result.duration_s:.3f}")
    for name in checked:
        case = ET.SubElement(suite, "testcase", classname=f"rollout_bench.{result.target}", name=name)
        found = [v for v in result.violations if v.invariant == name]
        if found:
            failure = ET.SubElement(case, "failure", message=found[0].message, type=name)
            failure.text = "\n".join(f"{v.trajectory or '-'}: {v.message}" for v in found)
    tree = ET.ElementTree(suite)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
    return path
