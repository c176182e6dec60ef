"""A real Confluent-compatible Schema Registry on loopback: Apicurio Registry, for tests, CI and trials.

Why this one: Confluent's own registry is not on Maven Central and Karapace is not on PyPI; Apicurio
Registry 2.4.2.Final (Apache-2.0) is, and serves the Confluent API under ``/apis/ccompat/v7``. Its
jars are Quarkus library jars without a main class, so :func:`build_registry` builds the application
once per machine, as llama-server is built, from the Maven projects in ``data/registry/``:

* ``config-index``: a deployment module Central does not serve, written here under the coordinate the
  registry names (see its pom), installed into a **private** Maven repository under the cache;
* ``app``: quarkus-maven-plugin packages the registry into ``<cache>/apicurio-registry-<v>/app``
  (``*-runner.jar`` and ``lib/``).

A marker holds the SHA-256 of the Maven projects, so a complete build is reused offline and a changed
pom builds again; a file lock keeps two processes from building at once. :func:`start_registry` runs
the JVM detached on ``127.0.0.1`` (storage: H2 in memory, so every start is an empty registry) and
waits until ``GET /subjects`` answers; ``registry.json`` in the state directory records the pid and
port for :func:`registry_status` and :func:`stop_registry`, as the broker's ``broker.json`` does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from processor.local.broker_files import HOST, java_executable, pick_ports
from processor.local.jars import KafkaLocalError, cache_root, file_lock, tail_text, write_atomic
from processor.local.processes import CHILDREN, process_argv, read_log, terminate

log = logging.getLogger(__name__)

APICURIO_VERSION = "2.4.2.Final"  # keep in step with app/pom.xml
CCOMPAT_PATH = "/apis/ccompat/v7"
_PROJECTS = Path(__file__).resolve().with_name("data") / "registry"
_STATE_FILE = "registry.json"
_MVN_TIMEOUT_S = 900.0


class RegistryLocalError(KafkaLocalError):
    """The local registry could not be built, started or stopped."""


@dataclass(frozen=True)
class RegistryInfo:
    url: str
    """The Confluent-compatible base URL (``http://127.0.0.1:PORT/apis/ccompat/v7``)."""
    pid: int
    log_file: Path


def registry_home() -> Path:
    return cache_root() / f"apicurio-registry-{APICURIO_VERSION}"


def default_state_dir() -> Path:
    """``$TOKENFABRIC_HOME/registry`` or ``~/.cache/tokenfabric/run/registry``."""
    env = os.environ.get("TOKENFABRIC_HOME")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "tokenfabric" / "run"
    return base / "registry"


def _projects_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in _PROJECTS.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(_PROJECTS)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def runner_jar() -> Path | None:
    """The built registry's runner jar, if a complete build is cached."""
    home = registry_home()
    marker = home / "app.complete"
    try:
        if marker.read_text().strip() != _projects_digest():
            return None
    except FileNotFoundError:
        return None
    return next((home / "app").glob("*-runner.jar"), None)


def build_registry() -> Path:
    """The runner jar, building the registry with Maven first if no complete build is cached."""
    jar = runner_jar()
    if jar is not None:
        return jar
    home = registry_home()
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(home / ".lock"):
        jar = runner_jar()
        if jar is not None:  # another process finished meanwhile
            return jar
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=home))
        try:
            shutil.copytree(_PROJECTS, staging / "src")
            started = time.monotonic()
            log.info("building Apicurio Registry %s with Maven (once per machine) ...", APICURIO_VERSION)
            _mvn(home / "m2", staging / "src" / "config-index", "install")
            _mvn(home / "m2", staging / "src" / "app", "package")
            target = staging / "src" / "app" / "target"
            app = staging / "app"
            app.mkdir()
            for jar_path in target.glob("*-runner.jar"):
                shutil.move(str(jar_path), app / jar_path.name)
            shutil.move(str(target / "lib"), app / "lib")
            if (home / "app").exists():
                (home / "app").rename(staging / "app.old")
            app.rename(home / "app")
            log.info("Apicurio Registry built in %.0f s", time.monotonic() - started)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        write_atomic(home / "app.complete", _projects_digest() + "\n")
    jar = runner_jar()
    if jar is None:
        raise RegistryLocalError(f"the registry build left no runner jar in {home / 'app'}")
    return jar


def _mvn(repo: Path, project: Path, goal: str) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RegistryLocalError("Maven (mvn) is not on PATH: it is needed once to build the schema registry")
    cmd = [mvn, "-B", "-q", f"-Dmaven.repo.local={repo}", "-DskipTests", "-f", str(project / "pom.xml"), goal]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RegistryLocalError(
            f"mvn did not finish within {_MVN_TIMEOUT_S:.0f} s: {shlex.join(cmd)}"
        ) from exc
    if proc.returncode != 0:
        output = tail_text(proc.stdout + proc.stderr, 40)
        raise RegistryLocalError(f"mvn failed (exit {proc.returncode}): {shlex.join(cmd)}\n{output}")


def start_registry(
    state_dir: Path, *, port: int | None = None, heap_mb: int = 192, timeout_s: float = 120
) -> RegistryInfo:
    """Start an empty registry whose log and state file live in *state_dir*; wait until it answers.

    Raises RegistryLocalError if one already runs for *state_dir*, if the JVM exits, or if it does
    not answer within *timeout_s* (the one-off build before it is not counted)."""
    state_dir = Path(state_dir).resolve()
    running = registry_status(state_dir)
    if running is not None:
        raise RegistryLocalError(f"a registry is already running for {state_dir}: {running.url}")
    jar = build_registry()
    state_dir.mkdir(parents=True, exist_ok=True)
    port = port or pick_ports(None, 1).client
    log_file = state_dir / "registry.log"
    cmd = [
        java_executable(), f"-Xmx{heap_mb}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        f"-Dquarkus.http.host={HOST}", f"-Dquarkus.http.port={port}", "-Dtokenfabric.registry=1",
        "-jar", str(jar),
    ]  # fmt: skip
    with log_file.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=state_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    CHILDREN[proc.pid] = proc
    info = RegistryInfo(f"http://{HOST}:{port}{CCOMPAT_PATH}", proc.pid, log_file)
    record = {"url": info.url, "pid": proc.pid, "port": port, "log_file": str(log_file), "jar": str(jar)}
    write_atomic(state_dir / _STATE_FILE, json.dumps(record, indent=2) + "\n")
    try:
        _wait_ready(proc, info, time.monotonic() + timeout_s)
    except BaseException:
        terminate(proc.pid, timeout_s=1, what="registry JVM", failure=RegistryLocalError)
        (state_dir / _STATE_FILE).unlink(missing_ok=True)
        raise
    return info


def _wait_ready(proc: subprocess.Popen[bytes], info: RegistryInfo, deadline: float) -> None:
    started = time.monotonic()
    while True:
        code = proc.poll()
        if code is not None:
            raise RegistryLocalError(
                f"the registry JVM exited with code {code} during start-up:\n"
                f"{tail_text(read_log(info.log_file), 20)}"
            )
        if answers(info.url):
            log.info(
                "schema registry ready at %s in %.1f s (pid %d)",
                info.url,
                time.monotonic() - started,
                proc.pid,
            )
            return
        if time.monotonic() > deadline:
            raise RegistryLocalError(
                f"the registry did not answer at {info.url} in time:\n"
                f"{tail_text(read_log(info.log_file), 20)}"
            )
        time.sleep(0.2)


def answers(url: str) -> bool:
    """Whether a registry at *url* (its Confluent-compatible base) answers ``GET /subjects``."""
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def registry_status(state_dir: Path) -> RegistryInfo | None:
    """The registry of *state_dir* if its recorded pid is alive and is that registry's JVM."""
    try:
        record = json.loads((Path(state_dir).resolve() / _STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    pid = int(record["pid"])
    argv = process_argv(pid) if pid > 0 else []
    if "-Dtokenfabric.registry=1" not in argv or str(record["jar"]) not in argv:
        return None
    return RegistryInfo(str(record["url"]), pid, Path(record["log_file"]))


def stop_registry(state_dir: Path, timeout_s: float = 20) -> bool:
    """SIGTERM (then SIGKILL) the registry of *state_dir*; True if one was running."""
    state_dir = Path(state_dir).resolve()
    info = registry_status(state_dir)
    if info is not None:
        terminate(info.pid, timeout_s, what="registry JVM", failure=RegistryLocalError)
    (state_dir / _STATE_FILE).unlink(missing_ok=True)
    return info is not None
