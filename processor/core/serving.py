"""The serving key: what the core schedules by in place of a bare model name.

Why: an engine's prefix cache is per adapter (a LoRA adapter changes every layer's keys and values, so
a prefix cached under one adapter is no use to another), and a consumer serves the base model or one
adapter of it. Folding the adapter into the key the core already keys everything by (lanes, the
switch order, shares, the ledger's model books, the consumers of a model) gives both rules at once
with no second dimension in the core: a batch never mixes serving keys, so it never mixes adapters,
and a consumer only ever takes the key its contract names, so it never receives another adapter's
items. Unserved adapters show up exactly as unserved models do.

Invariant: ``serving_key(model, "") == model`` (base-model work keys as it always has), and
``split_serving_key(serving_key(m, a)) == (m, a)`` for every model ``m`` without :data:`SEPARATOR` and
every adapter ``a`` (the wire refuses model and adapter names holding it, so keys never collide).
"""

from __future__ import annotations

SEPARATOR = "@"
"""Between model and adapter in a serving key (``llama-3-8b@support-tone``). Model and adapter names
must not contain it: checked where items and contracts are decoded."""


def serving_key(model: str, adapter: str) -> str:
    """The key the core schedules ``model``'s work by: the model itself, or ``model@adapter``."""
    return f"{model}{SEPARATOR}{adapter}" if adapter else model


def split_serving_key(key: str) -> tuple[str, str]:
    """``(model, adapter)`` of a serving key; the adapter is "" for base-model work."""
    model, _, adapter = key.partition(SEPARATOR)
    return model, adapter
