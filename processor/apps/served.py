"""A batch as the consumer checks it (by serving key) and as its engine runs it (by the real model).

Why two views: the processor keys work by the serving key, ``model@adapter`` for an item whose
request names a LoRA adapter (processor/core/serving.py), and a ``Batch`` carries that key as its
``model``; each item in it still carries its base ``model`` and its ``request.adapter`` on the wire.
The consumer's contract names one serving key, so its check must compare serving keys: an item of
another adapter (or of the base model) in its batch is a contract violation like an item of another
model. The engine, though, talks to a server that knows the base model and loads adapters by name
from each item's request (docs/engine-openai.md), so it is handed the batch with the real model.

Invariants: :func:`checked_view` changes nothing but the items' ``model`` (to their serving keys);
:func:`engine_view` changes nothing but the batch's ``model`` (to its base model); both return the
batch itself, not a copy, for base-model work, the common case.
"""

from __future__ import annotations

from dataclasses import replace

from processor.core.serving import serving_key, split_serving_key
from processor.wire.records import BatchRecord, TokenItemRecord


def item_serving_key(item: TokenItemRecord) -> str:
    """The key the processor scheduled ``item`` by: its model, or ``model@adapter``."""
    request = item.request
    return serving_key(item.model, request.adapter if request is not None else "")


def checked_view(batch: BatchRecord) -> BatchRecord:
    """``batch`` with each item's ``model`` its serving key, for ``contract_violation``: an item whose
    key is not the batch's (another adapter, or the base model in an adapter's batch) breaks it."""
    if not any(item.request is not None and item.request.adapter for item in batch.items):
        return batch
    return replace(batch, items=[replace(item, model=item_serving_key(item)) for item in batch.items])


def engine_view(batch: BatchRecord) -> BatchRecord:
    """``batch`` as its engine runs it: ``model`` the base model of the batch's serving key (the
    items' ``request.adapter`` names the adapter)."""
    model, adapter = split_serving_key(batch.model)
    return replace(batch, model=model) if adapter else batch
