"""What the Kafka benchmarks share: the machine, run topics, worker subprocesses, and summaries.

Every benchmark that talks to Kafka runs its measured parts in child processes (``workers.py``), one
role per process, so that each side of a comparison has an interpreter, a GIL and Kafka clients of
its own and is measured the same way. A worker prints one ``RESULT {json}`` line when it is done;
this module starts it, waits for that line and hands back the dict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from processor.kafka.topics import RETAINED, TopicNames, TopicSpec, create_topics, topic_specs  # noqa: E402
from processor.wire.records import CompletionBatchRecord, ItemOutcomeRecord  # noqa: E402

WORKERS = Path(__file__).resolve().with_name("workers.py")
#: Where ``run_all.py --own-broker`` starts its broker.
OWN_BROKER_DIR = Path("/tmp/bench-kafka")
RESULT_PREFIX = "RESULT "
READY_LINE = "READY"


@dataclass(frozen=True, slots=True)
class RunTopics(TopicNames):
    """A run's own topics under ``prefix``, but ingest read from ``source``, a pre-produced topic.

    Each processor run needs fresh changelog, contracts, results, accounting and batch topics (restore
    would otherwise pick up an earlier run's changelog), while every run reads the same input.
    """

    source: str = ""

    @property
    def ingest(self) -> str:
        return self.source or f"{self.prefix}.ingest"


def unique(stem: str) -> str:
    """A topic prefix no other agent or earlier run uses."""
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def input_spec(name: str, partitions: int = 6) -> TopicSpec:
    """An input topic made like ``tokenfabric.ingest`` (6 partitions, 64 MiB messages, 7 days)."""
    return TopicSpec(name, partitions, RETAINED)


def run_specs(topics: RunTopics, consumers: Sequence[str]) -> list[TopicSpec]:
    """The topics a processor run writes or reads besides its input."""
    return [s for s in topic_specs(topics, consumers=consumers) if s.name != topics.ingest]


def make_topics(conf: Mapping[str, str], specs: Iterable[TopicSpec]) -> list[str]:
    specs = list(specs)
    create_topics(conf, specs)
    return [s.name for s in specs]


def delete_topics(conf: Mapping[str, str], names: Sequence[str], timeout_s: float = 30.0) -> None:
    """Delete ``names``; a topic already gone is not an error (cleanup must not mask a failure)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    if not names:
        return
    admin = AdminClient(dict(conf))
    for future in admin.delete_topics(list(names), operation_timeout=timeout_s).values():
        with contextlib.suppress(KafkaException):
            future.result(timeout=timeout_s)


# -- workers ----------------------------------------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker exited without a result; the message carries its exit code and the tail of its log."""


class Worker:
    """A ``workers.py`` child running one role; its stderr goes to a temporary log file.

    ``BENCH_WRAP_<ROLE>`` (e.g. ``BENCH_WRAP_PROCESSOR="py-spy record -o p.svg --"``) puts a command in
    front of that role's interpreter: a sampling profiler, ``perf``, ``taskset``.
    """

    def __init__(self, role: str, args: Mapping[str, Any]) -> None:
        self.role = role
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{role}-", suffix=".log", delete=False)  # noqa: SIM115
        wrapper = shlex.split(os.environ.get(f"BENCH_WRAP_{role.upper()}", ""))
        self.proc = subprocess.Popen(
            [*wrapper, sys.executable, str(WORKERS), role, json.dumps(dict(args))],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=ROOT,
        )

    def _tail(self) -> str:
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-25:])

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the worker prints READY (it has set itself up). Other lines are skipped, as
        :meth:`result` skips them: a ``BENCH_WRAP_<ROLE>`` tool may print on the same stdout."""
        deadline = time.monotonic() + timeout_s
        while self._line(max(0.1, deadline - time.monotonic())) != READY_LINE:
            pass

    def result(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the RESULT line and the exit; raise with the worker's log on anything else."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._line(max(0.1, deadline - time.monotonic()))
            if line.startswith(RESULT_PREFIX):
                result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
                break
        code = self.proc.wait(max(1.0, deadline - time.monotonic()))
        if code != 0:
            raise WorkerError(f"{self.role}: exit code {code} after its result\n{self._tail()}")
        self.close()
        return result

    def _line(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.stop()
            raise WorkerError(f"{self.role}: no output within {timeout_s:.0f} s\n{self._tail()}")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait(10)
            raise WorkerError(f"{self.role}: exited with code {code} and no result\n{self._tail()}")
        return line.strip()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM this worker (only this one) and wait; SIGKILL if it does not go."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.close()

    def close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


# -- summaries --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    """Median and range of repeated measurements (the range is the honest error bar on a busy box)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no measurements")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def fmt(self, spec: str = ",.0f", scale: float = 1.0) -> str:
        m, lo, hi = self.median / scale, self.low / scale, self.high / scale
        return f"{m:{spec}} ({lo:{spec}}-{hi:{spec}})"


def consumer_sweep_args(
    doc: str, batches: int, smoke: tuple[list[int], int], argv: list[str] | None
) -> argparse.Namespace:
    """The arguments of a sweep over consumer counts (bench_consumers*.py): ``--consumers``,
    ``--batches`` (default ``batches``), ``--smoke`` (``smoke``'s counts and batches), ``--json``."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--consumers", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--batches", type=int, default=batches, help=f"batches per count (default {batches:,})")
    counts, few = smoke
    p.add_argument("--smoke", action="store_true", help=f"{counts} consumers, {few} batches")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.smoke:
        args.consumers, args.batches = counts, few
    if min(args.consumers) < 1 or args.batches < 1:
        p.error("--consumers and --batches must be >= 1")
    return args


def all_ok(batch: Any, consumer: str, completed_ms: int) -> CompletionBatchRecord:
    """Every item of ``batch`` (a BatchRecord or its head) answered ``ok``, as one completion message;
    ``padded_tokens`` is each item's share, the batch's padded length (ItemOutcomeRecord)."""
    return CompletionBatchRecord(
        batch_id=batch.batch_id,
        consumer=consumer,
        model=batch.model,
        padded_tokens=batch.padded_length,
        completed_ms=completed_ms,
        items=[
            ItemOutcomeRecord(item_id=item.item_id, status="ok", input_tokens=item.token_count)
            for item in batch.items
        ],
    )


def write_json(path: str | None, payload: Mapping[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=2) + "\n")


# -- the machine ------------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


class BrokerCpu:
    """CPU seconds of a broker this machine runs (``processor.local.broker``), read from /proc.

    Why: broker, processor, drainer and librdkafka share two cores, and the processor's side makes
    the broker do more (it also serves the drainer and the changelog) than the ceiling's does. The
    broker's CPU beside each side's says how much of a ratio is that, not the processor's code.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._tick = os.sysconf("SC_CLK_TCK")

    @classmethod
    def find(cls, bootstrap: str) -> BrokerCpu | None:
        """The process listening on ``bootstrap``'s port if it is on this machine and readable (a
        broker ``processor.local.broker`` or anything else of ours started), else None."""
        host, _, port = bootstrap.split(",")[0].rpartition(":")
        if host not in ("127.0.0.1", "localhost", "::1", "[::1]") or not port.isdigit():
            return None
        inodes = _listening_inodes(int(port))
        for fd_dir in Path("/proc").glob("[0-9]*/fd"):
            try:
                links = [os.readlink(fd) for fd in fd_dir.iterdir()]
            except OSError:  # another user's process, or gone
                continue
            if any(link.startswith("socket:[") and link[8:-1] in inodes for link in links):
                return cls(int(fd_dir.parent.name))
        return None

    def seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._tick  # utime, stime


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes of TCP sockets listening on ``port`` (state 0A), from /proc/net/tcp and tcp6."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    out.add(fields[9])
    return out


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def broker_version(bootstrap: str) -> str:
    """The Kafka version of the local broker listening on ``bootstrap``'s port, read from its JVM's
    class path (``kafka-X.Y.Z/lib``); "unknown" for a broker this machine does not run."""
    port = bootstrap.rsplit(":", 1)[-1]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = [a.decode(errors="replace") for a in cmdline.read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if "kafka.Kafka" not in argv:
            continue
        props = Path(argv[-1])
        try:
            listens = re.search(rf"^listeners=.*:{port}\b", props.read_text(), re.MULTILINE)
        except OSError:
            continue
        found = re.search(r"kafka-(\d+\.\d+\.\d+)", " ".join(argv))
        if listens and found:
            return f"Apache Kafka {found.group(1)}"
    return "unknown"


def versions(bootstrap: str | None) -> dict[str, str]:
    import confluent_kafka

    return {
        "python": platform.python_version(),
        "confluent-kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": broker_version(bootstrap) if bootstrap else "none",
    }


def machine() -> dict[str, str]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "nproc": str(affinity),
        "memory": f"{mem_total_gib():.1f} GiB",
        "cpu": cpu_model(),
        "os": platform.platform(),
    }


# -- input ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Produced:
    topic: str
    items: int
    tokens: int
    seconds: float


def produce_items(
    conf: Mapping[str, str],
    topic: str,
    *,
    items: int,
    tokens: int,
    model: str,
    shapes: int,
    jitter: float = 0.1,
    seed: int = 1,
    tag: str = "i",
) -> Produced:
    """``items`` TokenItems of one ``model`` on ``topic``, the way a producer would send them.

    Lengths are uniform in ``tokens x (1 +- jitter)``; each item takes one of ``shapes`` shape
    signatures at random (keyed by shape, as ``TokenProducer`` does); tokens are
    ``synthetic_tokens``. Seeded, so every run of a size reads the same input.
    """
    import random

    from processor.apps.producer import TokenProducer, synthetic_tokens
    from processor.core.signature import shape_signature

    rng = random.Random(seed)
    signatures = [shape_signature([f"bench-shape-{k}"]) for k in range(shapes)]
    low, high = max(1, round(tokens * (1 - jitter))), max(1, round(tokens * (1 + jitter)))
    started = time.perf_counter()
    total = 0
    with TokenProducer(conf, RunTopics("bench", source=topic)) as producer:
        for i in range(items):
            item_id = f"{tag}-{i:08d}"
            length = rng.randint(low, high)
            producer.send(item_id, model, synthetic_tokens(item_id, length), shape=rng.choice(signatures))
            total += length
    return Produced(topic, items, total, time.perf_counter() - started)
