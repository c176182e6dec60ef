"""The dedupe window's cost: bytes per remembered item id, restore speed, and the hot-path check.

    python benchmarks/bench_dedupe.py                         # 10,000,000 ids in one partition
    python benchmarks/bench_dedupe.py --smoke                 # 20,000 ids
    python benchmarks/bench_dedupe.py --bootstrap HOST:PORT   # restore read from Kafka too

What a processor remembers per ingest partition (``processor/state/seen.py``) is made the way the
processor makes it: ``--ids`` distinct ids go through ``SeenBook.first`` across 64 buckets of the
window, one flush per commit of ``--per-commit`` ids, and the flushes' records (segments, merges,
tombstones) are kept in log order. Then:

* **bytes per id**: a fresh ``SeenBook`` loads those records under ``tracemalloc``; what it still
  holds afterwards (table, tags, buckets), divided by the ids. The table is at most 3/4 full and
  grows by half, so between growths this moves between about 12 and 18 bytes, plus a little.
* **restore**: the records folded by ``ChangelogState.apply`` (as restore reads the changelog) and
  loaded into a ``SeenBook``, timed without tracemalloc; ids/s of wall-clock and of CPU time (the
  process's, librdkafka's threads included: on a shared machine the wall clock also counts waits).
  With ``--bootstrap`` the records are also written to a fresh compacted topic and read back with
  restore's reader (``read_topic``), and that whole read, fold and load is timed too.
* **hot path**: ``SeenBook.first_at``'s check of an id (new, and repeated) beside ``decode_item_head`` of a
  100-token item, the processor's per-message decode: the ratio is the cost dedupe adds per item.
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import delete_topics, write_json

from processor.state.changelog import ChangelogState
from processor.state.seen import SeenBook
from processor.wire.heads import decode_item_head
from processor.wire.items import encode_token_item
from processor.wire.records import new_token_item

WINDOW_MS = 7 * 24 * 3600 * 1000
T0 = 1_800_000_000_000


def remembered(ids: int, per_commit: int) -> tuple[SeenBook, list[tuple[int, bytes, bytes | None]]]:
    """``ids`` ids taken over 63 buckets of the window, flushed every ``per_commit``."""
    book = SeenBook(WINDOW_MS)
    records: list[tuple[int, bytes, bytes | None]] = []
    span = WINDOW_MS * 63 // 64
    for start in range(0, ids, per_commit):
        now = T0 + span * start // ids
        for i in range(start, min(ids, start + per_commit)):
            book.first(0, f"job-7:item-{i:010d}", now)
        records += book.flush(now)
    return book, records


def fold_and_load(records: list[tuple[int, bytes, bytes | None]]) -> SeenBook:
    state = ChangelogState()
    for partition, key, value in records:
        state.apply(key, value, partition)
    book = SeenBook(WINDOW_MS)
    book.load(state.seen)
    return book


def per_call_us(fn: object, args: list[object], reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        for a in args:
            fn(a)  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best / len(args) * 1e6


def hot_path(n: int) -> dict[str, float]:
    item = new_token_item("job-7:item-0000000001", "default", list(range(100)), 0, shape_components=["x"])
    message = encode_token_item(item)
    decode_us = per_call_us(decode_item_head, [message] * n)
    book = SeenBook(WINDOW_MS)
    ids = [f"job-7:item-{i:010d}" for i in range(n)]
    first = book.first_at(T0)  # as the processor's intake checks a poll's ids
    started = time.perf_counter()
    for i in ids:
        first(0, i)
    new_us = (time.perf_counter() - started) / n * 1e6
    repeat_us = per_call_us(lambda i: first(0, i), list(ids))
    return {
        "decode_item_head_us": decode_us,
        "first_new_us": new_us,
        "first_repeat_us": repeat_us,
        "new_over_decode": new_us / decode_us,
        "repeat_over_decode": repeat_us / decode_us,
    }


def through_kafka(bootstrap: str, records: list[tuple[int, bytes, bytes | None]]) -> dict[str, float]:
    from confluent_kafka import Producer

    from processor.kafka.reader import read_topic
    from processor.kafka.topics import COMPACTED, TopicSpec, create_topics

    conf = {"bootstrap.servers": bootstrap}
    topic = f"bench-dedupe-{uuid.uuid4().hex[:8]}.lanes-changelog"
    create_topics(conf, [TopicSpec(topic, 1, COMPACTED)])
    try:
        producer = Producer({**conf, "linger.ms": "20", "message.max.bytes": str(2 << 20)})
        for partition, key, value in records:
            while True:
                try:
                    producer.produce(topic, value, key, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush(120)
        started, cpu = time.perf_counter(), time.process_time()
        state = ChangelogState()
        for msg in read_topic(conf, topic, {0: 0}):
            state.apply(msg.key(), msg.value(), msg.partition())
        read_s = time.perf_counter() - started
        book = SeenBook(WINDOW_MS)
        book.load(state.seen)
        seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        return {
            "kafka_restore_s": seconds,
            "kafka_restore_cpu_s": cpu_s,
            "kafka_read_s": read_s,
            "kafka_ids": len(book),
        }
    finally:
        delete_topics(conf, [topic])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ids", type=int, default=10_000_000)
    p.add_argument("--per-commit", type=int, default=5_000, help="ids taken between two flushes")
    p.add_argument("--smoke", action="store_true", help="20,000 ids")
    p.add_argument("--bootstrap", help="also write the records to Kafka and time restore's read of them")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    ids = 20_000 if args.smoke else args.ids

    started = time.perf_counter()
    built, records = remembered(ids, args.per_commit)
    build_s = time.perf_counter() - started
    live = ChangelogState()
    for partition, key, value in records:
        live.apply(key, value, partition)
    record_bytes = sum(len(v) for v in live.seen.values())

    started, cpu = time.perf_counter(), time.process_time()
    book = fold_and_load(records)
    restore_s, restore_cpu_s = time.perf_counter() - started, time.process_time() - cpu
    assert len(book) == len(built) == ids, (len(book), len(built), ids)
    del book

    state = ChangelogState()
    for partition, key, value in records:
        state.apply(key, value, partition)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    book = SeenBook(WINDOW_MS)
    book.load(state.seen)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    slots = sum(s.slots for s in book.partitions.values())
    del book, state

    out: dict[str, float | int | str] = {
        "ids": ids,
        "records_written": len(records),
        "records_live": len(live.seen),
        "changelog_bytes_per_id": record_bytes / ids,
        "bytes_per_id": held / ids,
        "table_fill": ids / slots,
        "build_ids_per_s": ids / build_s,
        "restore_s": restore_s,
        "restore_ids_per_s": ids / restore_s,
        "restore_cpu_s": restore_cpu_s,
        "restore_ids_per_cpu_s": ids / restore_cpu_s,
    }
    out.update(hot_path(min(ids, 200_000)))
    if args.bootstrap:
        out.update(through_kafka(args.bootstrap, records))
        out["kafka_restore_ids_per_s"] = ids / float(out["kafka_restore_s"])
    for key, value in out.items():
        print(f"{key:28} {value:,.3f}" if isinstance(value, float) else f"{key:28} {value:,}")
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
