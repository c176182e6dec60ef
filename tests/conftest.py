"""Shared pytest fixtures.

``kafka_bootstrap`` gives tests marked ``@pytest.mark.kafka`` a real broker, once per session.
Where it comes from, in order:

1. ``$KAFKA_BOOTSTRAP`` (e.g. ``127.0.0.1:9092``): a broker someone else runs, such as the one from
   ``python -m processor kafka start`` or a CI service. Nothing is started or stopped.
2. Docker, if ``docker info`` succeeds and testcontainers is installed: a throwaway KRaft container.
   This path is not exercised on the project's build machines, which have no Docker. The image is
   Confluent's (Kafka 3.9), not the 4.4 broker that processor.local.broker runs.
3. Otherwise ``processor.local.broker.start_broker`` in a temp dir: Apache Kafka from the Maven Central
   jars on Java 17. The first run downloads them into ``~/.cache/tokenfabric``, after that it needs no
   network. The broker is stopped when the session ends. Under pytest-xdist (``./run test`` runs
   ``-n 3 --dist loadgroup``) the first worker that needs it starts one broker for all of them, under a
   file lock in the run's shared temp dir, and the controller stops it at the end.

Parallel runs: every broker test makes its own topic prefix and group ids, so tests share the broker.
The few that cannot run beside others are grouped in tests/xdist_groups.py.

Every test that needs a broker lives in ``tests/broker/`` and is marked ``kafka``; every other folder
mirrors a package of ``processor/`` and needs none. Collection fails if a test breaks that rule (see
``pytest_collection_modifyitems``). Run what needs no broker with ``--ignore=tests/broker`` (or
``-m "not kafka"``: the same tests).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Confluent Platform 7.9 = Apache Kafka 3.9, the last cp-kafka line testcontainers' KafkaContainer supports.
_DOCKER_IMAGE = "confluentinc/cp-kafka:7.9.0"


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a single-node Kafka broker that supports transactions and consumer groups."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
    elif _docker_usable():
        yield from _container_bootstrap()
    else:
        yield from _local_bootstrap(tmp_path_factory)


def _local_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker from the jars: this session's own, or under xdist the one all workers share."""
    from processor.local.broker import start_broker, stop_broker

    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        state_dir = tmp_path_factory.mktemp("kafka")
        info = start_broker(state_dir, heap_mb=512)
        try:
            yield info.bootstrap
        finally:
            stop_broker(state_dir)
        return
    shared = tmp_path_factory.getbasetemp().parent  # the controller's basetemp: one per run
    with open(shared / "kafka.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = shared / "kafka.bootstrap"
        if not found.exists():
            found.write_text(start_broker(shared / _SHARED_BROKER, heap_mb=512).bootstrap)
        bootstrap = found.read_text()
    yield bootstrap


_SHARED_BROKER = "kafka-shared"


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Confluent-compatible base URL of a real schema registry: ``$SCHEMA_REGISTRY_URL`` if set,
    else a local Apicurio Registry of this session (processor/local/registry.py; built once per
    machine). The registry tests share one xdist group (tests/xdist_groups.py), so one worker starts it."""
    external = os.environ.get("SCHEMA_REGISTRY_URL")
    if external:
        yield external
        return
    from processor.local.registry import start_registry, stop_registry

    state_dir = tmp_path_factory.mktemp("registry")
    info = start_registry(state_dir)
    try:
        yield info.url
    finally:
        stop_registry(state_dir)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller stops the broker its workers shared (if one of them started it)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is not None or not hasattr(session.config, "_tmp_path_factory"):
        return
    state_dir = session.config._tmp_path_factory.getbasetemp() / _SHARED_BROKER
    if state_dir.exists():
        from processor.local.broker import stop_broker

        stop_broker(state_dir)


def _docker_usable() -> bool:
    if shutil.which("docker") is None or importlib.util.find_spec("testcontainers") is None:
        return False
    try:
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _container_bootstrap() -> Iterator[str]:
    from testcontainers.community.kafka import KafkaContainer

    container = (
        KafkaContainer(_DOCKER_IMAGE)
        .with_kraft()
        # the container defaults to 3 replicas for the transaction log, which one broker cannot host
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    )
    with container:
        yield container.get_bootstrap_server()


_BROKER_TESTS = Path(__file__).resolve().parent / "broker"


_TERMINAL = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: unknown where xdist is not loaded
def pytest_configure_node(node: Any) -> None:
    """xdist (controller): hand each worker the terminal variables as this process has them."""
    node.workerinput["terminal_env"] = {name: os.environ.get(name) for name in _TERMINAL}


def pytest_sessionstart(session: pytest.Session) -> None:
    """An xdist worker imports GNU readline, which sets ``COLUMNS=80`` and ``LINES=24``; the commands'
    tables fold to that width (``shutil.get_terminal_size``), unlike in a run without workers. Put
    back what the controller had."""
    terminal = getattr(session.config, "workerinput", {}).get("terminal_env")
    for name, value in (terminal or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` with the groups of tests/xdist_groups.py (who may run beside whom)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_groups import scheduler

    return scheduler(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``kafka`` marker and the ``tests/broker/`` folder go together: a broker test elsewhere would
    run in the broker-free suite, a broker-free one in tests/broker would be skipped by it."""
    misplaced = []
    for item in items:
        in_broker = _BROKER_TESTS in item.path.resolve().parents
        if in_broker != (item.get_closest_marker("kafka") is not None):
            where = "not marked kafka" if in_broker else "marked kafka outside tests/broker/"
            misplaced.append(f"{item.nodeid}: {where}")
    if misplaced:
        raise pytest.UsageError("tests in the wrong folder:\n" + "\n".join(misplaced))
