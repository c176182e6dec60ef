"""The producer library: put TokenItems on the ingest topic, keyed so that a shape lives in one partition.

Why the key is the shape signature (8 bytes big-endian): the processor scales out by ingest partition
and batches never mix shapes, so every item of a shape must reach the same processor instance. The
partitioner hashes the key, which gives exactly that, and it is murmur2 (``murmur2_random``), the
Java client's default, not librdkafka's CRC32: a shape's items then land in one partition whichever
client wrote them (docs/producers.md, "Use one partitioner for every producer").

Delivery is asynchronous: :meth:`TokenProducer.send` only queues. Failures surface in the delivery
callback, are counted, and :meth:`TokenProducer.flush` raises :class:`ProduceError` when any happened,
so a caller that flushes before reporting success never reports a lost item as sent.

Settings, and why:

* ``enable.idempotence=true``, ``acks=all``: a retried send is neither lost nor duplicated, and
  per-partition order is kept.
* ``linger.ms=5``, ``batch.size=1 MiB``: items are a few KiB to a few hundred KiB; a 5 ms linger fills
  large requests without adding visible latency.
* ``compression.type=none``: lz4 was measured on the synthetic (uniformly random) token ids and did
  not pay for itself (0.4% fewer bytes, 13% fewer tokens/s; numbers next to ``DEFAULT_COMPRESSION``).
  zstd saves 39% of the bytes at ~40% of the throughput: worth it on a thin network link, which a
  deployment can choose in its ``--kafka-config`` file (those settings override these defaults).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import xxhash
from confluent_kafka import KafkaError, KafkaException, Message

from processor.core.signature import shape_signature
from processor.kafka.factory import KAFKA, ClientFactory
from processor.kafka.topics import TopicNames
from processor.wire.items import encode_token_item
from processor.wire.records import TokenItemRecord
from processor.wire.request import GenerationRequest

# Measured on the local broker (2-core machine, broker on the same host): the first 3000 items of
# mooncake_conversation (40.5 M tokens) with synthetic tokens (17-bit ids as little-endian uint32),
# three runs each. Log-segment bytes: none 162.4 MB, lz4 161.7 MB (-0.4%: LZ matching finds no
# repeats in random ids), zstd 99.5 MB (-39%). Throughput: none 51-59 M tokens/s, lz4 44-49 (-13%),
# zstd 33. lz4 does not pay for itself, so compression is off by default.
DEFAULT_COMPRESSION = "none"

PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    "linger.ms": "5",
    "batch.size": str(1 << 20),
    "compression.type": DEFAULT_COMPRESSION,
    # Java's partitioner (murmur2 of the key), so producers in other languages agree on partitions.
    "partitioner": "murmur2_random",
    # The ingest topic accepts 64 MiB messages (topics.RETAINED); a very long prompt must not be
    # refused client-side at librdkafka's 1 MB default.
    "message.max.bytes": str(64 << 20),
}


#: Largest token id :func:`synthetic_tokens` emits, exclusive (a 17-bit vocabulary, Llama-3 sized).
SYNTHETIC_VOCAB = 1 << 17

_BLOCK_TOKENS = 1 << 20  # 4 MiB of token ids, built once

_BLOCK_SEED = 0x70CE4FAB


class ProduceError(RuntimeError):
    """One or more messages were not delivered; the message says how many and the first error."""


class MissingTopicError(ProduceError):
    """The ingest topic does not exist (a setup problem: the message says how to create it)."""


def shape_key(shape: int) -> bytes:
    """The Kafka key of an item of ``shape``: the unsigned signature as 8 bytes big-endian."""
    return shape.to_bytes(8, "big")


def _random_block() -> bytes:
    """``_BLOCK_TOKENS`` random token ids below ``SYNTHETIC_VOCAB``, doubled so any window is one slice.

    Masking the whole block as one big integer is ~100x faster than packing ids one by one.
    """
    raw = random.Random(_BLOCK_SEED).randbytes(4 * _BLOCK_TOKENS)
    mask = (SYNTHETIC_VOCAB - 1).to_bytes(4, "little") * _BLOCK_TOKENS
    block = (int.from_bytes(raw, "little") & int.from_bytes(mask, "little")).to_bytes(len(raw), "little")
    return block + block


_block: bytes | None = None

_block_lock = threading.Lock()


def _get_block() -> bytes:
    global _block
    if _block is None:
        with _block_lock:
            if _block is None:
                _block = _random_block()
    return _block


def synthetic_tokens(item_id: str, length: int) -> bytes:
    """``length`` deterministic token ids for ``item_id``, packed as the ``tokens`` field expects.

    A window of a precomputed random block at an offset derived from XXH3 of the id: the same id
    always gets the same tokens, different ids get different ones, and the cost is one memcpy (the
    first call builds the block, ~0.1 s). Longer than the block (1 Mi tokens) repeats it.
    """
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    block = _get_block()
    start = 4 * (xxhash.xxh3_64_intdigest(item_id.encode("utf-8")) % _BLOCK_TOKENS)
    size = 4 * length
    if length <= _BLOCK_TOKENS:
        return block[start : start + size]
    whole, rest = divmod(length, _BLOCK_TOKENS)
    window = block[start : start + 4 * _BLOCK_TOKENS]
    return window * whole + window[: 4 * rest]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TokenProducer:
    """Sends TokenItems to ``topics.ingest``. Not thread-safe: use one per thread.

    ``conf`` is a :func:`processor.kafka.config.client_config` dict; its keys override
    :data:`PRODUCER_DEFAULTS`. Use as a context manager, or call :meth:`close`, so the queue is
    flushed and failures are raised.
    """

    def __init__(
        self,
        conf: Mapping[str, str],
        topics: TopicNames | None = None,
        key_of: Callable[[TokenItemRecord], bytes] | None = None,
        clients: ClientFactory = KAFKA,
    ) -> None:
        """``key_of``: the Kafka key of a record; :func:`shape_key` of its shape unless given (the plain
        queue baseline keys by item id, to spread items evenly, processor.apps.plainqueue)."""
        self.key_of = key_of or (lambda rec: shape_key(rec.shape))
        self.topics = topics or TopicNames()
        self.topic = self.topics.ingest
        self._producer = clients.producer({**PRODUCER_DEFAULTS, **conf})
        self.sent = 0
        self.sent_tokens = 0
        self.delivered = 0
        self.failed = 0
        self._unreported = 0
        self._first_error: str | None = None

    # -- sending --------------------------------------------------------------------------------

    def send(
        self,
        item_id: str,
        model: str,
        tokens: bytes,
        *,
        shape: int | None = None,
        components: Sequence[str] | None = None,
        job_id: str = "",
        output_budget: int | None = None,
        metadata: Mapping[str, str] | None = None,
        produced_ms: int | None = None,
        request: GenerationRequest | None = None,
    ) -> int:
        """Queue one item; returns its shape signature.

        ``tokens`` is packed little-endian uint32 (:func:`processor.wire.records.tokens_from_ids` or
        :func:`synthetic_tokens`). ``shape`` wins over ``components``; with neither the shape is the
        signature of no components. ``request`` is what the item asks of the model (per-item sampling
        settings, structured output, a LoRA adapter: docs/producers.md); None leaves it all to the
        consumer. Raises ``ValueError`` for an item the processor would refuse.
        """
        if len(tokens) % 4:
            raise ValueError(f"item {item_id!r}: {len(tokens)} token bytes is not a multiple of 4")
        if shape is None:
            shape = shape_signature(components or ())
        rec = TokenItemRecord(
            item_id=item_id,
            job_id=job_id,
            model=model,
            shape=shape,
            token_count=len(tokens) // 4,
            tokens=tokens,
            shape_components=None if components is None else tuple(components),
            produced_ms=_now_ms() if produced_ms is None else produced_ms,
            output_budget=output_budget,
            metadata=None if metadata is None else dict(metadata),
            request=request,
        )
        self.send_record(rec)
        return shape

    def send_record(self, rec: TokenItemRecord) -> None:
        """Queue an already built record (keyed by its shape)."""
        value = encode_token_item(rec)
        key = self.key_of(rec)
        while True:
            try:
                self._producer.produce(self.topic, value, key, on_delivery=self._on_delivery)
                break
            except BufferError:
                # The local queue is full: serve delivery reports until room frees up.
                self._producer.poll(0.05)
        self._producer.poll(0)
        self.sent += 1
        self.sent_tokens += rec.token_count

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.delivered += 1
            return
        self.failed += 1
        self._unreported += 1
        if self._first_error is None:
            self._first_error = f"{err.str()} (topic {msg.topic()})"

    # -- draining -------------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks; returns how many were served."""
        return int(self._producer.poll(timeout))

    def flush(self, timeout: float = 30.0) -> int:
        """Wait up to ``timeout`` s for delivery; returns how many messages are still queued.

        Raises :class:`ProduceError` if a delivery failed since the last flush that raised.
        """
        remaining = int(self._producer.flush(timeout))
        if self._unreported:
            count, first = self._unreported, self._first_error
            self._unreported, self._first_error = 0, None
            raise ProduceError(
                f"{count} of {self.sent} messages to {self.topic} were not delivered; first error: {first}"
            )
        return remaining

    def check_topic(self, timeout: float = 10.0) -> None:
        """Fail fast, with a fix, when the ingest topic does not exist or the cluster is unreachable.

        Without it a missing topic costs ``message.timeout.ms`` (5 minutes) per message.
        """
        meta = self._producer.list_topics(self.topic, timeout=timeout)
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None:
            code = None if topic is None or topic.error is None else topic.error.code()
            if topic is None or code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise MissingTopicError(
                    f"topic {self.topic} does not exist: create it with 'tokenfabric topics create"
                    f" --topic-prefix {self.topics.prefix}'"
                )
            raise KafkaException(topic.error)

    def close(self, timeout: float = 30.0) -> None:
        """Flush; raises like :meth:`flush`, and :class:`ProduceError` if messages are left queued."""
        remaining = self.flush(timeout)
        if remaining:
            raise ProduceError(f"{remaining} messages to {self.topic} still queued after {timeout:g} s")

    def __enter__(self) -> TokenProducer:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            # Already failing: deliver what we can, but do not mask the original exception.
            self._producer.flush(5.0)
