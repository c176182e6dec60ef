"""The processor's whole loop per batch against the number of consumer contracts: 1 to 256 cards.

    python benchmarks/bench_consumers_pipeline.py                 # 1, 4, 16, 64, 256 consumers
    python benchmarks/bench_consumers_pipeline.py --consumers 1 256 --batches 2000 --json OUT.json
    python benchmarks/bench_consumers_pipeline.py --smoke         # small, for CI: the figures exist

bench_consumers.py times the core alone; this one runs a real :class:`ProcessorService` (exactly-once,
its defaults) over the in-memory Kafka (processor.kafka.memory), so what a consumer adds outside the
core is in the figure too: reading its contract and completions (the control plane), its credits,
its batch topic, the batch's encoding and produce, the transaction that carries it. No broker: a
broker's own work does not grow with contracts that are not written to, and on this 2-core machine
a real one would share the cores (docs/benchmarks.md, "Noise"); the real broker's loop is
bench_pipeline.py's.

A busy fleet, as in bench_consumers.py: every consumer holds its 2 batches; each round the oldest
batch is answered with its completions (one message on the results topic, as a consumer app writes
it) and the loop steps once, past its commit interval, so the step reads the completion, frees the
slot, dispatches the one batch that fits, and commits; the answered batch's items are produced again
(untimed), so each step reads one batch's worth. Per batch and per item (how full the lanes make a
batch moves a little with the fleet; the loop's work is mostly per item): CPU microseconds of the
steps (``time.process_time``, noisy on a shared machine) and Python calls (cProfile's count, which
the machine's load does not move), the commit apart, per commit. Flat from 1 to 256 consumers means
a busy consumer costs the loop nothing; the commit's ledger check and checkpoint visit every
consumer once an interval (200 ms by default), whatever the number of batches.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import all_ok, consumer_sweep_args, write_json

from processor.apps.service import ProcessorService
from processor.apps.settings import ProcessorSettings
from processor.core.contract import Contract
from processor.kafka.memory import MemoryKafka
from processor.kafka.topics import TopicNames, topic_specs
from processor.wire.completions import encode_completion_batch
from processor.wire.control import encode_contract
from processor.wire.items import decode_batch, encode_token_item
from processor.wire.records import (
    BatchRecord,
    ContractRecord,
    new_token_item,
)

MODEL = "m"
SHAPES = 8
MAX_INFLIGHT = 2
#: Items waiting when the rounds begin, beside those the fleet holds; each answered batch's items are
#: produced again (untimed), so that every round's step reads one batch's worth and can dispatch one.
WAITING = 4_000
MAX_ITEMS = 16
STEP_S = 0.25  # the clock moves this much a round: past the 200 ms commit interval


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Fleet:
    """One processor and ``consumers`` busy cards over the in-memory Kafka."""

    def __init__(self, consumers: int) -> None:
        self.mk = MemoryKafka()
        self.topics = TopicNames("bench")
        self.cards = [f"gpu-{n:03d}" for n in range(consumers)]
        self.mk.create_topics(topic_specs(self.topics, ingest_partitions=1, consumers=tuple(self.cards)))
        self.producer = self.mk.clients().producer({})
        self.read = dict.fromkeys(self.cards, 0)  # batches read from each card's topic
        self.next_id = 0
        for card in self.cards:
            c = Contract(
                card,
                MODEL,
                budget_tokens=4_096,
                max_items=MAX_ITEMS,
                pad_multiple=8,
                max_inflight=MAX_INFLIGHT,
            )
            self._send(self.topics.contracts, encode_contract(ContractRecord(c, 0)), card.encode())
        self.clock = Clock()
        settings = ProcessorSettings(instance="p0", group_id=self.topics.processor_group)
        self.svc = ProcessorService(
            {},
            self.topics,
            settings,
            clock=self.clock,
            clients=self.mk.clients(),
            wall_ms=lambda: 1_700_000_000_000,
        )
        self.svc.start()

    def _send(self, topic: str, value: bytes, key: bytes) -> None:
        self.producer.produce(topic, value, key, partition=0)
        self.producer.flush()

    def produce(self, n: int) -> None:
        """``n`` more items on the ingest topic (untimed: the producers' side)."""
        for k in range(self.next_id, self.next_id + n):
            rec = new_token_item(f"i{k}", MODEL, range(100 + k % 157), 0, shape_components=[f"s{k % SHAPES}"])
            self.producer.produce(
                self.topics.ingest, encode_token_item(rec), rec.item_id.encode(), partition=0
            )
        self.producer.flush()
        self.next_id += n

    def new_batches(self) -> list[BatchRecord]:
        """The batches committed since the last call, card by card (untimed: the consumers' side)."""
        out = []
        for card in self.cards:
            records = self.mk.records(self.topics.batches(card))
            out += [decode_batch(r.value) for _p, _o, r in records[self.read[card] :]]
            self.read[card] = len(records)
        return out

    def answer(self, batch: BatchRecord) -> None:
        rec = all_ok(batch, batch.consumer, 5)
        self._send(self.topics.results, encode_completion_batch(rec), batch.batch_id.encode())

    def step(self) -> None:
        self.clock.t += STEP_S
        self.svc.step()


class Meter:
    """CPU seconds, or Python calls (``profiled``: cProfile's overhead would swell the CPU figure),
    of one part of the loop, between its ``start`` and ``stop`` calls."""

    def __init__(self, profiled: bool) -> None:
        self.cpu_s = 0.0
        self.profile = cProfile.Profile() if profiled else None

    def start(self) -> None:
        self.cpu_s -= time.process_time()
        if self.profile is not None:
            self.profile.enable()

    def stop(self) -> None:
        if self.profile is not None:
            self.profile.disable()
        self.cpu_s += time.process_time()

    def per(self, n: int) -> float:
        """CPU microseconds, or calls, per one of ``n``."""
        if self.profile is not None:
            return int(pstats.Stats(self.profile).total_calls) / n  # type: ignore[attr-defined]
        return self.cpu_s * 1e6 / n


def _metered_commit(fleet: Fleet, loop: Meter, commit: Meter) -> None:
    """The service's ``_commit`` metered apart from the rest of the step: it runs once a commit
    interval, not once a batch, and its ledger check and checkpoint visit every consumer. A call
    that finds no commit due counts there too (a few calls)."""
    unmetered = fleet.svc._commit

    def metered(force: bool = False) -> None:
        loop.stop()
        commit.start()
        try:
            unmetered(force)
        finally:
            commit.stop()
            loop.start()

    fleet.svc._commit = metered  # type: ignore[method-assign]


def run(consumers: int, batches: int, profiled: bool) -> dict[str, float]:
    """Per batch, the loop's CPU microseconds (or calls, ``profiled``) without its commits, and per
    commit, the commit's; over ``batches`` rounds of answer-one, step."""
    fleet = Fleet(consumers)
    fleet.produce(WAITING + consumers * MAX_INFLIGHT * MAX_ITEMS)  # every slot filled, a backlog left
    held: deque[BatchRecord] = deque()
    for _ in range(100 * consumers + 1_000):  # every consumer's slots filled, the backlog read (untimed)
        if len(held) == consumers * MAX_INFLIGHT and fleet.svc.counters.consumed == fleet.next_id:
            break
        fleet.step()
        held.extend(fleet.new_batches())
    else:
        raise RuntimeError(f"{consumers} consumers: {len(held)} batches held after the warm-up, not all")
    loop, commit = Meter(profiled), Meter(profiled)
    _metered_commit(fleet, loop, commit)
    made, items, commits_before = 0, 0, fleet.svc.counters.commits
    while made < batches:
        answered = held.popleft()
        fleet.answer(answered)
        fleet.produce(len(answered.items))  # the items it took come again: a steady backlog
        loop.start()
        fleet.step()
        loop.stop()
        out = fleet.new_batches()
        held.extend(out)
        made += len(out)
        items += sum(len(b.items) for b in out)
    fleet.svc.core.check(deep=True)
    commits = max(1, fleet.svc.counters.commits - commits_before)
    unit = "calls" if profiled else "cpu_us"
    return {
        "items_per_batch": items / made,
        f"loop_{unit}_per_batch": loop.per(made),
        f"loop_{unit}_per_item": loop.per(items),
        f"commit_{unit}": commit.per(commits),
    }


def main(argv: list[str] | None = None) -> int:
    args = consumer_sweep_args(__doc__, 2_000, ([1, 16], 100), argv)
    rows = []
    print(
        "| consumers | items/batch | loop: CPU us/batch | loop: calls/batch | loop: calls/item "
        "| commit: CPU us | commit: calls |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.consumers:
        row: dict[str, float] = {"consumers": n, **run(n, args.batches, False), **run(n, args.batches, True)}
        rows.append(row)
        print(
            f"| {n} | {row['items_per_batch']:.1f} | {row['loop_cpu_us_per_batch']:.0f} "
            f"| {row['loop_calls_per_batch']:.0f} | {row['loop_calls_per_item']:.1f} "
            f"| {row['commit_cpu_us']:.0f} | {row['commit_calls']:.0f} |",
            flush=True,
        )
    write_json(args.json, {"batches": args.batches, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
