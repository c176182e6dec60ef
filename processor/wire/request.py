"""What one item asks of the model: its generation request (``TokenItem.request``).

Why a typed record, not a JSON blob: producers in other languages write it with their Avro library
and get its field names and types checked there; the engine maps it to each server's own request form
(processor/engines/), and grouping items with equal settings into one request is equality of two
values. The processor never interprets it, except for ``adapter``: a LoRA adapter's prefix cache is
its own, so it is part of the serving key (processor/core/serving.py).

Invariants of a valid request (:func:`request_problem` states them, the decoders apply them):
at most one structured-output constraint (``json_schema``, ``choices``, ``regex``); ``json_schema`` and
``extra`` are JSON texts of an object; ``temperature >= 0``, ``0 < top_p <= 1``, ``top_k >= 0``,
``logprobs >= 0``; no empty stop string; ``adapter`` without the serving key's separator. The most
output tokens an item may generate is ``TokenItem.output_budget``, not a field here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from processor.core.serving import SEPARATOR


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """One item's generation settings; None / empty means "the consumer's default".

    Frozen and made of hashable values, so two items ask the same of the server exactly when their
    requests are equal (the engine groups them into one server request by that).
    """

    adapter: str = ""
    """LoRA adapter name; "" for the base model. Part of the serving key: a batch never mixes adapters."""
    priority: int = 0
    """Passed to servers that schedule by it (vLLM's ``priority``); lower runs first there. The
    processor does not reorder by it."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """Stop strings."""
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    """Return log-probabilities of the generated tokens with this many alternatives each (0: the
    chosen token's only); None: none."""
    json_schema: str | None = None
    """Structured output: the output must be JSON valid against this schema (the schema as JSON text)."""
    choices: tuple[str, ...] = ()
    """Structured output: the output must be exactly one of these strings."""
    regex: str | None = None
    """Structured output: the output must match this regular expression."""
    extra: str | None = None
    """Server-specific fields as the JSON text of an object, merged into the request body last."""

    @property
    def constraint(self) -> tuple[str, str | tuple[str, ...]] | None:
        """The structured-output constraint as ``(kind, value)``: ``json_schema``, ``choices`` or
        ``regex``; None when the output is free."""
        if self.json_schema is not None:
            return ("json_schema", self.json_schema)
        if self.choices:
            return ("choices", self.choices)
        if self.regex is not None:
            return ("regex", self.regex)
        return None


def request_problem(request: GenerationRequest) -> str | None:
    """Why ``request`` is invalid (one line), or None when it is valid (module docstring)."""
    r = request
    if SEPARATOR in r.adapter:
        return f"adapter {r.adapter!r} contains {SEPARATOR!r}"
    if sum((r.json_schema is not None, bool(r.choices), r.regex is not None)) > 1:
        return "more than one structured-output constraint (json_schema, choices, regex): give one"
    if r.temperature is not None and not (math.isfinite(r.temperature) and r.temperature >= 0):
        return f"temperature {r.temperature} is not a number >= 0"
    if r.top_p is not None and not (math.isfinite(r.top_p) and 0 < r.top_p <= 1):
        return f"top_p {r.top_p} is not in (0, 1]"
    if r.top_k is not None and r.top_k < 0:
        return f"top_k {r.top_k} is below 0"
    if r.logprobs is not None and r.logprobs < 0:
        return f"logprobs {r.logprobs} is below 0"
    if "" in r.stop:
        return "an empty stop string"
    if "" in r.choices:
        return "an empty choice"
    for name, text in (("json_schema", r.json_schema), ("extra", r.extra)):
        if text is not None and not _is_json_object(text):
            return f"{name} is not the JSON text of an object"
    return None


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
