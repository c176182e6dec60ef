"""The local broker's jars, resolved from Maven Central once into a cache outside the repository.

A marker file holds the pom's SHA-256, so a complete copy is reused offline; a lock keeps two
processes from resolving at once. The digest is the cache key: a cache made from an older pom (before
``kafka-tools`` was added, say) is resolved again at the next call, so it gets every jar the pom
names now. :func:`tool_command` runs one of Kafka's own command-line tools from these jars.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"  # keep in step with <kafka.version> in processor/local/data/pom.xml

PACKAGE_KAFKA_DIR = Path(__file__).resolve().with_name("data")

_POM = PACKAGE_KAFKA_DIR / "pom.xml"

_COPY_DEPENDENCIES = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"

_MVN_TIMEOUT_S = 900.0


class KafkaLocalError(RuntimeError):
    """The local broker could not be set up, started or stopped."""


def cache_root() -> Path:
    """Where downloaded artefacts are cached: ``$TOKENFABRIC_CACHE`` or ``~/.cache/tokenfabric``."""
    env = os.environ.get("TOKENFABRIC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tokenfabric"


def jars_dir(version: str = KAFKA_VERSION) -> Path:
    """Return the folder that holds every runtime jar of the broker, resolving it with Maven if needed.

    The jars are in ``<cache_root>/kafka-<version>/lib``. The folder counts as complete when the marker
    file next to it holds the SHA-256 of the pom it was resolved from. Until then, ``mvn
    copy-dependencies`` fills a staging folder that then replaces ``lib``. A file lock keeps
    concurrent callers from racing. ``version``: another Kafka release than :data:`KAFKA_VERSION`
    (the upgrade test starts 4.1.2 on a data dir that 4.4.0 then opens), resolved from the packaged
    pom with its ``kafka.version`` replaced: a one-off download of that release's jars.
    """
    pom = pom_text(version)
    home = cache_root() / f"kafka-{version}"
    lib = home / "lib"
    marker = home / "lib.complete"
    digest = hashlib.sha256(pom.encode()).hexdigest()
    if _marker_matches(marker, digest) and lib.is_dir():
        return lib
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(home / ".lock"):
        if _marker_matches(marker, digest) and lib.is_dir():  # another process finished meanwhile
            return lib
        marker.unlink(missing_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=home))
        try:
            _copy_dependencies(staging, pom, version)
            # Moved aside rather than deleted first: a running broker opens its jars by path, lazily;
            # the path is missing only between the two renames, and then names a jar of the same version.
            if lib.exists():
                lib.rename(staging / "lib.old")
            (staging / "lib").rename(lib)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        write_atomic(marker, digest + "\n")
    return lib


def pom_text(version: str = KAFKA_VERSION) -> str:
    """The packaged pom, naming ``version`` as its ``kafka.version``."""
    text = _POM.read_text()
    if version == KAFKA_VERSION:
        return text
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise KafkaLocalError(f"not a Kafka release number: {version!r} (expected like 4.1.2)")
    return text.replace(
        f"<kafka.version>{KAFKA_VERSION}</kafka.version>", f"<kafka.version>{version}</kafka.version>"
    )


def _copy_dependencies(staging: Path, pom: str, version: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaLocalError(
            f"Maven (mvn) is not on PATH: it is needed once to download the Kafka {version} jars"
        )
    # Work on a copy of the pom: the installed package may be read-only.
    (staging / "pom.xml").write_text(pom)
    cmd = [
        mvn, "-B", "-q", "-f", str(staging / "pom.xml"), _COPY_DEPENDENCIES,
        "-DincludeScope=runtime", f"-DoutputDirectory={staging / 'lib'}",
    ]  # fmt: skip
    log.info("resolving Kafka %s jars with Maven (one-off) ...", version)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=staging, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise KafkaLocalError(f"mvn did not finish within {_MVN_TIMEOUT_S:.0f} s: {shlex.join(cmd)}") from exc
    if proc.returncode != 0 or not any((staging / "lib").glob("kafka_2.13-*.jar")):
        output = tail_text(proc.stdout + proc.stderr, 40)
        raise KafkaLocalError(f"mvn failed (exit {proc.returncode}): {shlex.join(cmd)}\n{output}")
    log.info("Kafka jars resolved in %.1f s", time.monotonic() - started)


def _marker_matches(marker: Path, digest: str) -> bool:
    try:
        return marker.read_text().strip() == digest
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def tail_text(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


#: ``tokenfabric kafka <name>`` -> the main class of the Kafka tool it runs (from ``kafka-tools``).
TOOLS = {
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
}

_TOOLS_LOG4J = PACKAGE_KAFKA_DIR / "tools-log4j2.xml"


def tool_command(java: str, tool: str, args: list[str]) -> list[str]:
    """The command line that runs Kafka's ``tool`` (a key of :data:`TOOLS`) with ``args`` untouched:
    what ``kafka-<tool>.sh`` runs, without the shell script (warnings to stderr, no log files)."""
    return [
        java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
        f"-Dlog4j2.configurationFile={_TOOLS_LOG4J}",
        "-cp", f"{jars_dir()}{os.sep}*", TOOLS[tool], *args,
    ]  # fmt: skip
