"""What a local broker start prepares before its JVM runs: the ports, a clean data directory, the
``server.properties`` (plain, SASL/PLAIN or secured), the cluster id and the formatted storage
(processor/local/broker.py launches it and waits)."""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from processor.local.jars import KAFKA_VERSION, PACKAGE_KAFKA_DIR, KafkaLocalError, write_atomic
from processor.local.processes import tail_text
from processor.local.sasl import SaslSetup
from processor.local.secure import LISTENERS, SecureSetup

HOST = "127.0.0.1"  # bind and advertise the IPv4 loopback address, never "localhost"

NODE_ID = 1

LOG4J_CONFIG = PACKAGE_KAFKA_DIR / "log4j2.xml"


@dataclass(frozen=True)
class Ports:
    """The client listeners' ports (one, or one per secured listener, in LISTENERS order) and the
    controller's."""

    clients: tuple[int, ...]
    controller: int

    @property
    def client(self) -> int:
        return self.clients[0]


def reset_dirs(state_dir: Path, data_dir: Path, log_dir: Path) -> None:
    """A formatted data dir refuses a second format, so every start gets a clean one."""
    state_dir.mkdir(parents=True, exist_ok=True)
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir()
    log_dir.mkdir(exist_ok=True)
    for old in log_dir.glob("*.log"):  # logs of the previous instance
        old.unlink()


def random_cluster_id() -> str:
    """A cluster id as ``kafka.tools.StorageTool random-uuid`` makes it, without a JVM start (~0.8 s).

    Kafka's Uuid.randomUuid(): 16 random bytes, base64url without padding, re-drawn if the text
    starts with '-' (reserved values ZERO and ONE cannot come out of uuid4, which fixes version bits).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def write_properties(
    props: Path,
    data_dir: Path,
    *,
    ports: Ports,
    sasl: SaslSetup | None = None,
    secure: SecureSetup | None = None,
) -> None:
    settings = _plain_settings(data_dir, ports)
    if sasl is not None:
        settings.update(_sasl_settings(sasl, ports))
    if secure is not None:
        settings.update(
            secure.broker_properties(dict(zip(LISTENERS, ports.clients, strict=True)), ports.controller, HOST)
        )
    lines = [f"# written by processor/local/broker_files.py for Kafka {KAFKA_VERSION}"]
    lines += [f"{key}={value}" for key, value in settings.items()]
    write_atomic(props, "\n".join(lines) + "\n")
    if sasl is not None or secure is not None:
        props.chmod(0o600)  # it holds the users' passwords (or the key store's)


def _plain_settings(data_dir: Path, ports: Ports) -> dict[str, str | int]:
    """One node, broker and controller, PLAINTEXT on loopback, sized for a small machine."""
    client_port, controller_port = ports.client, ports.controller
    return {
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
        # The consumer protocol (KIP-848): heartbeats every second (a rebalance takes one heartbeat,
        # 5 s at the default), and a group may lower its consumer.session.timeout.ms to 6 s as
        # processors' --session-timeout-ms does under the classic protocol (docs/operations.md).
        "group.consumer.heartbeat.interval.ms": 1000,
        "group.consumer.min.heartbeat.interval.ms": 1000,
        "group.consumer.min.session.timeout.ms": 6000,
        # The project creates its topics explicitly; a typo should fail, not create a topic.
        "auto.create.topics.enable": "false",
        # Small machine (2 cores): fewer threads, smaller cleaner buffer than the defaults.
        "num.network.threads": 2,
        "num.io.threads": 4,
        "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
    }


def _sasl_settings(sasl: SaslSetup, ports: Ports) -> dict[str, str]:
    """One client listener, SASL_PLAINTEXT: clients and the broker's own inter-broker requests
    (transaction markers go to the partition leader, itself) must log in."""
    client_port, controller_port = ports.client, ports.controller
    return {
        "listeners": f"SASL_PLAINTEXT://{HOST}:{client_port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"SASL_PLAINTEXT://{HOST}:{client_port}",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": sasl.jaas(),
    }


def format_storage(
    java: str, jars: Path, props: Path, cluster_id: str, log_dir: Path, extra: list[str] | None = None
) -> None:
    """``kafka-storage format``; ``extra`` adds arguments (a secured broker's ``--add-scram`` users).

    The tool and its arguments travel in a java argument file (``java @FILE``, owner-only, removed
    once the tool ends), never on the command line: ``--add-scram`` carries passwords, and any user
    of the machine can read a process's command line (``ps``). The java launcher expands the file
    inside the process, so ``/proc/<pid>/cmdline`` shows only ``@FILE``. The error quotes the tool's
    output, never the arguments.
    """
    tool = ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), *(extra or [])]
    argfile = props.parent / f".format-{os.getpid()}.args"
    fd = os.open(argfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(_argfile_quoted(a) for a in tool) + "\n")
    cmd = [java, *jvm_logging_opts(log_dir), "-cp", f"{jars}{os.sep}*", f"@{argfile}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    finally:
        argfile.unlink(missing_ok=True)
    if proc.returncode != 0:
        output = tail_text(proc.stdout + proc.stderr, 30)
        raise KafkaLocalError(f"kafka-storage format failed (exit {proc.returncode}):\n{output}")


def _argfile_quoted(arg: str) -> str:
    """One argument of a java argument file: double-quoted, with backslashes and quotes escaped."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def jvm_logging_opts(log_dir: Path) -> list[str]:
    return [f"-Dkafka.logs.dir={log_dir}", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise KafkaLocalError("java is not on PATH (nor in $JAVA_HOME): the Kafka broker needs Java 17+")
    return java


def pick_ports(client_port: int | None, clients: int = 1) -> Ports:
    """``clients`` client ports (the first *client_port* if given) and a controller port, free ones
    otherwise; never the same twice."""
    taken: list[int] = [client_port] if client_port else []
    while len(taken) < clients + 1:
        taken.append(free_port(avoid=set(taken)))
    return Ports(tuple(taken[:clients]), taken[clients])


def free_port(avoid: set[int] | None = None) -> int:
    """A loopback port that is free right now (it can be taken before the broker binds it)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in (avoid or ()):
            return port
