"""One batch of a consumer app, from its message to durable completions (the delivery strategy then
commits its offset: processor.apps.consumer_delivery).

For each batch: decode it, check it against the consumer's *own* contract (by serving key: an
adapter's consumer takes only that adapter's items, processor.apps.served), run the engine (with the
batch's real model), produce its completions to the results topic and flush. By default
(``completions="batch"``) that is one ``CompletionBatch`` message keyed by ``batch_id``, split into
several only past ``max_completion_bytes``; ``completions="item"`` writes one ``Completion`` per item
keyed by ``item_id``, for results readers that only understand that record.

What never happens silently: a batch that does not decode goes whole to the dead-letter topic (and
is committed past, so it cannot wedge the consumer); a batch that breaks the contract is answered
with every item ``rejected`` and the reason, never run; an engine that raises or returns the wrong
results answers every item ``failed`` with the error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Message

from processor.apps.consumer_output import ConsumerOutput
from processor.apps.deadletters import dead_letter_of
from processor.apps.served import checked_view, engine_view
from processor.apps.settings import ConsumerSettings
from processor.core.accounting import prompt_split
from processor.core.contract import Contract, contract_violation
from processor.engines.base import Engine, ItemResult, retriable_error
from processor.kafka.topics import TopicNames
from processor.wire.completions import encode_completion, encode_completion_batches
from processor.wire.control import encode_dead_letter
from processor.wire.errors import DecodeError
from processor.wire.items import decode_batch
from processor.wire.records import (
    STATUSES,
    BatchRecord,
    CompletionBatchRecord,
    CompletionRecord,
    Status,
    TokenItemRecord,
)
from processor.wire.registry_framing import frame_single_object

log = logging.getLogger("tokenfabric.consumer")


@dataclass(slots=True)
class ConsumerStats:
    """Counts since :meth:`ConsumerApp.run` started (batches include dead-lettered ones)."""

    batches: int = 0
    items: int = 0
    ok: int = 0
    failed: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    engine_ms: int = 0
    # For metrics (processor.ops.metrics): batches the engine ran, not those the contract check rejected.
    input_tokens: int = 0
    output_tokens: int = 0
    padded_tokens: int = 0
    cache_hits: int = 0
    cache_lookups: int = 0
    cached_prompt_tokens: int = 0
    """Prompt tokens of ok items the engine served from its prefix cache (``Completion.cached_tokens``)."""

    def summary(self) -> str:
        return (
            f"{self.batches} batches, {self.items} items (ok {self.ok}, failed {self.failed}, "
            f"rejected {self.rejected}), {self.dead_lettered} dead-lettered, engine {self.engine_ms} ms"
        )

    def count(self, status: Status) -> None:
        if status == "ok":
            self.ok += 1
        elif status == "failed":
            self.failed += 1
        else:
            self.rejected += 1


@dataclass(frozen=True, slots=True)
class ConsumerHooks:
    """What the app tells its observers (progress display, metrics, tests); each may be None.

    ``on_batch`` is called after each batch is committed, with the stats so far; ``on_engine`` with
    the seconds the engine spent on each batch it ran (the metrics histogram); ``on_completed`` with
    each batch whose completions were delivered and the epoch ms they were made at (end-to-end
    latency from each item's ``produced_ms``).
    """

    on_batch: Callable[[ConsumerStats], None] | None = None
    on_engine: Callable[[float], None] | None = None
    on_completed: Callable[[BatchRecord, int], None] | None = None


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class BatchHandler:
    """Answers each batch message of one consumer: its contract, its engine, its output."""

    def __init__(
        self,
        topics: TopicNames,
        contract: Contract,
        engine: Engine,
        settings: ConsumerSettings,
        output: ConsumerOutput,
        hooks: ConsumerHooks,
    ) -> None:
        self.topics = topics
        self.contract = contract
        self.engine = engine
        self.settings = settings
        self.output = output
        self.hooks = hooks
        self.batch_topic = topics.batches(contract.consumer)
        self.stats = ConsumerStats()

    def handle(self, msg: Message) -> None:
        """Process one batch message up to durable completions (the caller commits)."""
        self.stats.batches += 1
        try:
            batch = decode_batch(msg.value())
        except DecodeError as exc:
            self._dead_letter(msg, exc)
            return
        if not batch.items:
            log.warning("batch %s has no items: nothing to answer", batch.batch_id)
            return
        violation = contract_violation(self.contract, checked_view(batch))
        engine_ms = 0
        if violation is not None:
            log.warning("batch %s rejected: %s", batch.batch_id, violation)
            results = [
                ItemResult(i.item_id, "rejected", b"", 0, f"contract: {violation}", False)
                for i in batch.items
            ]
        else:
            started = time.perf_counter()
            results = self._run_engine(batch)
            engine_s = time.perf_counter() - started
            engine_ms = round(engine_s * 1000)
            self._count_engine(batch, results, engine_s)
        completed_ms = now_ms()
        records = [
            item_completion(batch, item, result, engine_ms, completed_ms, batch.attempt(i))
            for i, (item, result) in enumerate(zip(batch.items, results, strict=True))
        ]
        self._write_completions(batch.batch_id, records)
        for rec in records:
            self.stats.count(rec.status)
        self.stats.items += len(batch.items)
        self.stats.engine_ms += engine_ms
        self.output.flush(f"completions of batch {batch.batch_id}")
        if self.hooks.on_completed is not None:
            self.hooks.on_completed(batch, completed_ms)
        log.debug("batch %s: %d items, %d ms", batch.batch_id, len(batch.items), engine_ms)

    def _write_completions(self, batch_id: str, records: list[CompletionRecord]) -> None:
        """One batch's completions, in the app's form: a CompletionBatch (key ``batch_id``) or one
        Completion per item (key ``item_id``). Either way they are produced, not yet flushed."""
        results = self.topics.results
        if self.settings.completions == "item":
            for rec in records:
                self.output.produce(results, rec.item_id.encode("utf-8"), encode_completion(rec))
            return
        key = batch_id.encode("utf-8")
        schema_id = self.settings.results_schema_id
        for value in encode_completion_batches(
            CompletionBatchRecord.of(records), self.settings.max_completion_bytes
        ):
            if schema_id is not None:  # --completions registry: the Confluent wire format
                value = frame_single_object(schema_id, value)
            self.output.produce(results, key, value)

    def _run_engine(self, batch: BatchRecord) -> list[ItemResult]:
        """The engine's results, or every item failed with why (see processor.engines)."""
        try:
            results = self.engine.run(engine_view(batch))
        except Exception as exc:  # the engine contract: raising fails the whole batch, not the app
            log.warning(
                "batch %s failed in engine %s: %s: %s",
                batch.batch_id,
                self.engine.name,
                type(exc).__name__,
                exc,
            )
            return _all_failed(batch, f"engine error: {type(exc).__name__}: {exc}", retriable_error(exc))
        ids = [getattr(r, "item_id", None) for r in results] if isinstance(results, list) else None
        bad = ids is None or any(not isinstance(r, ItemResult) or r.status not in STATUSES for r in results)
        if bad or ids != [item.item_id for item in batch.items]:
            got = "not a list of ItemResult" if bad else f"{len(results)} results"
            reason = (
                f"engine-contract: {self.engine.name} returned {got} for {len(batch.items)} items "
                "(wanted one per item, same order, status ok|failed|rejected)"
            )
            log.warning("batch %s: %s", batch.batch_id, reason)
            return _all_failed(batch, reason)
        return results

    def _count_engine(self, batch: BatchRecord, results: list[ItemResult], engine_s: float) -> None:
        st = self.stats
        st.input_tokens += sum(item.token_count for item in batch.items)
        st.output_tokens += sum(r.output_tokens for r in results if r.status == "ok")
        st.padded_tokens += batch.padded_length * len(batch.items)
        st.cache_lookups += 1
        st.cache_hits += any(r.cache_hit for r in results)
        for item, r in zip(batch.items, results, strict=True):
            if r.status == "ok":
                st.cached_prompt_tokens += prompt_split(item.token_count, r.cached_tokens)[0]
        if self.hooks.on_engine is not None:
            self.hooks.on_engine(engine_s)

    def _dead_letter(self, msg: Message, exc: DecodeError) -> None:
        log.warning(
            "%s[%d]@%d: undecodable batch (%s: %s): dead-lettered",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            exc.reason,
            exc,
        )
        topic, partition, offset = msg.topic() or self.batch_topic, msg.partition() or 0, msg.offset() or 0
        rec = dead_letter_of(msg, exc.reason, str(exc), topic, partition, offset)
        self.output.produce(self.topics.dead_letter, msg.key(), encode_dead_letter(rec))
        self.output.flush("dead letter")
        self.stats.dead_lettered += 1


def _all_failed(batch: BatchRecord, reason: str, retriable: bool = False) -> list[ItemResult]:
    return [ItemResult(item.item_id, "failed", b"", 0, reason, False, 0, retriable) for item in batch.items]


def item_completion(
    batch: BatchRecord,
    item: TokenItemRecord,
    result: ItemResult,
    engine_ms: int,
    completed_ms: int,
    attempt: int = 1,
) -> CompletionRecord:
    """``item``'s completion from its engine result. ``cached_tokens`` is the engine's count held to
    the prompt (``prompt_split``; 0 unless ok); ``cache_hit`` is ``cached_tokens > 0``, or the engine's
    own flag when it counts no tokens. ``attempt`` is the item's in the batch (``Batch.attempts``):
    the completion answers that attempt, so readers keep the last one's (docs/jobs.md)."""
    ok = result.status == "ok"
    produced_ms = item.produced_ms
    queued = batch.created_ms - produced_ms if 0 < produced_ms <= batch.created_ms else 0
    cached = prompt_split(item.token_count, result.cached_tokens)[0] if ok else 0
    return CompletionRecord(
        item_id=item.item_id,
        job_id=item.job_id,
        batch_id=batch.batch_id,
        consumer=batch.consumer,
        model=batch.model,
        status=result.status,
        reason=None if ok else (result.reason or result.status),
        input_tokens=item.token_count,
        output_tokens=result.output_tokens if ok else 0,
        padded_tokens=batch.padded_length,
        output=result.output if ok else b"",
        queued_ms=queued,
        engine_ms=engine_ms,
        completed_ms=completed_ms,
        cached_tokens=cached,
        cache_hit=result.cache_hit or cached > 0,
        retriable=result.retriable and result.status == "failed",
        attempt=attempt,
    )
