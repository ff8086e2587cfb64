"""`--target-option` checks shared by the adapters: an unknown key or a bad count is refused at warm-up, naming
the framework, the key and what is valid, before anything runs."""

from __future__ import annotations

from typing import Any, Mapping


def check_options(framework: str, options: Mapping[str, Any], valid: tuple[str, ...],
                  whole_numbers: Mapping[str, int] | None = None) -> None:
    """`valid` lists the keys a user may give (`trace`, the runner's own, is always accepted);
    `whole_numbers` maps keys that must be integers to their least value."""
    unknown = sorted(set(options) - set(valid) - {"trace"})
    if unknown:
        raise ValueError(f"{framework}: unknown target option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    for key, least in (whole_numbers or {}).items():
        value = options.get(key)
        if key in options and not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            raise ValueError(f"{framework}: target option {key} must be a whole number >= {least}, not {value!r}")
