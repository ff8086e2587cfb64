"""A repro (or run.toml) file read back: a problem names the file, the line and the key, as a plan file's do.

Such a file is usually the bench's own, but it is edited by hand (a seed changed, a rule tried) and copied
around; "not a usable repro file (ValueError: invalid literal for int() ...)" left the reader to find which of
its twenty keys was meant. Here each recorded value is checked for its type before the run is built from it,
and the checks the run's configuration makes itself (`n=0: ...`) get the file and line added.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from bench.invariants import Bounds
from faults import PlanError, Rule, make_rule
from faults.base import FaultError
from faults.plan import WINDOW_FROM, key_line, load_toml, rules_from_tables, section_lines
from faults.schedule import ScheduleError

REQUIRED = ("trace", "target", "plan", "seed")  # what every repro file the bench writes records
_INT, _NUMBER, _STR, _LIST, _TABLE, _BOOL = "an integer", "a number", "a string", "an array", "a table", "true or false"
TYPES: dict[str, str] = {  # recorded key -> what its value must be (keys not listed are notes for the reader)
    **dict.fromkeys(("seed", "n", "concurrency", "steps"), _INT),
    **dict.fromkeys(("time_scale", "watchdog_s", "deadline_s"), _NUMBER),
    **dict.fromkeys(("trace", "target", "plan", "window_from", "isolation", "python", "upstream", "tokenizer_dir",
                     "on_step_failure", "invariant", "known"), _STR),
    **dict.fromkeys(("trajectories", "invariants", "rules", "events"), _LIST),
    **dict.fromkeys(("target_options", "bounds"), _TABLE),
    "compare_fresh": _BOOL,
}
_BOUNDS = {field.name for field in dataclasses.fields(Bounds)}
_EVENT_KEYS = ("rule", "fault", "trajectory", "turn", "attempt")


_PYTHON_TYPES: dict[str, tuple[type, ...]] = {_INT: (int,), _NUMBER: (int, float), _STR: (str,), _LIST: (list,),
                                              _TABLE: (dict,), _BOOL: (bool,)}


def _is(value: Any, kind: str) -> bool:
    if isinstance(value, bool):  # TOML's true is no integer, though Python's is
        return kind == _BOOL
    return isinstance(value, _PYTHON_TYPES[kind])


def _section_line(text: str, header: str, index: int = 0) -> int:
    """The line of the `index`-th `[header]` or `[[header]]` section (1 if there is none)."""
    found = section_lines(text, header)
    return found[index] if index < len(found) else 1


def read_repro_data(path: Path) -> tuple[str, dict[str, Any]]:
    """The file's text and values, each recorded value of the right type, the required ones present."""
    text = path.read_text(encoding="utf-8")
    data = load_toml(text, path)
    for key in REQUIRED:
        if key not in data:
            raise PlanError(f"{path}: {key}: missing (every repro file records the run's {key})")
    for key, value in data.items():
        kind = TYPES.get(key)
        if kind is not None and not _is(value, kind):
            raise PlanError(f"{path}:{key_line(text, 1, key)}: {key}: not {kind}: {value!r}")
    if data.get("window_from", WINDOW_FROM[0]) not in WINDOW_FROM:
        raise PlanError(f"{path}:{key_line(text, 1, 'window_from')}: window_from: not one of "
                        f"{', '.join(repr(w) for w in WINDOW_FROM)}: {data['window_from']!r}")
    for key, value in data.get("bounds", {}).items():
        where = f"{path}:{key_line(text, _section_line(text, 'bounds'), key)}: bounds.{key}"
        if key not in _BOUNDS:
            raise PlanError(f"{where}: not a bound; valid: {', '.join(sorted(_BOUNDS))}")
        if not _is(value, _NUMBER):
            raise PlanError(f"{where}: not a number: {value!r}")
    return text, data


def repro_rules(text: str, path: Path, data: dict[str, Any]) -> list[Rule]:
    """The recorded rules; a file of an earlier version recorded only events: one exact rule per event."""
    if "rules" in data:
        return rules_from_tables(text, str(path), data["rules"], "rule{index}")
    rules = []
    for index, event in enumerate(data.get("events", [])):
        start = _section_line(text, "events", index)
        missing = [key for key in _EVENT_KEYS if not isinstance(event, dict) or key not in event]
        if missing:
            raise PlanError(f"{path}:{start}: event {index}: {missing[0]}: missing")
        if not isinstance(event.get("params", {}), dict):
            raise PlanError(f"{path}:{start}: event {index}: params: not a table: {event['params']!r}")
        try:
            rules.append(make_rule({"fault": event["fault"], **event.get("params", {}),
                                    "trajectories": [event["trajectory"]], "turns": [event["turn"]],
                                    "attempts": [event["attempt"]]}, f"{event['rule']}@{index}"))
        except (FaultError, ScheduleError) as error:
            raise PlanError(f"{path}:{start}: event {index}: {error}") from None
    return rules


def config_error(text: str, path: Path, data: dict[str, Any], error: Exception) -> PlanError:
    """The run configuration's own check (`concurrency=0: needs ...`, `isolation 'x' is not ...`) with the file
    and the line of the key it names; any other error keeps its type for the reader."""
    named = re.match(r"(\w+)[= ]", str(error))
    if named and named.group(1) in data:
        return PlanError(f"{path}:{key_line(text, 1, named.group(1))}: {error}")
    return PlanError(f"{path}: not a usable repro file ({type(error).__name__}: {error})")
