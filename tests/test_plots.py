"""The report's plots as people read them: titled, units on both axes, axes from zero, and the timeline shows the
fault events and the moment the batch went down (a crashed run) or no crash line at all (a healthy one)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from bench import RunConfig, run
from bench.report import load, write_report
from bench.report.plots import outcomes_by_fault, request_timeline, throughput
from faults import resolve_plan


def _report(target: str, folder: Path) -> dict:
    result = asyncio.run(run(RunConfig(plan=resolve_plan("seed-000"), target=target, time_scale=0)))
    write_report(result, folder)
    return load(folder)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _report("ref-gather:unfixed", tmp_path_factory.mktemp("crashed"))


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _report("ref-gather:fixed", tmp_path_factory.mktemp("healthy"))


def _figures(report: dict) -> list[Figure]:
    return [outcomes_by_fault(report["trajectories"]),
            request_timeline(report["requests"], report["faults"], report["summary"]),
            throughput(report["requests"])]


@pytest.mark.parametrize("which", ["crashed", "healthy"])
def test_every_plot_has_a_title_units_and_axes_from_zero(which: str, request: pytest.FixtureRequest) -> None:
    for figure in _figures(request.getfixturevalue(which)):
        [ax] = figure.axes
        assert ax.get_title()
        assert "(" in ax.get_xlabel() and ax.get_ylabel()  # the unit, in brackets
        assert ax.get_xlim()[0] == 0
        assert ax.get_ylim()[0] == 0 or ax.get_ylabel().startswith("fault type")  # bars: categories on y


def _lines(figure: Figure) -> dict[str, int]:
    labels: dict[str, int] = {}
    for line in figure.axes[0].get_lines():
        labels[line.get_label()] = labels.get(line.get_label(), 0) + 1
    return labels


def test_the_timeline_marks_each_fault_and_the_crash(crashed: dict) -> None:
    summary = crashed["summary"]
    lines = _lines(request_timeline(crashed["requests"], crashed["faults"], summary))
    error = summary["batch_error"]
    crash = [label for label in lines if label.startswith("batch error:")]
    assert crash == [f"batch error: {error['type']} raised by {error['raised_by']} after "
                     f"{error['fault_reached']['fault']}"]
    assert sum(lines.values()) == len(crashed["faults"]) + 1  # one line per fault event, one for the crash
    [crash_line] = [line for line in request_timeline(crashed["requests"], crashed["faults"], summary).axes[0]
                    .get_lines() if line.get_label() == crash[0]]
    start = crashed["requests"]["started"].min()
    assert crash_line.get_xdata()[0] == pytest.approx(error["fault_reached"]["time"] - start)


def test_a_healthy_run_has_no_crash_line(healthy: dict) -> None:
    lines = _lines(request_timeline(healthy["requests"], healthy["faults"], healthy["summary"]))
    assert healthy["summary"]["batch_error"] is None
    assert not any(label.startswith("batch error") for label in lines)
    assert sum(lines.values()) == len(healthy["faults"]) > 0


def test_throughput_counts_every_finished_request(healthy: dict) -> None:
    [ax] = throughput(healthy["requests"]).axes
    [stairs] = ax.patches
    values, edges = stairs.get_data().values, stairs.get_data().edges
    width = edges[1] - edges[0]
    assert round(float((values * width).sum())) == len(healthy["requests"])  # nothing lost to the binning
