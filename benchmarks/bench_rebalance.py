"""The fleet through change: rolling restarts, a processor added and removed, a kill during a restore.

    python benchmarks/bench_rebalance.py --json FILE            # 4 processors, 32 consumers, both protocols
    python benchmarks/bench_rebalance.py --smoke --json FILE    # 2 processors, 4 consumers (CI)
    python benchmarks/bench_rebalance.py --protocols consumer --bootstrap HOST:PORT

What is measured is pauses and correctness, not throughput (a 2-core machine). For each group
protocol in turn (``consumer``, KIP-848, then ``classic``), on fresh topics: processors run as real
processes (``tokenfabric processor --group-protocol P``), consumer apps with the sim engine as
threads of this process (light: 32 processes would not fit 2 cores), and a producer feeds items at a
steady rate. Then each event, under load:

- ``processor-rolling-restart``: every processor, one at a time: SIGTERM, restart under the same
  instance id, settle;
- ``consumer-rolling-restart``: every consumer app, one at a time;
- ``processor-added`` and ``processor-removed``: one more processor, then it stops;
- ``kill-during-restore``: a processor joins (its partitions start restoring) and another is
  SIGKILLed a second later; it is started again once the group has settled.

After each event the producer stops, the bench waits for every item to finish and runs the audit
(``audit_clean``). Per event, from the batch topics (each batch says when it was made, by which
instance, and its items, whose ingest partition and produce time the ingest topic gives):

- the gap of a partition: the longest time it had an item waiting and dispatched nothing;
  ``max_gap_unaffected_ms`` over partitions whose owner the event did not touch or move,
  ``max_gap_moved_ms`` over the others;
- ``stable_after_ms``: from the event's last action until every partition dispatched again.

The broker: ``--bootstrap``, else a private one started here (processor/local/broker.py settings: a
1 s consumer-protocol heartbeat and a 6 s minimum session, so ``--session-timeout-ms 6000`` applies
to both protocols).
"""

from __future__ import annotations

import argparse
import bisect
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import load_average, unique, write_json

from processor.apps.consumer import ConsumerApp
from processor.apps.producer import TokenProducer, synthetic_tokens
from processor.apps.settings import ConsumerSettings
from processor.core.contract import Contract
from processor.engines.sim import SimEngine
from processor.kafka.exits import EXIT_TEMPFAIL
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames, create_topics, topic_specs
from processor.local import broker as kafka_local
from processor.local.pipeline import Pipeline, child_env
from processor.ops.audit import audit
from processor.sim.cardmodel import CardSpec
from processor.sim.tracegen import synthetic_records
from processor.wire.heads import decode_item_head
from processor.wire.items import decode_batch


@dataclass(frozen=True)
class Size:
    processors: int
    consumers: int
    partitions: int
    rate_per_s: float
    settle_s: float
    events: tuple[str, ...]


FULL = Size(4, 32, 8, 120.0, 8.0, (
    "processor-rolling-restart", "consumer-rolling-restart", "processor-added", "processor-removed",
    "kill-during-restore",
))  # fmt: skip
SMOKE = Size(2, 4, 4, 60.0, 5.0, ("processor-rolling-restart", "kill-during-restore"))
PROCESSOR_ARGS = (
    "--session-timeout-ms", "6000", "--transaction-timeout-ms", "15000", "--commit-interval-ms", "200",
)  # fmt: skip


@dataclass
class Action:
    """One step of an event: when it began and when the next began (epoch ms), whom it touched."""

    started_ms: int
    touched: frozenset[str]
    ended_ms: int = 0


@dataclass
class Event:
    """An event's actions, one after another, and whether the audit after it was clean."""

    name: str
    actions: list[Action] = field(default_factory=list)
    audit_clean: bool = False

    def act(self, *touched: str) -> None:
        """A new action starts now; the previous one ends."""
        at = now_ms()
        if self.actions:
            self.actions[-1].ended_ms = at
        self.actions.append(Action(at, frozenset(touched)))

    def end(self) -> None:
        self.actions[-1].ended_ms = now_ms()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Load:
    """Items for the consumers' model at a steady rate, from a thread, until :meth:`stop`."""

    def __init__(self, conf: dict[str, str], topics: TopicNames, rate_per_s: float, seed: int) -> None:
        self.conf, self.topics, self.rate, self.seed = conf, topics, rate_per_s, seed
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self.seed += 1
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        records = synthetic_records(
            20_000, seed=self.seed, shapes=8, min_len=16, max_len=200, rate_per_s=None
        )
        started = time.monotonic()
        with TokenProducer(self.conf, self.topics) as producer:
            for i, r in enumerate(records):
                if self._stop.is_set():
                    return
                producer.send(f"{self.seed}-{r.id}", r.model, synthetic_tokens(r.id, r.length), shape=r.shape)
                self.sent += 1
                ahead = started + i / self.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


class Fleet:
    """The processes and consumer threads of one protocol's run."""

    def __init__(self, bootstrap: str, protocol: str, size: Size, log_dir: Path) -> None:
        self.bootstrap, self.protocol, self.size = bootstrap, protocol, size
        self.conf = {"bootstrap.servers": bootstrap}
        self.topics = TopicNames(unique(f"rb{protocol[:2]}"))
        self.group = f"{self.topics.prefix}-proc"
        # max_inflight >= partitions: every partition owns a slot of every consumer (docs/operations.md)
        self.cards = [
            Contract(f"c{i:02d}", "default", 2048, max_items=8, pad_multiple=8, max_inflight=size.partitions)
            for i in range(size.consumers)
        ]
        names = [c.consumer for c in self.cards]
        create_topics(self.conf, topic_specs(self.topics, ingest_partitions=size.partitions, consumers=names))
        self.pipeline = Pipeline(log_dir)
        self.apps: dict[str, tuple[threading.Event, threading.Thread]] = {}
        self.running: set[str] = set()
        self.restarts = 0
        """Processors that exited 75 (asking for a restart, as under load a commit can time out) and
        were started again, as Kubernetes would."""

    def processor(self, instance: str) -> None:
        self.pipeline.spawn(
            instance,
            [
                "processor", "--bootstrap", self.bootstrap, "--topic-prefix", self.topics.prefix,
                "--instance", instance, "--group", self.group, "--group-protocol", self.protocol,
                "--metrics-port", "0", "--log-level", "INFO", *PROCESSOR_ARGS,
            ],
            child_env(self.bootstrap),
        )  # fmt: skip
        self.running.add(instance)

    def supervise(self) -> None:
        for instance in sorted(self.running):
            if self.pipeline.procs[instance].poll() == EXIT_TEMPFAIL:
                self.restarts += 1
                self.processor(instance)

    def stop_processor(self, instance: str, sig: int = signal.SIGTERM) -> None:
        self.running.discard(instance)
        proc = self.pipeline.procs[instance]
        proc.send_signal(sig)
        proc.wait(60)

    def consumer(self, card: Contract) -> None:
        stop = threading.Event()
        engine = SimEngine(CardSpec(tokens_per_s=2e6, overhead_ms=5), 0.0)
        app = ConsumerApp(self.conf, self.topics, card, engine, ConsumerSettings(poll_timeout_s=0.1))
        thread = threading.Thread(target=app.run, args=(stop,), name=card.consumer, daemon=True)
        thread.start()
        self.apps[card.consumer] = (stop, thread)

    def stop_consumer(self, name: str) -> None:
        stop, thread = self.apps.pop(name)
        stop.set()
        thread.join(60)

    def close(self) -> None:
        for name in list(self.apps):
            self.stop_consumer(name)
        self.pipeline.stop()


def settle(fleet: Fleet, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        fleet.supervise()
        time.sleep(0.25)


def run_event(fleet: Fleet, name: str, spare: list[str]) -> Event:
    """The actions of event ``name``; ``spare`` holds instance ids not used yet."""
    s = fleet.size
    event = Event(name)
    if name == "processor-rolling-restart":
        for instance in [f"p{i}" for i in range(s.processors)]:
            event.act(instance)
            fleet.stop_processor(instance)
            fleet.processor(instance)
            settle(fleet, s.settle_s)
    elif name == "consumer-rolling-restart":
        for card in fleet.cards:
            event.act()  # no partition moves: every one is unaffected
            fleet.stop_consumer(card.consumer)
            fleet.consumer(card)
            settle(fleet, 1.0)
    elif name == "processor-added":
        event.act(spare[0])
        fleet.processor(spare[0])
        settle(fleet, s.settle_s)
    elif name == "processor-removed":
        event.act(spare[0])
        fleet.stop_processor(spare[0])
        settle(fleet, s.settle_s)
    elif name == "kill-during-restore":
        joining, victim = spare.pop(0), "p1"
        event.act(joining, victim)
        fleet.processor(joining)
        time.sleep(1.0)  # it has joined the group and restores what it was given
        fleet.stop_processor(victim, signal.SIGKILL)
        settle(fleet, s.settle_s + 6.0)  # the victim's session (6 s) runs out first
        event.act(victim)
        fleet.processor(victim)
        settle(fleet, s.settle_s)
    else:
        raise ValueError(f"unknown event {name!r}")
    event.end()
    return event


def drained_and_audited(fleet: Fleet, timeout_s: float) -> bool:
    """Whether every item produced so far finished and the audit is clean, within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        fleet.supervise()
        report = audit(fleet.conf, fleet.topics, fleet.group)
        if report.clean or time.monotonic() > deadline:
            if not report.clean:
                print("\n".join(report.lines()), file=sys.stderr)
            return report.clean
        time.sleep(3)


# -- what the topics say --------------------------------------------------------------------------


@dataclass
class Dispatches:
    """Per ingest partition: when each batch with its items was made, by whom; and each item's life."""

    times: dict[int, list[tuple[int, str]]] = field(default_factory=dict)  # p -> sorted (ms, instance)
    items: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # p -> (produced, dispatched)


def read_dispatches(conf: dict[str, str], topics: TopicNames, consumers: list[str]) -> Dispatches:
    """From the batch topics (committed batches: what consumers could run) and the ingest topic (each
    item's partition and produce time). Not from the changelog: compaction removes finished batches."""
    produced: dict[str, tuple[int, int]] = {}  # item id -> (partition, produced ms)
    for msg in read_topic(conf, topics.ingest):
        produced[decode_item_head(msg.value()).item_id] = (msg.partition(), msg.timestamp()[1])
    first: dict[str, int] = {}
    out = Dispatches()
    for consumer in consumers:
        for msg in read_topic(conf, topics.batches(consumer)):
            batch = decode_batch(msg.value())
            instance = batch.batch_id.split("-", 1)[0]
            parts = {produced[it.item_id][0] for it in batch.items if it.item_id in produced}
            for p in parts:
                out.times.setdefault(p, []).append((batch.created_ms, instance))
            for it in batch.items:
                first[it.item_id] = min(batch.created_ms, first.get(it.item_id, batch.created_ms))
    for item_id, (p, at) in produced.items():
        if item_id in first:
            out.items.setdefault(p, []).append((at, first[item_id]))
    for times in out.times.values():
        times.sort()
    return out


def longest_gap(times: list[int], items: list[tuple[int, int]], start: int, end: int) -> int:
    """The longest stretch in [start, end] in which the partition had an item waiting (produced, not
    yet dispatched) and dispatched nothing."""
    gaps = 0
    stamps = [t for t in times if t <= end]
    for at, first in items:
        if first < start or at > end:
            continue
        # waiting over [at, first]: the dispatch just before ``first`` bounds the stretch with none
        i = bisect.bisect_left(stamps, first)
        before = stamps[i - 1] if i > 0 else at
        gaps = max(gaps, first - max(at, before, start))
    return gaps


def split_gaps(action: Action, seen: Dispatches, lookback_ms: int = 5_000) -> tuple[list[int], list[int]]:
    """The partitions' gaps during ``action``: (unaffected, moved). Moved: a partition that a touched
    instance dispatched just before or during it, or whose dispatching instances changed."""
    moved: list[int] = []
    unaffected: list[int] = []
    start, end = action.started_ms, action.ended_ms
    for p, stamps in seen.times.items():
        before = {i for t, i in stamps if start - lookback_ms <= t < start}
        during = {i for t, i in stamps if start <= t <= end}
        touched = bool((before | during) & action.touched) or before != during
        gap = longest_gap([t for t, _i in stamps], seen.items.get(p, []), start, end)
        (moved if touched else unaffected).append(gap)
    return unaffected, moved


def figures(event: Event, seen: Dispatches) -> dict[str, Any]:
    unaffected: list[int] = []
    moved: list[int] = []
    for action in event.actions:
        calm, shaken = split_gaps(action, seen)
        unaffected += calm
        moved += shaken
    last = event.actions[-1]
    resumed = [
        next((t for t, _i in stamps if t >= last.started_ms), last.ended_ms) for stamps in seen.times.values()
    ]
    return {
        "event": event.name,
        "stable_after_ms": max(resumed, default=last.ended_ms) - last.started_ms,
        "max_gap_unaffected_ms": max(unaffected, default=0),
        "max_gap_moved_ms": max(moved, default=0),
        "audit_clean": event.audit_clean,
    }


def run_protocol(bootstrap: str, protocol: str, size: Size, log_dir: Path) -> dict[str, Any]:
    fleet = Fleet(bootstrap, protocol, size, log_dir)
    load = Load(fleet.conf, fleet.topics, size.rate_per_s, seed=7)
    events: list[Event] = []
    spare = [f"p{i}" for i in range(size.processors, size.processors + 3)]
    try:
        for card in fleet.cards:
            fleet.consumer(card)
        for i in range(size.processors):
            fleet.processor(f"p{i}")
        load.start()
        settle(fleet, size.settle_s * 2)  # every processor owns partitions and dispatches
        for name in size.events:
            if events:
                load.start()
                settle(fleet, 3.0)
            print(f"{protocol}: {name} (load {load_average()})", file=sys.stderr)
            event = run_event(fleet, name, spare)
            load.stop()
            event.audit_clean = drained_and_audited(fleet, timeout_s=180)
            events.append(event)
        seen = read_dispatches(fleet.conf, fleet.topics, [c.consumer for c in fleet.cards])
    finally:
        load.stop()
        fleet.close()
    runs = [figures(e, seen) for e in events]
    return {"events": runs, "items": load.sent, "prefix": fleet.topics.prefix, "restarts_75": fleet.restarts}


@contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as folder:
        state = Path(folder) / "kafka"
        info = kafka_local.start_broker(state)
        try:
            yield info.bootstrap
        finally:
            kafka_local.stop_broker(state)


def table(results: dict[str, Any]) -> list[str]:
    out = [
        "| protocol | event | stable after ms | max gap unaffected ms | max gap moved ms | audit |",
        "|---|---|---:|---:|---:|---|",
    ]
    for protocol, run in results["protocols"].items():
        for e in run["events"]:
            out.append(
                f"| {protocol} | {e['event']} | {e['stable_after_ms']:,} | {e['max_gap_unaffected_ms']:,} "
                f"| {e['max_gap_moved_ms']:,} | {'clean' if e['audit_clean'] else 'NOT CLEAN'} |"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--smoke", action="store_true", help="2 processors, 4 consumers, 2 events (CI)")
    ap.add_argument("--protocols", default="consumer,classic", help="comma-separated (default: both)")
    ap.add_argument("--bootstrap", default=None, help="a broker to use (default: start a private one)")
    ap.add_argument("--logs", default=None, help="keep the processors' logs in this folder")
    args = ap.parse_args(argv)
    size = SMOKE if args.smoke else FULL
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    results: dict[str, Any] = {"size": asdict(size), "load_before": load_average(), "protocols": {}}
    logs = tempfile.TemporaryDirectory(prefix="bench-rebalance-logs-")
    with logs as tmp, broker(args.bootstrap) as bootstrap:
        for protocol in protocols:
            log_dir = Path(args.logs or tmp) / protocol
            log_dir.mkdir(parents=True, exist_ok=True)
            results["protocols"][protocol] = run_protocol(bootstrap, protocol, size, log_dir)
            write_json(args.json, results)  # what is done so far survives a later failure
    results["load_after"] = load_average()
    write_json(args.json, results)
    print("\n".join(table(results)))
    before, after = results["load_before"], results["load_after"]
    print(f"load average before {before}, after {after} ({os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
