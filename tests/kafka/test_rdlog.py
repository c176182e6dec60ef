"""librdkafka's log goes through Python logging, rate-limited, from every client the package makes."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import textwrap

from processor.kafka.rdlog import KAFKA_LOGGER, RateLimit, kafka_logger, with_kafka_logger
from tests.common import ROOT

CLIENTS = {"Consumer", "Producer", "AdminClient"}
#: The probe keeps librdkafka's lines in a private logger, to quote the first in its one-line error.
OWN_LOGGER = {"processor/kafka/reach.py"}


def _record(text: str, fac: str = "FAIL") -> logging.LogRecord:
    """A record as confluent-kafka makes it: ``log(level, "%s [%s] %s", fac, client, text)``."""
    return logging.LogRecord(
        KAFKA_LOGGER, logging.ERROR, "", 0, "%s [%s] %s", (fac, "rdkafka#p-1", text), None
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_repeated_message_passes_once_per_interval_and_says_how_many_it_held_back() -> None:
    clock = Clock()
    limit = RateLimit(every_s=60, clock=clock)
    assert limit.filter(_record("Connect to 127.0.0.1:1 failed (after 0ms)"))
    for ms in range(1, 20):  # numbers aside, the same message
        clock.now += 1
        assert not limit.filter(_record(f"Connect to 127.0.0.1:1 failed (after {ms}ms)"))
    assert limit.filter(_record("Metadata request timed out")), "another message is not held back"
    assert limit.suppressed == 19
    clock.now = 161.0
    again = _record("Connect to 127.0.0.1:1 failed (after 3ms)")
    assert limit.filter(again)
    assert again.getMessage() == (
        "FAIL [rdkafka#p-1] Connect to 127.0.0.1:1 failed (after 3ms) (19 more like it in the last 61 s)"
    )
    clock.now += 1
    assert not limit.filter(_record("Connect to 127.0.0.1:1 failed (after 4ms)"))
    clock.now += 60
    quiet = _record("Connect to 127.0.0.1:1 failed (after 5ms)")
    assert limit.filter(quiet) and quiet.getMessage().endswith("(1 more like it in the last 61 s)")


def test_the_same_text_from_another_facility_is_another_message() -> None:
    limit = RateLimit(every_s=60, clock=Clock())
    assert limit.filter(_record("x", fac="FAIL"))
    assert limit.filter(_record("x", fac="ERROR"))


def test_the_logger_has_one_filter_however_often_it_is_asked_for() -> None:
    kafka_logger()
    kafka_logger()
    assert sum(isinstance(f, RateLimit) for f in logging.getLogger(KAFKA_LOGGER).filters) == 1
    assert with_kafka_logger({"a": "1"})["logger"] is logging.getLogger(KAFKA_LOGGER)
    mine = logging.getLogger("mine")
    assert with_kafka_logger({"logger": mine})["logger"] is mine, "a caller's own logger wins"


def _client_calls() -> list[tuple[str, int, ast.Call]]:
    calls = []
    for path in sorted((ROOT / "processor").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name in CLIENTS:
                    calls.append((str(path.relative_to(ROOT)), node.lineno, node))
    return calls


def test_every_client_the_project_creates_logs_through_python_logging() -> None:
    calls = _client_calls()
    # the apps' clients are built in one place, processor/kafka/factory.py (KafkaClients)
    assert len(calls) >= 3, "the walk found the clients"
    assert {where for where, _line, _call in calls} >= {"processor/kafka/factory.py"}
    unrouted = []
    for where, line, call in calls:
        first = call.args[0] if call.args else None
        routed = isinstance(first, ast.Call) and getattr(first.func, "id", "") == "with_kafka_logger"
        if not routed and where not in OWN_LOGGER:
            unrouted.append(f"{where}:{line}")
    assert unrouted == [], "pass the settings through with_kafka_logger (processor/kafka/rdlog.py)"


def test_an_unreachable_broker_is_logged_in_the_common_format_not_as_raw_librdkafka_lines() -> None:
    """A client polled for 3 s against a closed port: librdkafka retries about every 0.1-1 s, the
    log has one line per client and message, in the text format of processor/cli/logs.py."""
    script = textwrap.dedent(
        """
        import time
        from confluent_kafka import Consumer, Producer
        from processor.cli.logs import setup_logging
        from processor.kafka.rdlog import with_kafka_logger
        setup_logging("INFO", "text")
        conf = {"bootstrap.servers": "127.0.0.1:1", "reconnect.backoff.max.ms": "100"}
        producer = Producer(with_kafka_logger(conf))
        consumer = Consumer(with_kafka_logger({**conf, "group.id": "g"}))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            producer.poll(0.1)
            consumer.poll(0.1)
        consumer.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "%3|" not in done.stderr, done.stderr
    fails = [line for line in lines if "Connection refused" in line]
    assert 1 <= len(fails) <= 2, done.stderr  # one per client, however many retries there were
    for line in lines:
        assert " tokenfabric.kafka: " in line and line[:4].isdigit(), line
