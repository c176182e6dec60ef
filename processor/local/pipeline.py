"""The main job end to end: broker, processor, two simulated cards, a real trace, then a report.

Every part runs as it would in production, as its own process talking to a real broker: the
processor (``tokenfabric processor``), one consumer app per card (``tokenfabric consumer --engine
sim``), and a producer replaying the trace. The report is computed twice over: from the processor's
accounting checkpoint, and independently by reading the batch and results topics back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from processor.kafka.factory import KAFKA
from processor.kafka.reader import read_topic
from processor.kafka.topics import TopicNames
from processor.ops.status import StatusView, gather
from processor.wire.completions import decode_completions
from processor.wire.heads import decode_batch_head


@dataclass(frozen=True, slots=True)
class Card:
    name: str
    budget: int
    items: int
    tps: int
    inflight: int = 2
    pad: int = 8
    cache: int = 4
    overhead_ms: float = 5.0

    def spec(self, model: str) -> str:
        """The same card as a ``simulate --consumer`` spec."""
        return (
            f"{self.name}:model={model},budget={self.budget},items={self.items},pad={self.pad},"
            f"inflight={self.inflight},tps={self.tps},overhead_ms={self.overhead_ms},cache={self.cache}"
        )

    def contract_args(self, model: str) -> list[str]:
        """The flags of the card's contract, shared by ``consumer`` and ``plain-queue``."""
        return [
            "--id",
            self.name,
            "--model",
            model,
            "--budget",
            str(self.budget),
            "--items",
            str(self.items),
            "--pad",
            str(self.pad),
        ]

    def engine_args(self, engine: str, time_scale: float) -> list[str]:
        """``--engine embed`` runs MiniLM for real; ``sim`` models this card's speed and cache."""
        if engine != "sim":
            return ["--engine", engine]
        return [
            "--engine",
            "sim",
            "--tps",
            str(self.tps),
            "--overhead-ms",
            str(self.overhead_ms),
            "--cache",
            str(self.cache),
            "--time-scale",
            str(time_scale),
        ]

    def args(self, model: str, time_scale: float, engine: str = "sim") -> list[str]:
        """The ``tokenfabric consumer`` flags of this card."""
        return [
            *self.contract_args(model),
            "--inflight",
            str(self.inflight),
            *self.engine_args(engine, time_scale),
        ]


DEFAULT_CARDS = (
    Card("card16", budget=16384, items=64, tps=25_000),  # a 16 GB card
    Card("card32", budget=32768, items=128, tps=50_000),  # a 32 GB card: twice the room and speed
)

#: The main job's cards, for items of at most 512 tokens (MiniLM's positions): a small and a large
#: contract, pad multiple 1 (a CPU has no tile size to round to). ``tps`` is what MiniLM measured on
#: one core of the 2-core development machine (about 2,900 tokens/s), for ``--engine sim``.
MAIN_CARDS = (
    Card("card-s", budget=4096, items=32, tps=2_900, pad=1, overhead_ms=2.0),
    Card("card-l", budget=8192, items=64, tps=2_900, pad=1, overhead_ms=2.0),
)

#: ``demo --engine llm``'s cards: each a local llama-server (docs/llm-local.md) of the same settings,
#: so the runs differ only in which items each server gets in what order. Generation servers batch
#: continuously and do not pad (pad multiple 1); the budget bounds a batch's prompt tokens, the item
#: count the concurrent requests a batch opens. ``tps`` is unused (no sim engine here).
LLM_CARDS = (
    Card("gen-a", budget=16384, items=16, tps=0, pad=1, overhead_ms=0.0),
    Card("gen-b", budget=16384, items=16, tps=0, pad=1, overhead_ms=0.0),
)


def group_members(conf: Mapping[str, str], group: str) -> list[int]:
    """Partitions assigned to each member of a consumer group (empty: no stable group yet)."""
    from confluent_kafka import ConsumerGroupState, KafkaException

    # held until the answer: the future of a client already collected is never resolved
    admin = KAFKA.admin({**conf, "log_level": "3"})  # no info lines at close
    future = admin.describe_consumer_groups([group], request_timeout=10)[group]
    try:
        desc = future.result(timeout=15)
    except KafkaException:  # the group does not exist yet: not ready, the caller asks again
        return []
    if desc.state != ConsumerGroupState.STABLE:
        return []
    return [len(m.assignment.topic_partitions) for m in desc.members]


@dataclass(slots=True)
class TopicReadback:
    """Figures recomputed from the batch and results topics, trusting nothing the processor says."""

    batches: Counter[str] = field(default_factory=Counter)
    items: Counter[str] = field(default_factory=Counter)
    real_tokens: Counter[str] = field(default_factory=Counter)
    padded_tokens: Counter[str] = field(default_factory=Counter)
    mixed_shape_batches: int = 0
    over_budget_batches: int = 0
    shapes: Counter[str] = field(default_factory=Counter)
    completed_ids: Counter[str] = field(default_factory=Counter)
    completed_ok: int = 0
    completed_tokens: int = 0
    cache_hits: int = 0

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.completed_ids.values() if n > 1)


def read_back(conf: Mapping[str, str], topics: TopicNames, cards: Sequence[Card]) -> TopicReadback:
    out = TopicReadback()
    for card in cards:
        shapes_seen: set[int] = set()
        for msg in read_topic(conf, topics.batches(card.name)):
            batch = decode_batch_head(msg.value())
            n = len(batch.items)
            out.batches[card.name] += 1
            out.items[card.name] += n
            out.real_tokens[card.name] += sum(it.token_count for it in batch.items)
            out.padded_tokens[card.name] += n * batch.padded_length
            if len({(it.model, it.shape) for it in batch.items}) > 1:
                out.mixed_shape_batches += 1
            if n > 1 and n * batch.padded_length > card.budget:
                out.over_budget_batches += 1
            shapes_seen.add(batch.shape)
        out.shapes[card.name] = len(shapes_seen)
    for msg in read_topic(conf, topics.results):
        for rec in decode_completions(msg.value()):
            out.completed_ids[rec.item_id] += 1
            if rec.status == "ok":
                out.completed_ok += 1
                out.completed_tokens += rec.input_tokens
    return out


class Pipeline:
    """The demo's child processes; ``stop`` ends them all with SIGTERM (then SIGKILL)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, args: list[str], env: Mapping[str, str]) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (owned by the child until it exits)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "processor", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
        )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}; its log ends:\n{tail}")

    def stop(self, timeout_s: float = 30) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout_s
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
        return codes


def wait_until_done(
    conf: Mapping[str, str],
    topics: TopicNames,
    expected_items: int,
    pipeline: Pipeline,
    timeout_s: float,
    progress: object | None = None,
) -> StatusView:
    """Poll the accounting checkpoints until every item is completed, failed or dead-lettered."""
    deadline = time.monotonic() + timeout_s
    while True:
        pipeline.check_alive()
        view = gather(conf, topics)
        done = view.total("completed_items") + view.total("failed_items") + view.total("dead_lettered_items")
        if progress is not None:
            progress(done)  # type: ignore[operator]
        if done >= expected_items:
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {done:,} of {expected_items:,} items finished within {timeout_s:.0f} s")
        time.sleep(0.5)


def unique_prefix() -> str:
    return f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def child_env(bootstrap: str) -> dict[str, str]:
    env = dict(os.environ)
    env["KAFKA_BOOTSTRAP"] = bootstrap
    env["PYTHONUNBUFFERED"] = "1"
    # the folder that holds the ``processor`` package (a checkout or site-packages), so the children
    # run this very code whatever their working directory
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def log_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="tokenfabric-demo-"))
