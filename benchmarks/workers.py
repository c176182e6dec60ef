"""The measured processes of the Kafka benchmarks, one role per process.

    python benchmarks/workers.py ROLE '{"bootstrap": ..., ...}'

Roles:

* ``ceiling``: a plain confluent-kafka consume-produce passthrough from the input topic to an output
  topic, with the processor's client settings, consume size and commit cadence; transactional (with
  ``send_offsets_to_transaction``) when ``exactly_once``;
* ``processor``: tokenfabric's ``ProcessorService`` on the same input, timed from inside its loop;
* ``drainer``: a fast consumer: announces one generous contract, reads its batch topic and writes an
  ``ok`` completion per item at once, so that the processor, not the consumer, is the limit;
* ``fill``: a processor with no contract for the items' model, run until every item waits in a lane
  and that is committed (the state ``restore`` then rebuilds);
* ``restore``: a fresh ``ProcessorService.start()`` over that state, timed.

Both sides of the pipeline comparison are timed the same way: from the start of the consume call
that returned the first input message to the moment the last output was durable (exactly-once: the
``commit_transaction`` that holds it returned; at-least-once: its delivery report arrived). CPU
seconds (``time.process_time``: every thread of the process, librdkafka's included) over the same
interval are reported beside wall seconds; on a shared machine they are the steadier figure.

Each role prints ``READY`` (drainer only) and finally one ``RESULT {json}`` line on stdout.
"""

from __future__ import annotations

import cProfile
import json
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import READY_LINE, RESULT_PREFIX, BrokerCpu, RunTopics, all_ok
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processor.apps.consumer import PRODUCER_SETTINGS
from processor.apps.service import ProcessorService
from processor.apps.settings import MAX_COMPLETION_BYTES, ProcessorSettings
from processor.core.contract import Contract, contract_violation
from processor.kafka.reader import read_topic_chunks
from processor.wire.completions import encode_completion_batches
from processor.wire.control import encode_contract
from processor.wire.heads import decode_batch_head
from processor.wire.records import ContractRecord

# The processor's client settings (processor/apps/service.py, ProcessorService.__init__), repeated here so
# that the ceiling moves the same bytes the same way. Keep them in step.
INGEST_CONSUMER = {
    "enable.auto.commit": "false",
    "auto.offset.reset": "earliest",
    "isolation.level": "read_committed",
    "fetch.max.bytes": str(64 * 1024 * 1024),
    "queued.max.messages.kbytes": str(256 * 1024),
    "fetch.queue.backoff.ms": "20",
}
PROCESSOR_PRODUCER = {
    "enable.idempotence": "true",
    "linger.ms": "5",
    "batch.size": str(1024 * 1024),
    "message.max.bytes": str(64 * 1024 * 1024),
}
DEFAULTS = ProcessorSettings()


def emit(result: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def cpu() -> float:
    return time.process_time()


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Interval:
    """First input to last durable output, in wall and CPU seconds; with ``broker_pid`` (a broker on
    this machine), the broker's CPU seconds over the same interval too."""

    def __init__(self, broker_pid: int | None = None) -> None:
        self.first_s: float | None = None
        self.first_cpu = self.first_thread = self.first_broker = 0.0
        self.last_s: float | None = None
        self.last_cpu = self.last_thread = self.last_broker = 0.0
        self.broker = BrokerCpu(broker_pid) if broker_pid else None

    def started(self, wall: float, cpu_s: float) -> None:
        if self.first_s is None:
            self.first_s, self.first_cpu = wall, cpu_s
            self.first_thread = time.thread_time()
            self.first_broker = self.broker.seconds() if self.broker else 0.0

    def finished(self) -> None:
        self.last_s, self.last_cpu = time.perf_counter(), cpu()
        self.last_thread = time.thread_time()
        self.last_broker = self.broker.seconds() if self.broker else 0.0

    def report(self) -> dict[str, float | None]:
        """``thread_cpu_s``: the calling thread's own CPU (the Python loop), without librdkafka's."""
        assert self.first_s is not None and self.last_s is not None
        return {
            "seconds": self.last_s - self.first_s,
            "cpu_s": self.last_cpu - self.first_cpu,
            "thread_cpu_s": self.last_thread - self.first_thread,
            "broker_cpu_s": self.last_broker - self.first_broker if self.broker else None,
        }


# -- ceiling ----------------------------------------------------------------------------------------


def ceiling(a: dict[str, Any]) -> None:
    """Consume, produce each message unchanged, commit like the processor: nothing else."""
    conf = {"bootstrap.servers": a["bootstrap"]}
    expected: int = a["expected"]
    eos: bool = a["exactly_once"]
    consumer = Consumer({**conf, **INGEST_CONSUMER, "group.id": a["group"]})
    pconf = dict(conf, **PROCESSOR_PRODUCER)
    if eos:  # as the processor's transactional producer: the commit is the delivery report
        pconf.update(
            {
                "transactional.id": a["transactional_id"],
                "transaction.timeout.ms": "60000",
                "delivery.report.only.error": True,
            }
        )
    producer = Producer(pconf)
    if eos:
        producer.init_transactions(60)
        producer.begin_transaction()
    consumer.subscribe([a["source"]])
    out: str = a["out"]
    counts = {"delivered": 0, "failed": 0}

    def delivered(err: Any, _msg: Any) -> None:
        counts["failed" if err is not None else "delivered"] += 1

    span = Interval(a.get("broker_pid"))
    produced = commits = 0
    dirty = False
    last_commit = time.monotonic()
    deadline = time.monotonic() + a["timeout_s"]
    while span.last_s is None:
        wall, cpu_s = time.perf_counter(), cpu()
        msgs = consumer.consume(num_messages=DEFAULTS.consume_batch, timeout=DEFAULTS.poll_timeout_ms / 1000)
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise KafkaException(err)
                continue
            while True:
                try:
                    producer.produce(out, msg.value(), msg.key(), on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            produced += 1
            dirty = True
        if msgs:
            span.started(wall, cpu_s)
        producer.poll(0)
        if counts["failed"]:
            raise RuntimeError(f"ceiling: {counts['failed']} produces failed")
        elapsed_ms = (time.monotonic() - last_commit) * 1000
        if elapsed_ms >= DEFAULTS.commit_interval_ms or (dirty and elapsed_ms >= DEFAULTS.eager_commit_ms):
            all_in = produced >= expected
            _commit_passthrough(consumer, producer, eos)
            commits += 1
            dirty = False
            last_commit = time.monotonic()
            if eos and all_in:
                span.finished()
        if not eos and counts["delivered"] >= expected:
            span.finished()
        if time.monotonic() > deadline:
            raise TimeoutError(f"ceiling: {produced:,} of {expected:,} after {a['timeout_s']} s")
    _commit_passthrough(consumer, producer, eos, last=True)
    consumer.close()
    emit(
        {"side": "ceiling", "items": produced, "delivered": counts["delivered"], "commits": commits}
        | span.report()
    )


def _commit_passthrough(consumer: Consumer, producer: Producer, eos: bool, last: bool = False) -> None:
    if not eos:
        if last:
            producer.flush(30)
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:  # nothing consumed yet
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise
        return
    assignment = consumer.assignment()
    positions = [tp for tp in consumer.position(assignment) if tp.offset >= 0] if assignment else []
    if positions:
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(60)
    if not last:
        producer.begin_transaction()


# -- processor --------------------------------------------------------------------------------------


class TimedProcessor(ProcessorService):
    """``ProcessorService`` with a stopwatch around its loop; the loop itself is untouched.

    ``until="dispatched"``: done when every expected item is in a batch that is durable (the commit
    after the last dispatch, or every batch's delivery report with at-least-once). ``until="waiting"``:
    done when every expected item waits in a lane and a commit followed (the restore benchmark).
    """

    def __init__(
        self,
        *args: Any,
        expected: int,
        contracts: int,
        until: str,
        stop: threading.Event,
        timeout_s: float,
        profile: cProfile.Profile | None = None,
        broker_pid: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.expected = expected
        self.contracts = contracts
        self.until = until
        self.stop_event = stop
        self.deadline = time.monotonic() + timeout_s
        self.span = Interval(broker_pid)
        self.profile = profile
        self.profiling = False
        self.completions_in_span = 0

    def start(self) -> None:
        """Start, then read the contracts topic until the drainer's contract is known.

        In production contracts are announced long before a backlog is read; without this wait the
        first steps would consume input the processor may not yet dispatch, and the time until its
        control consumer caught up would count against it but not against the ceiling.
        """
        super().start()
        deadline = time.monotonic() + 60
        while len(self.core.view.consumers()) < self.contracts:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"processor: {len(self.core.view.consumers())} of {self.contracts} contracts"
                )
            self.control_plane.read(self.now_ms())
            time.sleep(0.01)

    def step(self) -> int:
        wall, cpu_s, commits = time.perf_counter(), cpu(), self.counters.commits
        taken = super().step()
        if taken:
            self.span.started(wall, cpu_s)
            if self.profile is not None and not self.profiling and self.span.last_s is None:
                self.profile.enable()  # from the end of the first step with input to the end
                self.profiling = True
        if self.span.last_s is None and self._done(committed=self.counters.commits > commits):
            self.span.finished()
            if self.profiling:
                self.profile.disable()  # type: ignore[union-attr]
                self.profiling = False
            self.completions_in_span = self.counters.completions
            self.stop_event.set()
        elif time.monotonic() > self.deadline:
            c = self.counters
            raise TimeoutError(
                f"processor not done in time: consumed {c.consumed:,}, routed "
                f"{self.core.view.total('routed').items:,} of {self.expected:,}, waiting "
                f"{self.core.view.waiting().items:,}, batches produced {c.batches_produced:,} delivered "
                f"{c.batches_delivered:,}, completions {c.completions:,}, contracts {c.contracts}, "
                f"in flight {sum(c.in_flight for c in self.core.view.consumers().values()):,}, "
                f"commits {c.commits:,}"
            )
        return taken

    def _done(self, committed: bool) -> bool:
        if self.until == "waiting":
            return committed and self.core.view.waiting().items >= self.expected
        if self.core.view.total("routed").items < self.expected:
            return False
        if self.settings.exactly_once:
            return committed
        return self.counters.batches_delivered == self.counters.batches_produced


def processor(a: dict[str, Any]) -> None:
    conf = {"bootstrap.servers": a["bootstrap"]}
    topics = RunTopics(a["prefix"], source=a["source"])
    settings = ProcessorSettings(instance=a["instance"], group_id=a["group"], exactly_once=a["exactly_once"])
    if not settings.exactly_once:
        results_from_start(conf, topics, settings)
    stop = threading.Event()
    profile = cProfile.Profile() if a.get("profile") else None
    service = TimedProcessor(
        conf,
        topics,
        settings,
        expected=a["expected"],
        contracts=0 if a.get("until") == "waiting" else 1,
        until=a.get("until", "dispatched"),
        stop=stop,
        timeout_s=a["timeout_s"],
        profile=profile,
        broker_pid=a.get("broker_pid"),
    )
    service.run(stop)
    if profile is not None:
        profile.dump_stats(a["profile"])
    routed = service.core.view.total("routed")
    c = service.counters
    emit(
        {
            "side": "processor",
            "items": routed.items if service.until == "dispatched" else service.core.view.waiting().items,
            "tokens": routed.tokens if service.until == "dispatched" else service.core.view.waiting().tokens,
            "consumed": c.consumed,
            "dead_lettered": c.dead_lettered,
            "batches": c.batches_produced,
            "commits": c.commits,
            "completions_in_span": service.completions_in_span,
            "peak_rss_mib": peak_rss_mib(),
        }
        | service.span.report()
    )


def results_from_start(conf: dict[str, str], topics: RunTopics, settings: ProcessorSettings) -> None:
    """Commit offset 0 of the (new, empty) results topic for the at-least-once processor's control group.

    Without a committed offset that processor reads results from ``latest``, resolved only after it
    has started; completions the drainer writes before then are skipped and their batches never leave
    flight (a race in the processor, reported in docs/benchmarks.md). Starting from 0 is what a fresh
    processor should do anyway.
    """
    group = f"{settings.group_id}-control-{settings.instance}"
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": "false"})
    try:
        meta = consumer.list_topics(topics.results, timeout=30).topics[topics.results]
        offsets = [TopicPartition(topics.results, p, 0) for p in sorted(meta.partitions)]
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


# -- drainer ----------------------------------------------------------------------------------------


def drainer(a: dict[str, Any]) -> None:
    """Announce a contract, then complete every item of every batch at once: one CompletionBatch per
    batch, as the consumer app writes by default.

    It shares the processor's two cores, so it does no more than a consumer must to answer: each
    batch is read with ``fastpath.decode_batch_head`` (every field checked, as ``decode_batch``
    checks it, but no token copied out: there is no engine to give them to) and checked against the
    contract."""
    conf = {"bootstrap.servers": a["bootstrap"]}
    topics = RunTopics(a["prefix"], source=a["source"])
    contract = Contract(**a["contract"])
    producer = Producer({**conf, **PRODUCER_SETTINGS})
    announce = encode_contract(ContractRecord(contract, int(time.time() * 1000)))
    producer.produce(topics.contracts, announce, contract.consumer.encode())
    if producer.flush(30):
        raise RuntimeError("drainer: contract not delivered")
    consumer = Consumer({**conf, **INGEST_CONSUMER, "group.id": f"{a['prefix']}-drainer"})
    # metadata first: assigned a partition whose leader it does not know yet, a client waits 500 ms
    consumer.list_topics(topics.batches(contract.consumer), timeout=30)
    consumer.assign([TopicPartition(topics.batches(contract.consumer), 0, OFFSET_BEGINNING)])
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    print(READY_LINE, flush=True)

    seen: set[str] = set()
    items = tokens = batches = violations = largest = 0
    first_cpu: float | None = None
    deadline = time.monotonic() + a["timeout_s"]
    while len(seen) < a["expected"] and not stopping.is_set() and time.monotonic() < deadline:
        before = cpu()
        for msg in consumer.consume(num_messages=1000, timeout=0.05):
            if msg.error() is not None:
                continue
            if first_cpu is None:
                first_cpu = before
            batch = decode_batch_head(msg.value())  # checked as decode_batch checks it, tokens not copied
            batches += 1
            violations += contract_violation(contract, batch) is not None
            largest = max(largest, len(batch.items))
            items += len(batch.items)
            tokens += sum(item.token_count for item in batch.items)
            seen.update(item.item_id for item in batch.items)
            done = all_ok(batch, contract.consumer, int(time.time() * 1000))
            for value in encode_completion_batches(done, MAX_COMPLETION_BYTES):
                _produce(producer, topics.results, value, batch.batch_id.encode())
        producer.poll(0)
    producer.flush(30)
    consumer.close()
    emit(
        {
            "side": "drainer",
            "items": items,
            "distinct": len(seen),
            "tokens": tokens,
            "batches": batches,
            "violations": violations,
            "largest_batch": largest,
            "cpu_s": cpu() - (first_cpu or 0.0),
        }
    )


def _produce(producer: Producer, topic: str, value: bytes, key: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:
            producer.poll(0.05)


# -- restore ----------------------------------------------------------------------------------------


def fill(a: dict[str, Any]) -> None:
    """A processor that can dispatch nothing: every item ends up waiting, committed to the changelog."""
    processor(a | {"until": "waiting", "exactly_once": True})


def restore(a: dict[str, Any]) -> None:
    """Time a fresh ``ProcessorService`` from ``start()`` until every waiting item is back in a lane.

    Where restore happens is the processor's business: inside ``start()``, or when the group assigns
    the ingest partitions (during the first ``step()``); the loop below steps until the lanes hold
    what ``fill`` left, so both are timed the same way. There is no new input to consume.
    """
    conf = {"bootstrap.servers": a["bootstrap"]}
    topics = RunTopics(a["prefix"], source=a["source"])
    service = ProcessorService(conf, topics, ProcessorSettings(instance=a["instance"], group_id=a["group"]))
    expected: int = a["expected"]
    deadline = time.monotonic() + a["timeout_s"]
    wall, cpu_s = time.perf_counter(), cpu()
    service.start()
    steps = 0
    while service.core.view.waiting().items < expected and time.monotonic() < deadline:
        service.step()
        steps += 1
    seconds, cpu_used = time.perf_counter() - wall, cpu() - cpu_s
    waiting = service.core.view.waiting()
    result = {
        "seconds": seconds,
        "cpu_s": cpu_used,
        "steps": steps,
        "read_seconds": service.counters.restore_seconds,
        "restored_items": service.counters.restored_items,
        "waiting_items": waiting.items,
        "waiting_tokens": waiting.tokens,
        "peak_rss_mib": peak_rss_mib(),
    }
    # Leave as a crashed processor would: nothing more committed; the next start fences and aborts the
    # open transaction, so every repetition restores the same state.
    service._close(commit=False)
    emit(result)


def scan(a: dict[str, Any]) -> None:
    """The read ceiling of a restore: every message of the ingest topic, read as restore reads them
    (``replay.read_topic_chunks``, same consumer settings), each message's value touched and nothing
    else."""
    conf = {"bootstrap.servers": a["bootstrap"]}
    wall, cpu_s = time.perf_counter(), cpu()
    count = size = 0
    for chunk in read_topic_chunks(conf, a["source"]):
        for msg in chunk:
            count += 1
            size += len(msg.value())
    emit({"seconds": time.perf_counter() - wall, "cpu_s": cpu() - cpu_s, "messages": count, "bytes": size})


ROLES: dict[str, Callable[[dict[str, Any]], None]] = {
    "scan": scan,
    "ceiling": ceiling,
    "processor": processor,
    "drainer": drainer,
    "fill": fill,
    "restore": restore,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ROLES:
        print(f"usage: workers.py {{{','.join(ROLES)}}} JSON_ARGS", file=sys.stderr)
        return 2
    ROLES[argv[0]](json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
