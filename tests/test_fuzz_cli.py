"""The command line fuzzed: every subcommand's options with drawn values (odd numbers, names, paths). Parsing and the
checks `run` makes before anything starts either accept the arguments or exit 2 with a message naming an option,
never another exception. About 1,000 cases on a pull request, 10,000 nightly; whole commands run in
tests/test_cli_validation.py."""

from __future__ import annotations

import argparse
import contextlib
import io
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.arguments import ArgumentError, check_invariant_names, check_output_file, check_report_folder
from bench.cli import build_parser
from bench.testing.hypothesis_profiles import NIGHTLY, PROFILE_ENV, resolve

CASES = 10_000 if resolve(os.environ.get(PROFILE_ENV, "")) == NIGHTLY else 1_000
PARSER = build_parser()
SUBCOMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices  # noqa: SLF001


def _options(command: str) -> list[argparse.Action]:
    return [a for a in SUBCOMMANDS[command]._actions if a.option_strings and a.dest != "help"]  # noqa: SLF001


values = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "65536", "nan", "inf", "-inf", "1e309", "0.5", "-0.0", "", " ", "x",
                     "ref-gather:fixed", "nope:Nope", "seed-000", "chaos", "rlvr-500", "/dev/null", "/proc",
                     "/nonexistent/deep/file", "liveness,foo", "a=b", "=", "http://127.0.0.1:1"]),
    st.integers(-2**70, 2**70).map(str), st.floats().map(repr),
    st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12))


@st.composite
def argvs(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(SUBCOMMANDS)))
    options = _options(command)
    argv = [command]
    for action in draw(st.lists(st.sampled_from(options), max_size=5)) if options else []:
        argv.append(draw(st.sampled_from(action.option_strings)))
        if action.nargs != 0:
            argv.append(draw(values))
    if draw(st.booleans()):
        argv.append(draw(values))  # a stray positional
    return argv


def _parse(argv: list[str]) -> tuple[argparse.Namespace | None, str]:
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        try:
            return PARSER.parse_args(argv), ""
        except SystemExit as exit_:
            assert exit_.code in (0, 2), f"{argv}: exit {exit_.code}"
            return None, errors.getvalue()


@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(argv=argvs())
def test_any_arguments_parse_or_exit_2_naming_an_option(argv: list[str], tmp_path_factory: pytest.TempPathFactory
                                                        ) -> None:
    parsed, errors = _parse(argv)
    if parsed is None:
        assert "Traceback" not in errors
        assert errors.strip() == "" or "error:" in errors, errors  # --help/--version print and exit 0
        return
    if argv[0] != "run":
        return
    folder = tmp_path_factory.mktemp("fuzz") / "out"
    try:  # what `run` checks before anything starts, on what parsed
        check_report_folder("--out", parsed.out or folder, parsed.force)
        if parsed.junit:
            check_output_file("--junit", parsed.junit)
        if parsed.invariants:
            check_invariant_names("--invariants", parsed.invariants)
    except ArgumentError as error:
        assert str(error).startswith("--"), str(error)  # names the option


def test_the_fuzz_reaches_every_subcommand() -> None:
    assert {"run", "serve", "sweep", "proxy", "record", "report", "synth"} <= set(SUBCOMMANDS)
    assert all(_options(command) for command in ("run", "serve", "sweep"))


def test_a_bad_value_exits_2_naming_its_option() -> None:
    parsed, errors = _parse(["run", "--n", "nan"])
    assert parsed is None and "--n" in errors
