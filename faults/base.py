"""The fault interface and its registry: one small class per fault type.

A fault is a dataclass whose fields are its parameters; `apply` edits an `Exchange` and
returns a short description of what it changed (the fault log keeps it). Registering is a
decorator; the catalogue modules register themselves when `faults.catalogue` is imported.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, ClassVar

from .exchange import Exchange

FAULTS: dict[str, type["Fault"]] = {}


class FaultError(ValueError):
    """An unknown fault or a bad parameter; the message names the valid choices."""


class Fault:
    name: ClassVar[str]
    category: ClassVar[str]  # "protocol", "http", "transport" or "client"
    apis: ClassVar[frozenset[str]] = frozenset({"native", "openai"})
    server_side: ClassVar[bool] = True  # False: applied by the target adapter, not the server
    on_weight_update: ClassVar[bool] = False  # True: acts when the weight version changes, not per request
    # False: the client still gets the recorded reply, only later (latency): code that fails on it failed on a
    # valid reply, and the fault is no excuse for it (`bench.invariants.root_cause`)
    alters_reply: ClassVar[bool] = True

    def consumed_in(self, later_request: bytes, tokenizer: Any) -> bool:
        """Whether a later request of the same trajectory, or the sample the target made of it (token ids packed
        as int32), shows the client acted on this fault's answer; only faults whose effect is visible there
        override it (`watches_later`)."""
        return False

    watches_later: ClassVar[bool] = False  # True: `consumed_in` can tell, the engine asks it

    def apply(self, exchange: Exchange) -> str:
        raise NotImplementedError

    def check(self) -> None:
        """Raise FaultError on parameter values that make no sense."""

    @classmethod
    def parameters(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "Fault":
        hints, valid = _signature(cls)
        values: dict[str, Any] = {}
        for key, raw in params.items():
            if key not in valid:
                choices = ", ".join(valid) or "none"
                raise FaultError(f"{cls.name}: unknown parameter {key!r}; valid parameters: {choices}")
            values[key] = _convert(cls.name, key, raw, hints[key])
        fault = cls(**values)
        fault.check()
        return fault

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@functools.lru_cache(maxsize=None)
def _signature(cls: type) -> tuple[dict[str, Any], list[str]]:
    """A fault type's parameter hints and names, resolved once: `get_type_hints` evaluates every annotation string,
    which made a 20,000-rule plan take 7 s to load."""
    return typing.get_type_hints(cls), cls.parameters()  # type: ignore[attr-defined]


def _convert(fault: str, key: str, raw: Any, hint: Any) -> Any:
    """Command-line strings and TOML values to the parameter's declared type."""
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] or [hint]
    kind = kinds[0]
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if str(raw).lower() in ("true", "1", "yes"):
                return True
            if str(raw).lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if kind is int and not isinstance(raw, bool):
            return int(raw)
        if kind is float and not isinstance(raw, bool):
            return float(raw)
        if kind is str:
            return str(raw)
    except (TypeError, ValueError):
        pass
    raise FaultError(f"{fault}: parameter {key!r} must be {getattr(kind, '__name__', kind)}, got {raw!r}")


def register(cls: type[Fault]) -> type[Fault]:
    """Class decorator: make the fault available by its `name`."""
    if cls.name in FAULTS:
        raise RuntimeError(f"fault {cls.name!r} registered twice")
    FAULTS[cls.name] = dataclasses.dataclass(cls)  # type: ignore[assignment]
    return FAULTS[cls.name]


def alters_reply(name: str) -> bool:
    """Whether fault `name` changes what the client receives (an unknown name is taken to)."""
    try:
        return fault_class(name).alters_reply
    except FaultError:
        return True


def fault_class(name: str) -> type[Fault]:
    from . import catalogue  # noqa: F401  (registers every fault)

    if name not in FAULTS:
        raise FaultError(f"unknown fault {name!r}; valid faults: {', '.join(sorted(FAULTS))}")
    return FAULTS[name]
