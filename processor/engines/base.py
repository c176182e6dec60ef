"""The engine interface: what a consumer app runs on each batch, and the registry that names engines.

A consumer app (:mod:`processor.apps.consumer`) reads a :class:`~processor.wire.records.BatchRecord` from its
batch topic, checks it against its own contract, hands it to an :class:`Engine`, and writes one
``Completion`` per item from the :class:`ItemResult` list the engine returns. The engine never touches
Kafka: it sees decoded batches and returns plain values, so a real inference server and the ``sim``
cost model are interchangeable and an engine can be tested without a broker.

Contract of :meth:`Engine.run`
------------------------------

* **Input.** One batch. Every item has the batch's model and shape; ``batch.padded_length`` is the
  length every item is padded to (the engine pays ``padded_length * len(items)`` tokens of compute).
  The batch already respects the consumer's contract: the app rejects a batch that does not, without
  calling the engine.
* **Output.** Exactly one :class:`ItemResult` per input item, in the same order, with the same
  ``item_id``. An engine that cannot run one item returns ``status="failed"`` and a ``reason`` for
  that item and ``ok`` for the others.
* **Exceptions.** Raising means *the whole batch failed*: the app reports every item of it as
  ``failed`` with the exception's type and text as the reason, and carries on with the next batch.
  A result list of the wrong length or order is treated the same way (``engine-contract``). Either
  way the items are answered: an engine must never make an item disappear.
* **Blocking.** ``run`` is called from the app's poll loop, one batch at a time, and may block for
  as long as the forward pass takes. It should finish well within ``max.poll.interval.ms`` (5 minutes
  by default), or the group coordinator assumes the consumer died and the batch is redelivered.
* **Delivery.** The app commits a batch's offset only after every completion of it is acknowledged
  by the broker. A crash between the two re-runs the batch (at-least-once), so ``run`` must be safe to
  call again on a batch it has seen: no side effects outside the returned results.
* **Threads.** One app calls one engine from one thread. :meth:`Engine.close` is called once, after
  the last ``run``, also when the app stops on an error.

Adding an engine
----------------

Write ``processor/engines/<name>.py`` with a subclass of :class:`Engine` and a factory
``def from_options(options: dict[str, str]) -> Engine`` that parses its string options (raise
``ValueError`` with a one-line message naming the bad option), then add ``"<name>":
"processor.engines.<name>"`` to :data:`ENGINES`. The module is imported only when that engine is
asked for, so an engine's heavy dependencies (an inference runtime, a GPU driver) never load for the
others. ``tokenfabric consumer --engine <name>`` then offers it.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from processor.wire.records import BatchRecord

ResultStatus = Literal["ok", "failed", "rejected"]


@dataclass(frozen=True, slots=True)
class ItemResult:
    """What an engine says about one item of a batch.

    ``status``: ``ok`` (ran, ``output`` and ``output_tokens`` are its result), ``failed`` (the engine
    tried and could not; ``reason`` says why) or ``rejected`` (the engine refuses the item without
    trying, e.g. a prompt its tokenizer cannot have produced; ``reason`` says why). ``output`` is
    opaque bytes, the consumer's own format; empty and ``output_tokens=0`` unless ``ok``.
    ``cached_tokens`` is how many of the item's prompt tokens the engine served from its prefix cache
    instead of computing them, as its server reported them (0 when it keeps no cache or reports
    none); the consumer app holds it to ``[0, token_count]``. ``cache_hit`` is True when the engine
    reused a cached prefix for the item: an engine that counts tokens sets it to ``cached_tokens > 0``;
    one that counts none (``sim``'s modelled cache) says it alone. ``retriable`` (``failed`` only):
    the failure is worth another try, the engine timed out, its server answered 5xx, went away or
    refused the connection; not a refusal (4xx) nor anything that would fail again. The processor
    then sends the item back to the lanes while its job's ``max_attempts`` allows (docs/jobs.md).
    """

    item_id: str
    status: ResultStatus
    output: bytes
    output_tokens: int
    reason: str | None
    cache_hit: bool
    cached_tokens: int = 0
    retriable: bool = False


RETRIABLE_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError)
"""Exceptions that make a failure retriable: a timeout, a connection refused, reset or aborted."""


def retriable_error(exc: BaseException) -> bool:
    """Whether an engine's exception is one of :data:`RETRIABLE_ERRORS`, itself or anything it was
    raised from or wraps (``urllib.error.URLError.reason``: a refused connection); the consumer app
    marks the failed completions of a batch whose engine raised it ``retriable``."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        if isinstance(e, RETRIABLE_ERRORS):
            return True
        seen.add(id(e))
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None)]
    return False


class Engine(ABC):
    """Runs batches. See the module docstring for the exact contract of :meth:`run`."""

    #: Short registry name, written nowhere on the wire; for logs.
    name: str = "engine"

    @abstractmethod
    def run(self, batch: BatchRecord) -> list[ItemResult]:
        """Run one batch; exactly one result per ``batch.items`` entry, same order. Raise = all failed."""

    def close(self) -> None:  # noqa: B027 - optional hook, most engines hold nothing
        """Release what the engine holds (a model, a connection). Called once, after the last run."""


#: Engine name -> module exposing ``from_options(options: dict[str, str]) -> Engine``.
ENGINES: dict[str, str] = {
    "sim": "processor.engines.sim",
    "embed": "processor.engines.embed",
    "openai": "processor.engines.openai_http",
}


def make_engine(name: str, options: dict[str, str]) -> Engine:
    """The engine ``name`` built from string ``options`` (each engine documents its own keys).

    Raises ``ValueError`` with a one-line message for an unknown name or a bad option.
    """
    module_name = ENGINES.get(name)
    if module_name is None:
        raise ValueError(f"unknown engine {name!r} (engines: {', '.join(sorted(ENGINES))})")
    module = importlib.import_module(module_name)
    engine = module.from_options(dict(options))
    if not isinstance(engine, Engine):
        raise TypeError(f"{module_name}.from_options returned {type(engine).__name__}, not an Engine")
    return engine
