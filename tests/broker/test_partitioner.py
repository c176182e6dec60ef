"""tokenfabric's producers partition the ingest topic as the Java client does: murmur2 of the key.

A shape must live in one partition whichever client wrote its items (docs/producers.md), so the
reference here is Java's ``Utils.murmur2`` with its own test vectors, and every item the project's
producer wrote is read back from the partition that reference names.
"""

from __future__ import annotations

from collections import Counter

import pytest

from processor.apps.producer import TokenProducer, shape_key, synthetic_tokens
from processor.kafka.reader import read_topic
from tests.broker.rig import new_topics

pytestmark = pytest.mark.kafka

PARTITIONS = 6


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (signed 32-bit), as the Java producer partitions by it."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & mask
        k = ((k ^ (k >> 24)) * m) & mask
        h = ((h * m) & mask) ^ k
    tail, rest = length & ~3, length % 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h = ((h ^ data[tail]) * m) & mask
    h = ((h ^ (h >> 13)) * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_the_reference_is_javas_murmur2() -> None:
    # org.apache.kafka.common.utils.UtilsTest.testMurmur2
    vectors = {
        "21": -973932308,
        "foobar": -790332482,
        "a-little-bit-long-string": -985981536,
        "a-little-bit-longer-string": -1486304829,
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        "abc": 479470107,
    }
    assert {text: murmur2(text.encode()) for text in vectors} == vectors


def test_every_item_lands_in_the_partition_java_would_choose(kafka_bootstrap: str) -> None:
    conf, topics = new_topics(kafka_bootstrap, "m", [], ingest_partitions=PARTITIONS)
    shapes = [0x9E3779B97F4A7C15 * (i + 1) & (1 << 64) - 1 for i in range(40)]
    with TokenProducer(conf, topics) as producer:
        for i, shape in enumerate(shapes):
            producer.send(f"item-{i}", "m", synthetic_tokens(f"item-{i}", 16), shape=shape)
    placed = {msg.key(): msg.partition() for msg in read_topic(conf, topics.ingest)}
    assert len(placed) == len(shapes)
    assert placed == {shape_key(s): java_partition(shape_key(s), PARTITIONS) for s in shapes}
    assert len(Counter(placed.values())) > 1  # the keys spread: a constant partition would pass too
