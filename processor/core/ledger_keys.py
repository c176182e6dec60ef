"""The names of a ledger checkpoint's counters: one grammar, written and parsed here only.

A checkpoint (``LedgerSnapshotRecord.counters``, on the accounting topic) is a flat map from a key to
an integer, so it can be compacted, compared by an audit and read by status in any version. A key is
a counter name and the scope it counts:

=========================  ====================================================================
``<counter>``              the whole instance: ``received_items``, ``dead_lettered_items``, and
                           the service's gauges (``owned_partitions``, ``lanes_in_use``...)
``<counter>@<model>``      one model's book: ``queued_tokens@llama-3-8b``
``<counter>#<consumer>``   one consumer's book: ``padded_tokens#gpu-0``
``job:<counter>:<job>``    one job's book or share policy: ``job:routed_tokens:nightly``
=========================  ====================================================================

A counter name holds none of ``@``, ``#`` and ``:``; a ledger stage's counters end in ``_items`` or
``_tokens`` (:func:`stage_unit`). The owner comes last and may hold anything a model name may (a
model may contain ``@`` or ``#``; consumer ids and job names cannot: ``CONSUMER_ID``, ``JOB_NAME``),
so a key is split at its *first* separator. Writers (``Ledger.snapshot``, the service's job-share
gauges) and readers (``Ledger.restore``, ``ops/status``, ``ops/audit``) all go through this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CounterKey",
    "Scope",
    "consumer_key",
    "job_key",
    "keys_of",
    "model_key",
    "parse_key",
    "stage_unit",
]

Scope = Literal["total", "model", "consumer", "job"]

_MODEL, _CONSUMER, _JOB = "@", "#", "job:"
_UNITS = ("items", "tokens")


@dataclass(frozen=True, slots=True)
class CounterKey:
    """A parsed key: ``counter`` of ``owner`` (a model, consumer or job; "" for a total)."""

    counter: str
    scope: Scope = "total"
    owner: str = ""

    def encode(self) -> str:
        if self.scope == "model":
            return model_key(self.counter, self.owner)
        if self.scope == "consumer":
            return consumer_key(self.counter, self.owner)
        if self.scope == "job":
            return job_key(self.counter, self.owner)
        return self.counter

    def renamed(self, counter: str) -> CounterKey:
        """The same scope and owner, another counter (``queued_items@m`` -> ``adopted_queued_items@m``)."""
        return CounterKey(counter, self.scope, self.owner)


def model_key(counter: str, model: str) -> str:
    return f"{counter}{_MODEL}{model}"


def consumer_key(counter: str, consumer: str) -> str:
    return f"{counter}{_CONSUMER}{consumer}"


def job_key(counter: str, job: str) -> str:
    return f"{_JOB}{counter}:{job}"


def keys_of(counters: Iterable[str], scope: Scope, owner: str) -> list[str]:
    """The keys of many counters of one owner, in order: a whole book's in one call (a checkpoint
    writes thousands)."""
    if scope == "model":
        return [f"{counter}{_MODEL}{owner}" for counter in counters]
    if scope == "consumer":
        return [f"{counter}{_CONSUMER}{owner}" for counter in counters]
    if scope == "job":
        return [f"{_JOB}{counter}:{owner}" for counter in counters]
    return list(counters)


def parse_key(key: str) -> CounterKey:
    """The inverse of the encoders above; ``ValueError`` for a ``job:`` key without its job."""
    if key.startswith(_JOB):
        counter, sep, job = key[len(_JOB) :].partition(":")
        if not sep:
            raise ValueError(f"checkpoint key {key!r}: expected job:<counter>:<job>")
        return CounterKey(counter, "job", job)
    at, hash_ = key.find(_MODEL), key.find(_CONSUMER)
    if at >= 0 and (hash_ < 0 or at < hash_):
        return CounterKey(key[:at], "model", key[at + 1 :])
    if hash_ >= 0:
        return CounterKey(key[:hash_], "consumer", key[hash_ + 1 :])
    return CounterKey(key)


def stage_unit(counter: str) -> tuple[str, str] | None:
    """``("routed", "tokens")`` for ``routed_tokens``; None for a counter that does not end in
    ``_items`` or ``_tokens`` (``batches``). ``padded_tokens`` gives ``("padded", "tokens")``: whether
    ``padded`` is a ledger stage is the caller's to ask."""
    stage, _, unit = counter.rpartition("_")
    return (stage, unit) if stage and unit in _UNITS else None
