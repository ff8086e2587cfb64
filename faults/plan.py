"""Rules and plans: from TOML files (`faults/plans/*.toml`) or `--fault` specs.

A rule is one fault with its parameters and a schedule; a plan is named rules plus a seed.
A rule is written flat, the same way in both places: `fault` (the type), an optional `name`,
schedule keys (`p`, `every`, `first`, `trajectories`, `groups`, `turns`, `attempts`, `window`,
`endpoints`) and the fault's own parameters:

    [[rules]]                                   --fault 'http_error:status=503,p=1/100'
    fault = "http_error"
    status = 503
    p = "1/100"

A `window = [start, end]` counts seconds from the target's first request by default; a plan file
may say `window_from = "server_start"` to count from the server's start instead (`run`: from the
moment the target's worker is loaded, its imports done).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from .base import Fault, FaultError, fault_class
from .schedule import SCHEDULE_KEYS, Schedule, ScheduleError, parse_schedule

PLANS_DIR = Path(__file__).with_name("plans")
# Where `window` schedules count from (plan key `window_from`): the first request the plan decides
# about (the target's first request: a framework that starts Ray or loads a model inside its rollout
# does not eat an outage window), or the server's start (`run`: once the target's worker is loaded).
FIRST_REQUEST, SERVER_START = "first_request", "server_start"
WINDOW_FROM = (FIRST_REQUEST, SERVER_START)
PLAN_KEYS = ("name", "seed", "description", "window_from", "rules")


@dataclass(frozen=True)
class Rule:
    name: str
    fault: Fault
    schedule: Schedule

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "fault": self.fault.name, "params": self.fault.describe(),
                "schedule": self.schedule.describe()}


@dataclass(frozen=True)
class Plan:
    name: str
    seed: int
    rules: tuple[Rule, ...]
    description: str = ""
    source: str | None = None
    window_from: str = FIRST_REQUEST  # what `window` schedules count from: FIRST_REQUEST or SERVER_START

    def scaled(self, factor: float) -> "Plan":
        """Every probability rule's `p` multiplied by `factor` (fault-rate sweeps)."""
        rules = tuple(Rule(r.name, r.fault, r.schedule.scaled(factor)) for r in self.rules)
        return dataclasses.replace(self, rules=rules)

    def with_seed(self, seed: int) -> "Plan":
        return dataclasses.replace(self, seed=seed)


class PlanError(ValueError):
    """A plan that cannot be loaded; names the file and line (or the `--fault` spec)."""


class RuleValueError(FaultError):
    """A rule value no fault or schedule can mean (not a number where one is needed, inf, NaN); names its key."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def _non_finite(value: Any) -> bool:
    """inf or NaN, alone or inside a list (TOML `inf`, `nan`, or a number too large for a float)."""
    if isinstance(value, (list, tuple)):
        return any(_non_finite(item) for item in value)
    return isinstance(value, float) and not math.isfinite(value)


def make_rule(values: dict[str, Any], default_name: str) -> Rule:
    """A rule from flat values: `fault`, `name`, schedule keys, fault parameters."""
    values = dict(values)
    kind = values.pop("fault", None)
    if not isinstance(kind, str):
        raise RuleValueError("fault", "a rule needs `fault`, the name of a fault type")
    cls = fault_class(kind)
    name = values.pop("name", default_name)
    if not isinstance(name, str) or not name.strip():
        raise RuleValueError("name", f"a rule's name is a non-empty string; got {name!r}")
    for key, value in values.items():  # every number a rule holds (p, ms, status, window...) must be finite
        if _non_finite(value):
            raise RuleValueError(key, f"must be a finite number; got {value!r}")
        if isinstance(value, dict):
            raise RuleValueError(key, f"a table is not a rule value; got {value!r}")
    schedule_values = {k: values.pop(k) for k in list(values) if k in SCHEDULE_KEYS}
    fault, schedule = cls.from_params(values), parse_schedule(schedule_values)
    # a `--fault` string such as 'ms=nan' or 'window=0-inf' becomes a number only now
    for key, value in [*fault.describe().items(), ("window", schedule.window)]:
        if _non_finite(value):
            raise RuleValueError(key, f"must be a finite number; got {value!r}")
    return Rule(name, fault, schedule)


def parse_spec(spec: str) -> dict[str, Any]:
    """`name:key=value,key=value` -> flat rule values; a bare item extends the previous value."""
    kind, _, rest = spec.partition(":")
    values: dict[str, Any] = {"fault": kind.strip()}
    last: str | None = None
    for token in filter(None, (t.strip() for t in rest.split(","))):
        if "=" in token:
            last, _, value = token.partition("=")
            last = last.strip()
            values[last] = value.strip()
        elif last is not None:
            values[last] = f"{values[last]},{token}"
        else:
            raise PlanError(f"--fault {spec!r}: expected key=value after ':', got {token!r}")
    return values


def rule_from_spec(spec: str, index: int = 0) -> Rule:
    try:
        values = parse_spec(spec)
        return make_rule(values, f"{values['fault']}#{index}")
    except (FaultError, ScheduleError) as error:
        raise PlanError(f"--fault {spec!r}: {error}") from None


def plan_from_specs(specs: list[str], seed: int, name: str = "command-line") -> Plan:
    return Plan(name, seed, tuple(rule_from_spec(s, i) for i, s in enumerate(specs)))


def section_lines(text: str, header: str) -> list[int]:
    """The lines of a TOML file's `[header]` or `[[header]]` sections, in order."""
    pattern = re.compile(rf"\s*\[\[?\s*{re.escape(header)}\s*\]\]?\s*(#.*)?$")
    return [n for n, line in enumerate(text.splitlines(), start=1) if pattern.match(line)]


def load_toml(text: str, path: str | Path) -> dict[str, Any]:
    """TOML text's values; text that is not TOML names `path` and the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        line = re.search(r"line (\d+)", str(error))
        raise PlanError(f"{path}:{line.group(1) if line else 1}: not valid TOML ({error})") from None


def key_line(text: str, start: int, key: str) -> int:
    """The line of `key = ...` in the TOML section starting at line `start` (1: the top-level keys); `start` if absent."""
    lines = text.splitlines()
    for number in range(start, len(lines) + 1):
        line = lines[number - 1]
        if number > start and re.match(r"\s*\[", line):
            break
        if re.match(rf"\s*{re.escape(key)}\s*=", line):
            return number
    return start


def load_plan(path: str | Path) -> Plan:
    """Load a TOML plan file; every problem names the file and line."""
    path = Path(path)
    return parse_plan(path.read_text(encoding="utf-8"), str(path), default_name=path.stem)


def parse_plan(text: str, path: str, *, default_name: str = "plan") -> Plan:
    """A plan from TOML text; `path` names its origin in every error (a file, or `<request body>`)."""
    data = load_toml(text, path)
    unknown = set(data) - set(PLAN_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        raise PlanError(f"{path}:{key_line(text, 1, key)}: unknown plan key {key!r}; valid: {', '.join(PLAN_KEYS)}")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise PlanError(f"{path}:{key_line(text, 1, 'seed')}: seed must be an integer, got {seed!r}")
    window_from = data.get("window_from", FIRST_REQUEST)
    if window_from not in WINDOW_FROM:
        raise PlanError(f"{path}:{key_line(text, 1, 'window_from')}: window_from must be one of "
                        f"{', '.join(repr(w) for w in WINDOW_FROM)}; got {window_from!r}")
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise PlanError(f"{path}:{key_line(text, 1, key)}: {key} must be a string, got {data[key]!r}")
    tables = data.get("rules", [])
    if not isinstance(tables, list):
        raise PlanError(f"{path}:{key_line(text, 1, 'rules')}: rules must be an array of tables ([[rules]] "
                        f"sections), got {tables!r}")
    rules = rules_from_tables(text, path, tables, "{fault}#{index}")
    seen: set[str] = set()  # one pass: `list.count` per name made a 20,000-rule plan quadratic
    duplicate = next((r.name for r in rules if r.name in seen or seen.add(r.name)), None)
    if duplicate:
        raise PlanError(f"{path}: rule name {duplicate!r} is used twice")
    return Plan(str(data.get("name", default_name)), seed, tuple(rules), str(data.get("description", "")), path,
                window_from)


def rules_from_tables(text: str, path: str, tables: list[Any], default_name: str) -> list[Rule]:
    """The rules of a TOML file's `[[rules]]` tables (a plan file, a repro file); a bad one names the file, the line
    of its key at fault and the rule: `path:LINE: rule N: ...`. `default_name` formats `fault` and `index`."""
    starts = section_lines(text, "rules")
    rules = []
    for index, values in enumerate(tables):
        start = starts[index] if index < len(starts) else key_line(text, 1, "rules")
        if not isinstance(values, dict):
            raise PlanError(f"{path}:{start}: rule {index}: a rule is a table (a [[rules]] section with `fault` "
                            f"and its keys), got {values!r}")
        try:
            rules.append(make_rule(values, default_name.format(fault=values.get("fault", "rule"), index=index)))
        except (ScheduleError, RuleValueError) as error:
            raise PlanError(f"{path}:{key_line(text, start, error.key)}: rule {index}: {error}") from None
        except FaultError as error:
            key = _offending_key(str(error), values)
            raise PlanError(f"{path}:{key_line(text, start, key)}: rule {index}: {error}") from None
    return rules


def _offending_key(message: str, values: dict[str, Any]) -> str:
    quoted = re.findall(r"'([^']+)'", message)
    for key in quoted:
        if key in values:
            return key
    return "fault"


def shipped_plans() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PLANS_DIR.glob("*.toml"))}


def resolve_plan(spec: str) -> Plan:
    """A plan argument: a TOML path or a shipped plan name."""
    path = Path(spec)
    if path.exists():
        return load_plan(path)
    plans = shipped_plans()
    if spec in plans:
        return load_plan(plans[spec])
    raise PlanError(f"plan {spec!r}: no such file, and not a shipped plan ({', '.join(plans) or 'none'})")


def rule_table(rule: Rule) -> dict[str, Any]:
    """A rule as the flat values `make_rule` reads back (TOML `[[rules]]` shape): plans cross processes so."""
    params = {k: v for k, v in rule.fault.describe().items() if v is not None}
    schedule = {k: list(v) if isinstance(v, tuple) else v for k, v in rule.schedule.describe().items()}
    return {"fault": rule.fault.name, "name": rule.name, **params, **schedule}


def toml_value(value: Any) -> str:
    """One TOML value: plan files, sweep plans and repro files are all written through here."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Fraction):
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are TOML basic-string escapes
    if isinstance(value, (list, tuple, frozenset, set)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(toml_value(v) for v in items) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} to TOML")


def plan_to_toml(plan: Plan) -> str:
    """A plan file that `load_plan` reads back to the same rules and seed."""
    lines = [f"name = {toml_value(plan.name)}"]
    if plan.description:
        lines.append(f"description = {toml_value(plan.description)}")
    lines.append(f"seed = {plan.seed}")
    if plan.window_from != FIRST_REQUEST:
        lines.append(f"window_from = {toml_value(plan.window_from)}")
    for rule in plan.rules:
        lines += ["", "[[rules]]"] + [f"{key} = {toml_value(value)}" for key, value in rule_table(rule).items()]
    return "\n".join(lines) + "\n"
