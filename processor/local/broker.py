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

Run ``python -m processor.local.broker start|stop|status``. ``start`` prints
``bootstrap=127.0.0.1:PORT`` on stdout and also resolves the jars. See docs/kafka-local.md for the
measured figures and pitfalls.

Extra JVM flags can be passed with ``$TOKENFABRIC_KAFKA_JVM_OPTS``. For example, if the temp dir is
mounted noexec, zstd/snappy cannot load their native code, and
``-Djava.io.tmpdir=/some/exec/dir`` fixes it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processor.kafka.config import ConfigError

KAFKA_VERSION = "4.1.2"  # keep in step with <kafka.version> in processor/local/data/pom.xml
HOST = "127.0.0.1"  # bind and advertise the IPv4 loopback address, never "localhost"
NODE_ID = 1

_PACKAGE_KAFKA_DIR = Path(__file__).resolve().with_name("data")
_POM = _PACKAGE_KAFKA_DIR / "pom.xml"
_LOG4J_CONFIG = _PACKAGE_KAFKA_DIR / "log4j2.xml"
_COPY_DEPENDENCIES = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
_STATE_FILE = "broker.json"
_MAX_START_ATTEMPTS = 5  # new ports after a bind failure: picking a free port and binding it race
_MVN_TIMEOUT_S = 900.0

log = logging.getLogger(__name__)


class KafkaLocalError(RuntimeError):
    """The local broker could not be set up, started or stopped."""


class _BindError(KafkaLocalError):
    """The broker exited because one of its ports was taken."""


@dataclass(frozen=True)
class BrokerInfo:
    bootstrap: str
    pid: int
    data_dir: Path
    log_dir: Path
    security_protocol: str = "PLAINTEXT"
    """``SASL_PLAINTEXT`` when started with ``sasl_users`` (clients must then log in)."""


# Popen handles of brokers started by this process, kept so that they can be reaped (no zombies)
# and so that no "subprocess still running" ResourceWarning is raised when the handle is collected.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


# --------------------------------------------------------------------------- paths


def cache_root() -> Path:
    """Where downloaded artefacts are cached: ``$TOKENFABRIC_CACHE`` or ``~/.cache/tokenfabric``."""
    env = os.environ.get("TOKENFABRIC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tokenfabric"


def default_state_dir() -> Path:
    """State of the CLI's broker: ``$TOKENFABRIC_HOME/kafka`` or ``~/.cache/tokenfabric/run/kafka``."""
    env = os.environ.get("TOKENFABRIC_HOME")
    if env:
        return Path(env).expanduser() / "kafka"
    return Path.home() / ".cache" / "tokenfabric" / "run" / "kafka"


# --------------------------------------------------------------------------- jars


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


def jars_dir() -> Path:
    """Return the folder that holds every runtime jar of the broker, resolving it with Maven if needed.

    The jars are in ``<cache_root>/kafka-<version>/lib``. The folder counts as complete when the marker
    file next to it holds the SHA-256 of the packaged pom. Until then, ``mvn copy-dependencies`` fills
    a staging folder that then replaces ``lib``. A file lock keeps concurrent callers from racing.
    """
    home = cache_root() / f"kafka-{KAFKA_VERSION}"
    lib = home / "lib"
    marker = home / "lib.complete"
    digest = hashlib.sha256(_POM.read_bytes()).hexdigest()
    if _marker_matches(marker, digest) and lib.is_dir():
        return lib
    home.mkdir(parents=True, exist_ok=True)
    with _file_lock(home / ".lock"):
        if _marker_matches(marker, digest) and lib.is_dir():  # another process finished meanwhile
            return lib
        marker.unlink(missing_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=home))
        try:
            _copy_dependencies(staging)
            if lib.exists():
                shutil.rmtree(lib)
            (staging / "lib").rename(lib)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _write_atomic(marker, digest + "\n")
    return lib


def _copy_dependencies(staging: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLocalError(
            f"Maven (mvn) is not on PATH: it is needed once to download the Kafka {KAFKA_VERSION} jars"
        )
    # Work on a copy of the pom: the installed package may be read-only.
    shutil.copyfile(_POM, staging / "pom.xml")
    cmd = [
        mvn, "-B", "-q", "-f", str(staging / "pom.xml"), _COPY_DEPENDENCIES,
        "-DincludeScope=runtime", f"-DoutputDirectory={staging / 'lib'}",
    ]  # fmt: skip
    log.info("resolving Kafka %s jars with Maven (one-off) ...", KAFKA_VERSION)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=staging, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaLocalError(f"mvn did not finish within {_MVN_TIMEOUT_S:.0f} s: {shlex.join(cmd)}") from exc
    if proc.returncode != 0 or not any((staging / "lib").glob("kafka_2.13-*.jar")):
        output = _tail_text(proc.stdout + proc.stderr, 40)
        raise KafkaLocalError(f"mvn failed (exit {proc.returncode}): {shlex.join(cmd)}\n{output}")
    log.info("Kafka jars resolved in %.1f s", time.monotonic() - started)


def _marker_matches(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


# --------------------------------------------------------------------------- start


def start_broker(
    state_dir: Path,
    *,
    port: int | None = None,
    heap_mb: int = 768,
    timeout_s: float = 120,
    sasl_users: Mapping[str, str] | None = None,
) -> BrokerInfo:
    """Start a fresh single-node broker whose files live in *state_dir*, and wait until it serves.

    *port* is the client port (default: a free one). The controller port is always picked free.
    *timeout_s* bounds the wait for readiness, not the one-off jar download before it.
    *sasl_users* (user name -> password) makes the client listener ``SASL_PLAINTEXT`` with the
    ``PLAIN`` mechanism: only those users (and the broker's own, random, inter-broker user) may
    connect. That is for testing how clients log in; PLAIN over plaintext sends the password in the
    clear, so a real cluster uses ``SASL_SSL``. The controller listener stays ``PLAINTEXT`` on loopback.
    Raises KafkaLocalError if a broker of this state dir is already running, if the JVM exits
    (the message carries the first errors and the tail of its log), or if it is not ready in time.
    """
    state_dir = Path(state_dir).resolve()
    running = broker_status(state_dir)
    if running is not None:
        raise KafkaLocalError(f"a broker is already running for {state_dir}: {running.bootstrap}")
    sasl = _SaslSetup.create(sasl_users) if sasl_users is not None else None
    jars = jars_dir()
    java = _java_executable()
    deadline = time.monotonic() + timeout_s
    data_dir, log_dir = state_dir / "data", state_dir / "logs"
    _reset_dirs(state_dir, data_dir, log_dir)
    cluster_id = _random_cluster_id()
    props = state_dir / "server.properties"
    client_port, controller_port = _pick_ports(port)
    _write_properties(props, data_dir, client_port=client_port, controller_port=controller_port, sasl=sasl)
    # Formatting does not record the ports (static quorum), so one format serves every attempt.
    _format_storage(java, jars, props, cluster_id, log_dir)
    for attempt in range(1, _MAX_START_ATTEMPTS + 1):
        try:
            return _launch_and_wait(
                state_dir,
                java,
                jars,
                props,
                cluster_id,
                client_port,
                controller_port,
                heap_mb,
                deadline,
                sasl,
            )
        except _BindError as exc:
            if port is not None or attempt == _MAX_START_ATTEMPTS:
                raise KafkaLocalError(str(exc)) from exc
            log.warning("port taken (attempt %d), retrying with other ports", attempt)
        client_port, controller_port = _pick_ports(port)
        _write_properties(
            props, data_dir, client_port=client_port, controller_port=controller_port, sasl=sasl
        )
    raise AssertionError("unreachable")


_SASL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_BROKER_USER = "tokenfabric-broker"


@dataclass(frozen=True)
class _SaslSetup:
    """The PLAIN users of a SASL broker, plus the broker's own login for inter-broker requests."""

    users: dict[str, str] = field(repr=False)
    broker_user: str
    broker_password: str = field(repr=False)

    @classmethod
    def create(cls, users: Mapping[str, str]) -> _SaslSetup:
        for name, password in users.items():
            # The JAAS line quotes values with '"' and has no escapes; a property file reads '\\'.
            if not _SASL_NAME.match(name) or name == _BROKER_USER:
                raise KafkaLocalError(
                    f"SASL user name {name!r}: use 1-64 of A-Z a-z 0-9 . _ -, not {_BROKER_USER!r}"
                )
            if not password or any(c in password for c in '"\\;\n\r'):
                raise KafkaLocalError(f"SASL password of {name!r}: non-empty, without quotes, \\ or ;")
        return cls(dict(users), _BROKER_USER, secrets.token_hex(16))

    def jaas(self) -> str:
        accounts = {self.broker_user: self.broker_password, **self.users}
        users = " ".join(f'user_{name}="{password}"' for name, password in accounts.items())
        return (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{self.broker_user}" password="{self.broker_password}" {users};'
        )

    def client_conf(self) -> dict[str, str]:
        """librdkafka settings that log in as the broker's own user (its readiness check)."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": self.broker_user,
            "sasl.password": self.broker_password,
        }


def _launch_and_wait(
    state_dir: Path,
    java: str,
    jars: Path,
    props: Path,
    cluster_id: str,
    client_port: int,
    controller_port: int,
    heap_mb: int,
    deadline: float,
    sasl: _SaslSetup | None = None,
) -> BrokerInfo:
    data_dir, log_dir = state_dir / "data", state_dir / "logs"
    cmd = [
        java, f"-Xms{min(256, heap_mb)}m", f"-Xmx{heap_mb}m", "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20", "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
        *_jvm_logging_opts(log_dir), *shlex.split(os.environ.get("TOKENFABRIC_KAFKA_JVM_OPTS", "")),
        "-cp", f"{jars}{os.sep}*", "kafka.Kafka", str(props),
    ]  # fmt: skip
    for name in ("stdout.log", "server.log"):  # a previous attempt's bind error must not count again
        (log_dir / name).unlink(missing_ok=True)
    started = time.monotonic()
    with (log_dir / "stdout.log").open("ab") as out:
        proc = subprocess.Popen(
            cmd, cwd=state_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: no Ctrl-C from the terminal, outlives this process
        )  # fmt: skip
    _CHILDREN[proc.pid] = proc
    bootstrap = f"{HOST}:{client_port}"
    protocol = "PLAINTEXT" if sasl is None else "SASL_PLAINTEXT"
    info = BrokerInfo(
        bootstrap=bootstrap, pid=proc.pid, data_dir=data_dir, log_dir=log_dir, security_protocol=protocol
    )
    # Written before waiting, so that `stop` finds the JVM even if this process is interrupted.
    _write_atomic(
        state_dir / _STATE_FILE,
        json.dumps(
            {
                "bootstrap": bootstrap,
                "pid": proc.pid,
                "client_port": client_port,
                "controller_port": controller_port,
                "cluster_id": cluster_id,
                "kafka_version": KAFKA_VERSION,
                "security_protocol": protocol,  # never a password: this file is read by status
                "state_dir": str(state_dir),
                "data_dir": str(data_dir),
                "log_dir": str(log_dir),
                "properties": str(props),
                "started_at": time.time(),
            },
            indent=2,
        )
        + "\n",
    )
    try:
        _wait_ready(proc, client_port, log_dir, deadline, sasl.client_conf() if sasl else {})
    except BaseException:
        _terminate(proc.pid, timeout_s=1)  # a failed instance: no need for a clean shutdown
        (state_dir / _STATE_FILE).unlink(missing_ok=True)
        raise
    log.info("Kafka %s ready at %s in %.1f s (pid %d)", KAFKA_VERSION, bootstrap,
             time.monotonic() - started, proc.pid)  # fmt: skip
    return info


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
    from confluent_kafka.admin import AdminClient  # deferred: `stop`/`status` must not need it

    admin: AdminClient | None = None
    last_error = "listener not open yet"
    while True:
        code = proc.poll()
        if _is_bind_failure(log_dir):  # the JVM takes ~10 s to exit after this; the caller kills it
            raise _BindError(f"the Kafka JVM could not bind its ports:\n{_log_tail(log_dir)}")
        if code is not None:
            raise KafkaLocalError(
                f"the Kafka JVM exited with code {code} during start-up:\n{_log_tail(log_dir)}"
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaLocalError(
                f"Kafka not ready on {HOST}:{client_port} before the timeout ({last_error}):\n"
                f"{_log_tail(log_dir)}"
            )
        if _tcp_open(HOST, client_port):
            if admin is None:
                admin = AdminClient(
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
    text = _read_log(log_dir / "server.log") + _read_log(log_dir / "stdout.log")
    return "Socket server failed to bind" in text or "java.net.BindException" in text


def _reset_dirs(state_dir: Path, data_dir: Path, log_dir: Path) -> None:
    """A formatted data dir refuses a second format, so every start gets a clean one."""
    state_dir.mkdir(parents=True, exist_ok=True)
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir()
    log_dir.mkdir(exist_ok=True)
    for old in log_dir.glob("*.log"):  # logs of the previous instance
        old.unlink()


def _random_cluster_id() -> str:
    """A cluster id as ``kafka.tools.StorageTool random-uuid`` makes it, without a JVM start (~0.8 s).

    Kafka's Uuid.randomUuid(): 16 random bytes, base64url without padding, re-drawn if the text
    starts with '-' (reserved values ZERO and ONE cannot come out of uuid4, which fixes version bits).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def _write_properties(
    props: Path, data_dir: Path, *, client_port: int, controller_port: int, sasl: _SaslSetup | None = None
) -> None:
    settings: dict[str, str | int] = {
        "process.roles": "broker,controller",
        "node.id": NODE_ID,
        "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{client_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{client_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        # One node: every internal topic must ask for a single replica, or it cannot be created.
        # Without the transaction.state.log.* pair init_transactions() times out.
        "num.partitions": 1,
        "default.replication.factor": 1,
        "min.insync.replicas": 1,
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 1,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 1,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "group.initial.rebalance.delay.ms": 0,
        # The project creates its topics explicitly; a typo should fail, not create a topic.
        "auto.create.topics.enable": "false",
        # Small machine (2 cores): fewer threads, smaller cleaner buffer than the defaults.
        "num.network.threads": 2,
        "num.io.threads": 4,
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
    }
    if sasl is not None:
        # One client listener, SASL_PLAINTEXT: clients and the broker's own inter-broker requests
        # (transaction markers go to the partition leader, itself) must log in.
        settings.update(
            {
                "listeners": f"SASL_PLAINTEXT://{HOST}:{client_port},CONTROLLER://{HOST}:{controller_port}",
                "advertised.listeners": f"SASL_PLAINTEXT://{HOST}:{client_port}",
                "inter.broker.listener.name": "SASL_PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": "PLAIN",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": sasl.jaas(),
            }
        )
    lines = [f"# written by processor/local/broker.py for Kafka {KAFKA_VERSION}"]
    lines += [f"{key}={value}" for key, value in settings.items()]
    _write_atomic(props, "\n".join(lines) + "\n")
    if sasl is not None:
        props.chmod(0o600)  # it holds the users' passwords


def _format_storage(java: str, jars: Path, props: Path, cluster_id: str, log_dir: Path) -> None:
    cmd = [
        java, *_jvm_logging_opts(log_dir), "-cp", f"{jars}{os.sep}*",
        "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        output = _tail_text(proc.stdout + proc.stderr, 30)
        raise KafkaLocalError(f"kafka-storage format failed (exit {proc.returncode}):\n{output}")


def _jvm_logging_opts(log_dir: Path) -> list[str]:
    return [f"-Dkafka.logs.dir={log_dir}", f"-Dlog4j2.configurationFile={_LOG4J_CONFIG}"]


def _java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaLocalError("java is not on PATH (nor in $JAVA_HOME): the Kafka broker needs Java 17+")
    return java


def _pick_ports(client_port: int | None) -> tuple[int, int]:
    """(client, controller) ports: *client_port* if given, else free ones; never the same twice."""
    client = client_port or _free_port()
    return client, _free_port(avoid=client)


def _free_port(avoid: int | None = None) -> int:
    """A loopback port that is free right now (it can be taken before the broker binds it)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port != avoid:
            return port


# --------------------------------------------------------------------------- status / stop


def broker_status(state_dir: Path) -> BrokerInfo | None:
    """The broker of *state_dir* if its recorded pid is alive and is that broker's JVM, else None."""
    record = _read_state(Path(state_dir).resolve())
    if record is None:
        return None
    pid = int(record["pid"])
    if not _is_our_java(pid, str(record.get("properties", ""))):
        return None
    return BrokerInfo(
        bootstrap=str(record["bootstrap"]),
        pid=pid,
        data_dir=Path(record["data_dir"]),
        log_dir=Path(record["log_dir"]),
        security_protocol=str(record.get("security_protocol", "PLAINTEXT")),
    )


def stop_broker(state_dir: Path, timeout_s: float = 30) -> bool:
    """Stop the broker of *state_dir*: SIGTERM, then SIGKILL after *timeout_s*. True if one was running."""
    state_dir = Path(state_dir).resolve()
    info = broker_status(state_dir)
    if info is not None:
        _terminate(info.pid, timeout_s)
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    return info is not None


def restart_broker(
    state_dir: Path, *, kill: bool = False, heap_mb: int = 768, timeout_s: float = 120
) -> BrokerInfo:
    """Stop the broker of *state_dir* and start it again on the same ports with its data kept, as an
    operator's restart (or, with *kill*, a crash) would: for fault tests of client reconnection.
    Brokers started with *sasl_users* are not supported."""
    state_dir = Path(state_dir).resolve()
    record = _read_state(state_dir)
    info = broker_status(state_dir)
    if record is None or info is None:
        raise KafkaLocalError(f"no running broker for {state_dir} to restart")
    if info.security_protocol != "PLAINTEXT":
        raise KafkaLocalError("restart_broker supports PLAINTEXT brokers only")
    if kill:
        os.kill(info.pid, signal.SIGKILL)
        _wait_exit(info.pid, 10.0)
    else:
        _terminate(info.pid, timeout_s=30)
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    return _launch_and_wait(
        state_dir,
        _java_executable(),
        jars_dir(),
        Path(record["properties"]),
        str(record["cluster_id"]),
        int(record["client_port"]),
        int(record["controller_port"]),
        heap_mb,
        time.monotonic() + timeout_s,
    )


def _terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM (Kafka shuts down cleanly), wait, then SIGKILL; reap the process if it is our child."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if _wait_exit(pid, wait_s):
            break
        if sig == signal.SIGKILL:
            raise KafkaLocalError(f"Kafka JVM {pid} survived SIGKILL")
        log.warning("Kafka JVM %d ignored SIGTERM for %.0f s; sending SIGKILL", pid, wait_s)
    _CHILDREN.pop(pid, None)


def _wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    child = _CHILDREN.get(pid)
    while True:
        if child is not None:
            if child.poll() is not None:
                return True
        elif not _pid_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    child = _CHILDREN.get(pid)
    if child is not None:  # reap our own child so that it does not linger as a zombie
        return child.poll() is None
    return _proc_state(pid) != "Z"


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]  # the field after "(comm)"


def _is_our_java(pid: int, properties: str) -> bool:
    """True if *pid* is alive and runs java kafka.Kafka on this state dir's server.properties."""
    if pid <= 0 or not _pid_alive(pid):
        return False
    argv = _process_argv(pid)
    if not argv:
        return False
    return Path(argv[0]).name == "java" and "kafka.Kafka" in argv and properties in argv


def _process_argv(pid: int) -> list[str]:
    if not Path("/proc/self/cmdline").exists():  # no procfs (macOS): ask ps
        return _ps_argv(pid)
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile, or not readable
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _ps_argv(pid: int) -> list[str]:
    proc = subprocess.run(
        ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    return proc.stdout.split()


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((state_dir / _STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", state_dir / _STATE_FILE, exc)
        return None
    return record if isinstance(record, dict) and "pid" in record else None


# --------------------------------------------------------------------------- logs


def _log_tail(log_dir: Path, lines: int = 15, max_errors: int = 12) -> str:
    """The first ERROR lines of the broker's logs (the cause; shutdown noise follows it) and the tail."""
    parts = []
    for name in ("stdout.log", "server.log"):
        path = log_dir / name
        text = _read_log(path)
        if not text.strip():
            continue
        errors = list(dict.fromkeys(line for line in text.splitlines() if _is_error_line(line)))[:max_errors]
        if errors:
            parts.append(f"--- first errors in {path}\n" + "\n".join(errors))
        parts.append(f"--- tail of {path}\n{_tail_text(text, lines)}")
    return "\n".join(parts) or f"(no log output in {log_dir})"


def _is_error_line(line: str) -> bool:
    return " ERROR " in line or " FATAL " in line or line.startswith(("Caused by:", "Error", "Exception"))


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------------- CLI


def _print_info(info: BrokerInfo) -> None:
    print(f"bootstrap={info.bootstrap}")
    print(f"pid={info.pid}")
    print(f"data_dir={info.data_dir}")
    print(f"log_dir={info.log_dir}")


def main(argv: list[str] | None = None) -> int:
    """``start|stop|status`` a local broker; ``start`` prints ``bootstrap=HOST:PORT`` first."""
    parser = argparse.ArgumentParser(
        prog="tokenfabric kafka",
        description=f"A local single-node Apache Kafka {KAFKA_VERSION} broker (KRaft) on {HOST}.",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=None,
        help=f"broker state: data, logs, broker.json (default: {default_state_dir()})",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a broker unless one is running; print bootstrap=...")
    start.add_argument("--port", type=int, default=None, help="client port (default: a free one)")
    start.add_argument("--heap-mb", type=int, default=768, help="JVM max heap in MiB (default: 768)")
    start.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    sub.add_parser("stop", help="stop the broker (exit 0 also when none runs)")
    sub.add_parser("status", help="print the running broker (exit 1 when none runs)")
    sub.add_parser("jars", help="resolve the jars and print their folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="kafka_local: %(message)s", stream=sys.stderr)
    state_dir: Path = args.state_dir or default_state_dir()
    try:
        return _run_command(args, state_dir)
    except KafkaLocalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _run_command(args: argparse.Namespace, state_dir: Path) -> int:
    if args.command == "start":
        info = broker_status(state_dir)
        if info is None:
            info = start_broker(state_dir, port=args.port, heap_mb=args.heap_mb, timeout_s=args.timeout)
        else:
            log.info("already running (pid %d)", info.pid)
        _print_info(info)
        return 0
    if args.command == "stop":
        print("stopped" if stop_broker(state_dir) else "not running")
        return 0
    if args.command == "status":
        info = broker_status(state_dir)
        if info is None:
            print("not running")
            return 1
        _print_info(info)
        return 0
    if args.command == "jars":
        print(jars_dir())
        return 0
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
