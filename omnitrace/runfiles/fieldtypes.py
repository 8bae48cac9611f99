"""The JSON types of the run directory's fields that `report` and `compare` read.

A field of the wrong type (a string where a count belongs, a list where an object does)
is a file omnitrace did not write: it is named in one line (exit 2) rather than failing
deep in the report with a traceback. Absent fields and nulls are left to the readers,
which treat them as unknown. Only the fields read are checked; anything else is free.

A spec is ``INT``/``STR`` (a JSON integer/string), a dict (an object with those fields),
``ListOf(spec)``, ``MapOf(spec)`` (an object whose every value has the spec) or a tuple
of alternatives (the first that fits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INT = "an integer"
STR = "a string"


@dataclass(frozen=True)
class ListOf:
    item: Any


@dataclass(frozen=True)
class MapOf:
    value: Any


_COUNT = (INT, {"total": INT})  # older agents wrote {"total": N}
_EXPORTER = {"exported": INT, "failed": INT, "dropped": INT}

SPECS: dict[str, dict[str, Any]] = {
    "agent.json": {
        "events_read": _COUNT, "events": _COUNT, "events_dropped": _COUNT, "dropped": _COUNT,
        "spans_built": INT, "spans": INT,
        "rings": ListOf({"dropped": INT, "events_written": INT}),
        "record": {"events_not_recorded": INT},
        "views": {"requests_not_exported": INT, "spans_not_exported": INT},
        "exporters": MapOf(_EXPORTER),
    },
    "run.json": {"events_never_drained": INT, "status": STR,
                 "rings_left": ListOf({"events_written": INT, "dropped": INT, "never_drained": INT})},
    "bench.json": {
        "levels": ListOf({"concurrency": INT,
                          "measured_window": {"start_unix_ns": INT, "end_unix_ns": INT}}),
        "requests": ListOf({"id": (STR, INT), "concurrency": INT, "start_unix_ns": INT}),
        "args": {},
    },
}

_NAMES = {str: "a string", int: "an integer", float: "a number with a fraction", bool: "true/false",
          list: "a list", dict: "an object"}


def _kind(v: Any) -> str:
    return _NAMES.get(type(v), type(v).__name__)


def type_error(v: Any, spec: Any, where: str) -> str | None:
    """Why ``v`` (at ``where``) does not fit ``spec``, or None."""
    if v is None:
        return None
    if isinstance(spec, tuple):
        whys = [type_error(v, s, where) for s in spec]
        if None in whys:
            return None
        # the alternative of v's own kind failed deeper: that says more
        return next((w for w in whys if not w.startswith(f"{where!r} is ")), whys[0])
    if spec == INT:
        ok = isinstance(v, int) and not isinstance(v, bool)
        return None if ok else f"{where!r} is {_kind(v)}, not {INT}"
    if spec == STR:
        return None if isinstance(v, str) else f"{where!r} is {_kind(v)}, not {STR}"
    if isinstance(spec, ListOf):
        if not isinstance(v, list):
            return f"{where!r} is {_kind(v)}, not a list"
        return next((w for i, x in enumerate(v) if (w := type_error(x, spec.item, f"{where}[{i}]"))), None)
    want = spec.value if isinstance(spec, MapOf) else None
    if not isinstance(v, dict):
        return f"{where!r} is {_kind(v)}, not an object"
    fields = ((k, want) for k in v) if want is not None else spec.items()
    return next((w for k, s in fields if (w := type_error(v.get(k), s, f"{where}.{k}" if where else k))),
                None)


def check(name: str, doc: dict[str, Any]) -> str | None:
    """Why run-directory file ``name`` (run.json, agent.json, bench.json) has a field of
    the wrong type, or None."""
    return type_error(doc, SPECS[name], "")
