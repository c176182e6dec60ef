"""The processor's per-item CPU on its hot path, without Kafka: what a loop-thread change saves.

    python benchmarks/bench_hotpath.py                       # 100 and 1,000 tokens, 50,000 items
    python benchmarks/bench_hotpath.py --items 5000 --reps 1 # smoke
    python benchmarks/bench_hotpath.py --profile             # cProfile call counts per item too

The pipeline benchmark's ratios swing with the machine's load; this one times the loop thread's own
work on a fixed input by CPU time (``time.thread_time``), so two commits compare on a busy machine.
Per item it runs what the exactly-once processor runs per ingest message and per answer:

* **intake**: ``Intake.item`` on a ready consumed message (the head's decode, the dedupe window,
  the ``IngestItem``, the lane log told of it), in poll batches of ``--poll`` messages as the
  service's loop takes them;
* **changelog**: the exactly-once lane log's ``changes()`` after each poll's items (a commit per
  poll: the waiting set's bits and the attempt records; the seen ids' records are not in it);
* **encode**: ``encode_batch`` of those items in batches of ``--batch`` (each message spliced in);
* **completions**: ``decode_completions_head`` of a ``CompletionBatch`` answering ``--batch`` items
  (each item's outcome: the current schema, with cached tokens, retriable and attempt).

Each figure is the median of ``--reps`` repetitions, in CPU microseconds per item.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_codec import sample_item

from processor.apps.intake import Intake
from processor.apps.observe import ServiceCounters
from processor.core.item import Batch
from processor.kafka.topics import TopicNames
from processor.state.changelog_writer import ChangelogWriter
from processor.state.dedupe import WindowDedupe
from processor.state.durability import CommitClients
from processor.state.modes import ExactlyOnceOptions, exactly_once
from processor.wire.completion_heads import decode_completions_head
from processor.wire.completions import encode_completion_batch
from processor.wire.items import encode_batch, encode_token_item
from processor.wire.records import CompletionBatchRecord, ItemOutcomeRecord


class Message:
    """A consumed message as the intake reads it (confluent_kafka.Message's methods it calls)."""

    __slots__ = ("_offset", "_value")

    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def topic(self) -> str:
        return "ingest"


def messages(tokens: int, items: int, rng: random.Random) -> list[Message]:
    base = sample_item(tokens, rng)  # one token list; distinct ids (no repeats in the window)
    return [Message(encode_token_item(replace(base, item_id=f"item-{i:09d}")), i) for i in range(items)]


def take(intake: Intake, batch: list[Message]) -> list[Any]:
    """What the service's loop calls on a poll's messages."""
    if hasattr(intake, "items"):
        return intake.items(batch, 1)
    return [item for item in (intake.item(msg, 1) for msg in batch) if item is not None]  # before


def intake_of(items: int) -> Intake:
    """A fresh exactly-once intake with a 10-minute window, its table sized for ``items`` ids as a
    long-running processor's is (growing it is rare in a steady state: buckets expire as they fill)."""
    options = ExactlyOnceOptions(lambda _b: False, lambda _b: [], eager_ms=0, dedupe_window_ms=600_000)
    clients = CommitClients(None, None, None)  # type: ignore[arg-type]  # nothing commits here
    mode = exactly_once(clients, TopicNames(), "bench", 100, options)
    assert isinstance(mode.dedupe, WindowDedupe)
    mode.dedupe.seen._of(0)._reserve(items)
    return Intake(None, mode, TopicNames(), ServiceCounters(), 600_000)  # type: ignore[arg-type]


def run_intake(intake: Intake, msgs: list[Message], poll: int) -> None:
    """The service loop's intake of ``msgs``, in polls of ``poll`` messages."""
    for start in range(0, len(msgs), poll):
        batch = msgs[start : start + poll]
        assert len(take(intake, batch)) == len(batch)


def completions(tokens: int, items: int, per_batch: int, rng: random.Random) -> list[bytes]:
    out = []
    for b in range(0, items, per_batch):
        outcomes = [
            ItemOutcomeRecord(
                item_id=f"item-{b + i:09d}",
                status="ok",
                cached_tokens=tokens // 2,
                input_tokens=tokens,
                output_tokens=16,
                queued_ms=rng.randrange(1, 5_000),
            )
            for i in range(per_batch)
        ]
        rec = CompletionBatchRecord(
            batch_id=f"b-{b}", consumer="gpu-0", model="m", completed_ms=1, items=outcomes
        )
        out.append(encode_completion_batch(rec))
    return out


def changelog_run_of(msgs: list[Message], poll: int) -> Callable[[], None]:
    """A commit's changelog records of one run's items: taken in (untimed), then ``changes()``
    once per poll (the waiting set's bits and attempt records), as a commit per poll would."""
    intake = intake_of(len(msgs))
    polls = [take(intake, msgs[s : s + poll]) for s in range(0, len(msgs), poll)]
    writer = intake.mode.lane_log
    assert isinstance(writer, ChangelogWriter)
    writer.reset()  # the intake told it of every item: start from nothing pending (nor seen ids)

    def run() -> None:
        for items in polls:
            writer.requeued("", items)  # told of a poll's items again, as the intake tells it
            writer.changes()

    return run


def batches(msgs: list[Message], per_batch: int) -> list[Batch]:
    """The batches a dispatch makes of the intake's items (their payload: the input message)."""
    items = take(intake_of(len(msgs)), msgs)
    return [
        Batch(f"b-{b}", "gpu-0", it[0].model, it[0].shape, 0, 8, it[0].length, list(it), 1)
        for b in range(0, len(items), per_batch)
        for it in [items[b : b + per_batch]]
    ]


def run_encode(out: list[Batch]) -> None:
    for batch in out:
        encode_batch(batch)


def run_completions(values: list[bytes]) -> None:
    for value in values:
        decode_completions_head(value)


def cpu_us_per_item(setup: Callable[[], Callable[[], None]], items: int, reps: int) -> float:
    """Median over ``reps`` of the thread's CPU time for one run of what ``setup`` returns (untimed)."""
    times = []
    for _ in range(reps):
        fn = setup()
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times) * 1e6 / items


def calls_per_item(setup: Callable[[], Callable[[], None]], items: int) -> float:
    fn = setup()
    prof = cProfile.Profile()
    prof.runcall(fn)
    stats = pstats.Stats(prof)
    return stats.total_calls / items  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000", help="tokens per item, comma-separated")
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--poll", type=int, default=500, help="messages per ingest poll")
    ap.add_argument("--batch", type=int, default=32, help="items a CompletionBatch answers")
    ap.add_argument("--profile", action="store_true", help="also Python calls per item (cProfile)")
    args = ap.parse_args()
    rng = random.Random(36)
    print(
        "tokens | intake CPU us/item | changelog CPU us/item | encode CPU us/item | completions CPU us/item"
        + (" | intake calls | changelog calls | encode calls | completion calls" if args.profile else "")
    )
    for tokens in (int(s) for s in args.sizes.split(",")):
        msgs = messages(tokens, args.items, rng)
        values = completions(tokens, args.items, args.batch, rng)
        made = batches(msgs, args.batch)

        def intake_run(msgs: list[Message] = msgs) -> Callable[[], None]:
            intake = intake_of(len(msgs))
            return lambda: run_intake(intake, msgs, args.poll)

        def encode_run(out: list[Batch] = made) -> Callable[[], None]:
            return lambda: run_encode(out)

        def changelog_run(msgs: list[Message] = msgs) -> Callable[[], None]:
            return changelog_run_of(msgs, args.poll)

        def completions_run(values: list[bytes] = values) -> Callable[[], None]:
            return lambda: run_completions(values)

        intake = cpu_us_per_item(intake_run, args.items, args.reps)
        done = cpu_us_per_item(completions_run, args.items, args.reps)
        enc = cpu_us_per_item(encode_run, args.items, args.reps)
        log = cpu_us_per_item(changelog_run, args.items, args.reps)
        row = f"{tokens:>6} | {intake:>18.2f} | {log:>20.2f} | {enc:>17.2f} | {done:>23.2f}"
        if args.profile:
            ic = calls_per_item(intake_run, args.items)
            lc = calls_per_item(changelog_run, args.items)
            ec = calls_per_item(encode_run, args.items)
            cc = calls_per_item(completions_run, args.items)
            row += f" | {ic:>12.1f} | {lc:>15.1f} | {ec:>12.1f} | {cc:>16.1f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
