"""A single-node Apache Kafka broker (KRaft) on loopback, for development, tests and CI.

Why this exists:

* Docker does not run on every machine this project is built on, so testcontainers cannot be the
  only way to get a broker. Java 17 and Maven are available, and Maven Central is reachable.
* The broker is started from the official ``org.apache.kafka:kafka_2.13`` jars. ``jars_dir()`` lets
  Maven copy them, plus an SLF4J binding the Kafka POM leaves out, into a cache *outside* the repo
  (``$TOKENFABRIC_CACHE`` or ``~/.cache/tokenfabric``). A marker file (the pom's SHA-256) records a
  complete copy, so every later call is offline and instant.
* ``start_broker()`` formats a fresh data directory and starts ``kafka.Kafka`` as a detached JVM.
  Every start is a new, empty cluster. The settings make transactions and consumer groups work on a
  single node (``transaction.state.log.*`` and ``offsets.topic.*`` at 1).
  ``auto.create.topics.enable`` is false because the project creates its topics explicitly, so a
  misspelt topic name fails instead of creating a topic.
* The broker outlives the Python process that started it. ``broker.json`` in the state directory
  records the pid and ports, and ``broker_status()`` and ``stop_broker()`` read it.

Run ``python -m processor kafka start|stop|status``. ``start`` prints
``bootstrap=127.0.0.1:PORT`` on stdout and also resolves the jars. See docs/kafka-local.md for the
measured figures and pitfalls.

Extra JVM flags can be passed with ``$TOKENFABRIC_KAFKA_JVM_OPTS``. For example, if the temp dir is
mounted noexec, zstd/snappy cannot load their native code, and
``-Djava.io.tmpdir=/some/exec/dir`` fixes it.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processor.kafka.config import ConfigError
from processor.kafka.factory import KAFKA, AdminClientLike
from processor.local.broker_files import (
    HOST,
    NODE_ID,
    Ports,
    format_storage,
    java_executable,
    jvm_logging_opts,
    pick_ports,
    random_cluster_id,
    reset_dirs,
    write_properties,
)
from processor.local.jars import KAFKA_VERSION, KafkaLocalError, jars_dir, write_atomic
from processor.local.processes import (
    CHILDREN,
    is_our_java,
    log_tail,
    read_log,
    terminate,
    wait_exit,
)
from processor.local.sasl import SaslSetup
from processor.local.secure import ADMIN_USER, LISTENERS, TLS, SecureSetup

_STATE_FILE = "broker.json"

_MAX_START_ATTEMPTS = 5  # new ports after a bind failure: picking a free port and binding it race

log = logging.getLogger(__name__)

__all__ = [
    "HOST",
    "BrokerInfo",
    "broker_status",
    "default_state_dir",
    "freeze_broker",
    "java_executable",
    "local_bootstrap",
    "restart_broker",
    "start_broker",
    "stop_broker",
]


class _BindError(KafkaLocalError):
    """The broker exited because one of its ports was taken."""


@dataclass(frozen=True)
class BrokerInfo:
    bootstrap: str
    pid: int
    data_dir: Path
    log_dir: Path
    security_protocol: str = "PLAINTEXT"
    """``SASL_PLAINTEXT`` when started with ``sasl_users`` (clients must then log in), ``SASL_SSL``
    when secured (``secure_users``: processor.local.secure)."""
    listeners: Mapping[str, str] = field(default_factory=dict)
    """A secured broker's bootstrap per client listener (``SASL_SSL``, ``SSL``, ``SASL_PLAINTEXT``)."""
    secure: SecureSetup | None = field(default=None, repr=False, compare=False)
    """The CA, certificates and passwords of a secured broker, as :func:`start_broker` made them."""

    def client_conf(self, user: str = ADMIN_USER, listener: str = TLS) -> dict[str, str]:
        """librdkafka settings that connect to this secured broker as ``user`` through ``listener``."""
        if self.secure is None:
            raise KafkaLocalError("client_conf: this broker was not started secured by this process")
        return self.secure.client_conf(user, listener, self.listeners[listener])


def default_state_dir() -> Path:
    """State of the CLI's broker: ``$TOKENFABRIC_HOME/kafka`` or ``~/.cache/tokenfabric/run/kafka``."""
    env = os.environ.get("TOKENFABRIC_HOME")
    if env:
        return Path(env).expanduser() / "kafka"
    return Path.home() / ".cache" / "tokenfabric" / "run" / "kafka"


def local_bootstrap() -> str:
    """The bootstrap of the broker ``tokenfabric kafka start`` left running, for commands given no other.

    Raises :class:`~processor.kafka.config.ConfigError`, saying every way to name a cluster, if none runs.
    """
    info = broker_status(default_state_dir())
    if info is None:
        raise ConfigError(
            "no Kafka to talk to: pass --bootstrap HOST:PORT, set KAFKA_BOOTSTRAP, "
            "or start a local broker with 'tokenfabric kafka start'"
        )
    return info.bootstrap


def start_broker(
    state_dir: Path,
    *,
    port: int | None = None,
    heap_mb: int = 768,
    timeout_s: float = 120,
    sasl_users: Mapping[str, str] | None = None,
    secure_users: Mapping[str, str | None] | Iterable[str] | None = None,
    expired_users: Iterable[str] = (),
    version: str = KAFKA_VERSION,
) -> BrokerInfo:
    """Start a fresh single-node broker whose files live in *state_dir*, and wait until it serves.

    *port* is the client port (default: a free one). The controller port is always picked free.
    *timeout_s* bounds the wait for readiness, not the one-off jar download, a secured broker's
    certificates nor the storage format before it.
    *sasl_users* (user name -> password) makes the client listener ``SASL_PLAINTEXT`` with the
    ``PLAIN`` mechanism: only those users (and the broker's own, random, inter-broker user) may
    connect. That is for testing how clients log in; PLAIN over plaintext sends the password in the
    clear, so a real cluster uses ``SASL_SSL``. The controller listener stays ``PLAINTEXT`` on loopback.
    *secure_users* (user names, or names -> passwords; random where None) secures the broker instead
    (processor.local.secure): TLS, mutual TLS and SCRAM-SHA-512 listeners, a throwaway CA, a client
    certificate and SCRAM login per user (``expired_users`` get an expired certificate), and the
    authorizer, which denies what no ACL allows; ``bootstrap`` is then the ``SASL_SSL`` listener and
    ``listeners`` names all three. *port*, if given, is that first listener's. *version*: another
    Kafka release (processor.local.jars.jars_dir; the upgrade test starts 4.1.2).
    Raises KafkaLocalError if a broker of this state dir is already running, if the JVM exits
    (the message carries the first errors and the tail of its log), or if it is not ready in time.
    """
    state_dir = Path(state_dir).resolve()
    running = broker_status(state_dir)
    if running is not None:
        raise KafkaLocalError(f"a broker is already running for {state_dir}: {running.bootstrap}")
    if sasl_users is not None and secure_users is not None:
        raise KafkaLocalError(
            "start_broker: sasl_users (PLAIN) and secure_users (SCRAM, TLS) exclude each other"
        )
    sasl = SaslSetup.create(sasl_users) if sasl_users is not None else None
    jars = jars_dir(version)
    java = java_executable()
    data_dir, log_dir = state_dir / "data", state_dir / "logs"
    reset_dirs(state_dir, data_dir, log_dir)
    secure = (
        SecureSetup.create(state_dir / "security", secure_users, expired=expired_users)
        if secure_users is not None
        else None
    )
    cluster_id = random_cluster_id()
    props = state_dir / "server.properties"
    ports = pick_ports(port, len(LISTENERS) if secure else 1)
    write_properties(props, data_dir, ports=ports, sasl=sasl, secure=secure)
    # Formatting does not record the ports (static quorum), so one format serves every attempt.
    format_storage(java, jars, props, cluster_id, log_dir, secure.format_args() if secure else [])
    deadline = time.monotonic() + timeout_s  # the broker's own start: certificates take what they take
    for attempt in range(1, _MAX_START_ATTEMPTS + 1):
        try:
            return _launch_and_wait(
                state_dir, java, jars, props, cluster_id, ports, heap_mb, deadline, sasl, secure, version
            )
        except _BindError as exc:
            if port is not None or attempt == _MAX_START_ATTEMPTS:
                raise KafkaLocalError(str(exc)) from exc
            log.warning("port taken (attempt %d), retrying with other ports", attempt)
        ports = pick_ports(port, len(ports.clients))
        write_properties(props, data_dir, ports=ports, sasl=sasl, secure=secure)
    raise AssertionError("unreachable")


def _launch_and_wait(
    state_dir: Path,
    java: str,
    jars: Path,
    props: Path,
    cluster_id: str,
    ports: Ports,
    heap_mb: int,
    deadline: float,
    sasl: SaslSetup | None = None,
    secure: SecureSetup | None = None,
    version: str = KAFKA_VERSION,
) -> BrokerInfo:
    """Start the JVM, record it in the state file, and wait until it serves (or kill it)."""
    data_dir, log_dir = state_dir / "data", state_dir / "logs"
    for name in ("stdout.log", "server.log"):  # a previous run's bind error must not count again,
        if (log_dir / name).exists():  # and its last lines stay readable (server.previous.log)
            (log_dir / name).replace(log_dir / name.replace(".log", ".previous.log"))
    started = time.monotonic()
    with (log_dir / "stdout.log").open("ab") as out:
        proc = subprocess.Popen(
            _jvm_command(java, jars, props, heap_mb, log_dir), cwd=state_dir, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: no Ctrl-C from the terminal, outlives this process
        )  # fmt: skip
    CHILDREN[proc.pid] = proc
    protocol = "PLAINTEXT" if sasl is None else "SASL_PLAINTEXT"
    listeners: dict[str, str] = {}
    if secure is not None:
        protocol = TLS
        listeners = {name: f"{HOST}:{p}" for name, p in zip(LISTENERS, ports.clients, strict=True)}
        secure.write_client_files(listeners)
    info = BrokerInfo(
        bootstrap=f"{HOST}:{ports.client}",
        pid=proc.pid,
        data_dir=data_dir,
        log_dir=log_dir,
        security_protocol=protocol,
        listeners=listeners,
        secure=secure,
    )
    # Written before waiting, so that `stop` finds the JVM even if this process is interrupted.
    _write_state(state_dir, info, ports, cluster_id, props, version)
    try:
        ready_conf = sasl.client_conf() if sasl else info.client_conf() if secure else {}
        _wait_ready(proc, ports.client, log_dir, deadline, ready_conf)
    except BaseException:
        terminate(proc.pid, timeout_s=1)  # a failed instance: no need for a clean shutdown
        (state_dir / _STATE_FILE).unlink(missing_ok=True)
        raise
    log.info("Kafka %s ready at %s in %.1f s (pid %d)", version, info.bootstrap,
             time.monotonic() - started, proc.pid)  # fmt: skip
    return info


def _jvm_command(java: str, jars: Path, props: Path, heap_mb: int, log_dir: Path) -> list[str]:
    return [
        java, f"-Xms{min(256, heap_mb)}m", f"-Xmx{heap_mb}m", "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20", "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
        *jvm_logging_opts(log_dir), *shlex.split(os.environ.get("TOKENFABRIC_KAFKA_JVM_OPTS", "")),
        "-cp", f"{jars}{os.sep}*", "kafka.Kafka", str(props),
    ]  # fmt: skip


def _write_state(
    state_dir: Path,
    info: BrokerInfo,
    ports: Ports,
    cluster_id: str,
    props: Path,
    version: str = KAFKA_VERSION,
) -> None:
    """``broker.json``: what status, stop and restart read back (never a password)."""
    record = {
        "bootstrap": info.bootstrap,
        "pid": info.pid,
        "client_port": ports.client,
        "controller_port": ports.controller,
        "cluster_id": cluster_id,
        "kafka_version": version,
        "security_protocol": info.security_protocol,  # never a password: this file is read by status
        "listeners": dict(info.listeners),
        "state_dir": str(state_dir),
        "data_dir": str(info.data_dir),
        "log_dir": str(info.log_dir),
        "properties": str(props),
        "started_at": time.time(),
    }
    write_atomic(state_dir / _STATE_FILE, json.dumps(record, indent=2) + "\n")


def _wait_ready(
    proc: subprocess.Popen[bytes],
    client_port: int,
    log_dir: Path,
    deadline: float,
    client_conf: Mapping[str, str],
) -> None:
    """Poll until the client listener accepts and answers a metadata request."""
    # The client listener opens only once the broker has registered with the controller and is unfenced,
    # so a TCP connect is the cheap first check. The metadata request confirms it serves clients.

    admin: AdminClientLike | None = None
    last_error = "listener not open yet"
    while True:
        code = proc.poll()
        if _is_bind_failure(log_dir):  # the JVM takes ~10 s to exit after this; the caller kills it
            raise _BindError(f"the Kafka JVM could not bind its ports:\n{log_tail(log_dir)}")
        if code is not None:
            raise KafkaLocalError(
                f"the Kafka JVM exited with code {code} during start-up:\n{log_tail(log_dir)}"
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaLocalError(
                f"Kafka not ready on {HOST}:{client_port} before the timeout ({last_error}):\n"
                f"{log_tail(log_dir)}"
            )
        if _tcp_open(HOST, client_port):
            if admin is None:
                admin = KAFKA.admin(
                    {"bootstrap.servers": f"{HOST}:{client_port}", "log_level": 3, **client_conf}
                )
            try:
                metadata = admin.list_topics(timeout=min(5.0, max(remaining, 0.1)))
            except Exception as exc:  # KafkaException mostly; keep waiting until the deadline
                last_error = f"metadata request failed: {exc}"
            else:
                if NODE_ID in metadata.brokers:
                    return
                last_error = f"metadata lists brokers {sorted(metadata.brokers)}"
        time.sleep(0.2)


def _tcp_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _is_bind_failure(log_dir: Path) -> bool:
    text = read_log(log_dir / "server.log") + read_log(log_dir / "stdout.log")
    return "Socket server failed to bind" in text or "java.net.BindException" in text


def broker_status(state_dir: Path) -> BrokerInfo | None:
    """The broker of *state_dir* if its recorded pid is alive and is that broker's JVM, else None."""
    record = _read_state(Path(state_dir).resolve())
    if record is None:
        return None
    pid = int(record["pid"])
    if not is_our_java(pid, str(record.get("properties", ""))):
        return None
    return BrokerInfo(
        bootstrap=str(record["bootstrap"]),
        pid=pid,
        data_dir=Path(record["data_dir"]),
        log_dir=Path(record["log_dir"]),
        security_protocol=str(record.get("security_protocol", "PLAINTEXT")),
        listeners=dict(record.get("listeners") or {}),
    )


def stop_broker(state_dir: Path, timeout_s: float = 30) -> bool:
    """Stop the broker of *state_dir*: SIGTERM, then SIGKILL after *timeout_s*. True if one was running."""
    state_dir = Path(state_dir).resolve()
    info = broker_status(state_dir)
    if info is not None:
        terminate(info.pid, timeout_s)
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    return info is not None


def restart_broker(
    state_dir: Path,
    *,
    kill: bool = False,
    heap_mb: int = 768,
    timeout_s: float = 120,
    version: str | None = None,
) -> BrokerInfo:
    """Stop the broker of *state_dir* and start it again on the same ports with its data kept, as an
    operator's restart (or, with *kill*, a crash) would: for fault tests of client reconnection.
    *version*: start that Kafka release instead of the one that ran (an upgrade in place; default:
    the same). Brokers started with *sasl_users* or *secure_users* are not supported."""
    state_dir = Path(state_dir).resolve()
    record = _read_state(state_dir)
    info = broker_status(state_dir)
    if record is None or info is None:
        raise KafkaLocalError(f"no running broker for {state_dir} to restart")
    if info.security_protocol != "PLAINTEXT":
        raise KafkaLocalError("restart_broker supports PLAINTEXT brokers only")
    if kill:
        os.kill(info.pid, signal.SIGKILL)
        wait_exit(info.pid, 10.0)
    else:
        terminate(info.pid, timeout_s=30)
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    version = version or str(record.get("kafka_version", KAFKA_VERSION))
    return _launch_and_wait(
        state_dir,
        java_executable(),
        jars_dir(version),
        Path(record["properties"]),
        str(record["cluster_id"]),
        Ports((int(record["client_port"]),), int(record["controller_port"])),
        heap_mb,
        time.monotonic() + timeout_s,
        version=version,
    )


def freeze_broker(state_dir: Path, seconds: float, *, restart: bool = False) -> float:
    """Freeze the broker of *state_dir* (SIGSTOP) for *seconds*, then let it go on (SIGCONT) or, with
    *restart*, kill it and start it again on the same ports with its data: a hung broker, or one that
    hangs and is then replaced, for outage tests. Clients see open connections that answer nothing.
    Returns how long the broker answered nothing (to the moment it serves again)."""
    state_dir = Path(state_dir).resolve()
    info = broker_status(state_dir)
    if info is None:
        raise KafkaLocalError(f"no running broker for {state_dir} to freeze")
    began = time.monotonic()
    os.kill(info.pid, signal.SIGSTOP)
    time.sleep(seconds)
    if restart:
        restart_broker(state_dir, kill=True)
    else:
        os.kill(info.pid, signal.SIGCONT)
    return time.monotonic() - began


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((state_dir / _STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", state_dir / _STATE_FILE, exc)
        return None
    return record if isinstance(record, dict) and "pid" in record else None
