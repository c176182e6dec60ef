"""Per-row generation settings for ``tokenfabric submit``: one job-wide JSON object and a column per row.

A *settings object* is a JSON object whose keys are :class:`~processor.wire.request.GenerationRequest`'s
field names, plus ``max_tokens`` (the item's ``output_budget``, which is not a request field)::

    {"temperature": 0, "seed": 7, "stop": ["\\n\\n"], "json_schema": {"type": "object"},
     "extra": {"repetition_penalty": 1.1}, "max_tokens": 64}

The job-wide object (``submit --request JSON`` or ``--request @FILE``) applies to every row; a row's own
object (``--request-column COL``: a JSON object, or its JSON text in CSV) overrides it **field by
field**, with two refinements, both so that the override says what the row means:

* the structured-output constraint (``json_schema``, ``choices``, ``regex``) is one field: a row
  that gives any of the three replaces the job's constraint instead of adding a second one;
* ``extra`` objects merge key by key (the row's keys win).

A ``null`` value means "not given here" (a Parquet struct column has every field, null where unset).
Unknown keys are refused: a typo (``temprature``) must not silently change what the model is asked.
In the job-wide object that is a setup error; in a row it makes the row bad, with the reason, like
any other bad row. So does a merged request that :func:`~processor.wire.request.request_problem`
refuses. A row with no settings at all (neither job-wide nor its own) gets no request: the consumer's
defaults apply, exactly as before requests existed.

Pure: no Kafka, no files except :func:`load_job_settings` reading ``@FILE``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from processor.wire.request import GenerationRequest, request_problem

#: Settings keys: the request's fields, and ``max_tokens`` for the item's output budget.
REQUEST_KEYS: tuple[str, ...] = tuple(f.name for f in fields(GenerationRequest))
OUTPUT_BUDGET_KEY = "max_tokens"
SETTINGS_KEYS: frozenset[str] = frozenset((*REQUEST_KEYS, OUTPUT_BUDGET_KEY))
#: The structured-output constraint, overridden as one field (module docstring).
CONSTRAINT_KEYS: tuple[str, ...] = ("json_schema", "choices", "regex")
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

#: A parsed settings object: only the keys that were given, each already of its field's type
#: (``stop`` a tuple of strings, ``json_schema``/``extra`` JSON texts, numbers checked).
Settings = dict[str, Any]


class SettingsError(ValueError):
    """A settings object cannot be used; the message names the key (and, for a row, is its reason)."""


@dataclass(frozen=True, slots=True)
class RowSettings:
    """What one item asks: its generation request (None: the consumer's defaults) and output budget."""

    request: GenerationRequest | None = None
    output_budget: int | None = None


def load_job_settings(arg: str) -> Settings:
    """The job-wide settings of ``--request``: a JSON object, or ``@PATH`` of a file holding one."""
    where = "--request"
    text = arg
    if arg.startswith("@"):
        path = Path(arg[1:])
        where = f"--request {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{where}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{where}: not JSON: {exc.msg} at column {exc.colno}") from None
    try:
        return parse_settings(value)
    except SettingsError as exc:
        raise SettingsError(f"{where}: {exc}") from None


def settings_cell(value: Any) -> Settings:
    """The settings of one row's ``--request-column`` cell: an object, its JSON text, or null (none)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"request column: not JSON: {exc.msg} at column {exc.colno}") from None
    return parse_settings(value)


def parse_settings(value: Any) -> Settings:
    """Check a settings object (module docstring) and give each key its field's type."""
    if not isinstance(value, Mapping):
        raise SettingsError(f"settings must be a JSON object, not {_json_type(value)}")
    unknown = sorted(str(k) for k in value if k not in SETTINGS_KEYS)
    if unknown:
        raise SettingsError(
            f"unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(SETTINGS_KEYS))})"
        )
    return {key: _PARSERS[key](key, v) for key, v in value.items() if v is not None}


def merge_settings(job: Settings, row: Settings) -> Settings:
    """``row`` over ``job``, field by field; one constraint; ``extra`` merged key by key."""
    merged = dict(job)
    if any(k in row for k in CONSTRAINT_KEYS):
        for k in CONSTRAINT_KEYS:
            merged.pop(k, None)
    merged.update(row)
    if "extra" in job and "extra" in row:
        merged["extra"] = _json_text({**json.loads(job["extra"]), **json.loads(row["extra"])})
    return merged


def row_settings(settings: Settings) -> RowSettings:
    """The item's request and output budget; SettingsError with :func:`request_problem`'s reason."""
    given = {k: v for k, v in settings.items() if k != OUTPUT_BUDGET_KEY}
    request = GenerationRequest(**given) if given else None
    if request is not None:
        problem = request_problem(request)
        if problem is not None:
            raise SettingsError(problem)
    return RowSettings(request, settings.get(OUTPUT_BUDGET_KEY))


# --------------------------------------------------------------------------------------------------
# one parser per key: each returns the field's value or raises SettingsError naming the key


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def _integer(key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{key} must be an integer, not {_json_type(value)}")
    if not low <= value <= high:
        raise SettingsError(f"{key} {value} is out of range ({low}..{high})")
    return value


def _int32(key: str, value: Any) -> int:
    return _integer(key, value, *_INT32)


def _int64(key: str, value: Any) -> int:
    return _integer(key, value, *_INT64)


def _budget(key: str, value: Any) -> int:
    return _integer(key, value, 0, _INT32[1])


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SettingsError(f"{key} must be a number, not {_json_type(value)}")
    return float(value)


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise SettingsError(f"{key} must be a string, not {_json_type(value)}")
    return value


def _strings(key: str, value: Any) -> tuple[str, ...]:
    """A list of strings; ``stop`` also takes one string (the OpenAI form)."""
    if key == "stop" and isinstance(value, str):
        return (value,)
    if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
        raise SettingsError(f"{key} must be an array of strings")
    return tuple(value)


def _token_ids(key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise SettingsError(f"{key} must be an array of token ids")
    return tuple(_integer(key, v, 0, _INT32[1]) for v in value)


def _json_text(value: Mapping[str, Any]) -> str:
    """Compact JSON text, keys in their given order (a schema's property order is the output's)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _json_object(key: str, value: Any) -> str:
    """An object, or the JSON text of one, as compact JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise SettingsError(f"{key} must be a JSON object or its JSON text") from None
    if not isinstance(value, Mapping):
        raise SettingsError(f"{key} must be a JSON object, not {_json_type(value)}")
    return _json_text(value)


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "adapter": _string,
    "priority": _int32,
    "temperature": _number,
    "top_p": _number,
    "top_k": _int32,
    "seed": _int64,
    "stop": _strings,
    "stop_token_ids": _token_ids,
    "logprobs": _int32,
    "json_schema": _json_object,
    "choices": _strings,
    "regex": _string,
    "extra": _json_object,
    OUTPUT_BUDGET_KEY: _budget,
}
