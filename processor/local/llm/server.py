"""Named ``llama-server`` instances on loopback: start, status, stop; the way the local broker works.

Why several: the demo runs one server per simulated card, so each instance has a name (``--name``)
and its own state folder, ``<run root>/llm/<name>``, where the run root is the local broker's
(``$TOKENFABRIC_HOME`` or ``~/.cache/tokenfabric/run``). ``server.json`` there records the pid, port and
settings; the process outlives the Python process that started it, and ``server_status`` trusts the
record only while that pid still runs the recorded binary on the recorded port.

Readiness is ``GET /health`` answering 200 (503 while the model loads). A port taken between choosing
it and binding it is retried on another free port, as the broker does.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from processor.local.broker import default_state_dir
from processor.local.jars import tail_text, write_atomic
from processor.local.llm.errors import LlmLocalError
from processor.local.processes import CHILDREN, process_argv, read_log, terminate, wait_exit

HOST = "127.0.0.1"

DEFAULT_NAME = "default"

_STATE_FILE = "server.json"

_LOG_FILE = "server.log"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_MAX_START_ATTEMPTS = 5

_BIND_FAILURE = "couldn't bind HTTP server socket"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    """The server's capacity and prompt-cache settings; each maps to one llama-server flag.

    The defaults fit a 2-core machine running several servers and Kafka at once.
    """

    slots: int = 4
    """``-np``: requests decoded concurrently (continuous batching across slots)."""
    ctx_tokens: int = 16384
    """``-c``: KV-cache positions in all, split evenly between the slots (4,096 each by default)."""
    threads: int = 1
    """``-t`` and ``-tb``: CPU threads for generation and for prompt processing."""
    cache_prompt: bool = True
    """``--cache-prompt``: a slot keeps its last prompt's KV cache and reuses its common prefix."""
    cache_reuse_tokens: int = 0
    """``--cache-reuse``: smallest chunk reused by shifting the KV cache when a prompt differs in the
    middle; 0 reuses the common prefix only."""
    cache_ram_mib: int = 0
    """``--cache-ram``: host-memory store of evicted slots' prompts (MiB); 0 keeps the slots' own KV
    caches as the only prompt cache, which makes the measured hits a property of routing."""
    slot_similarity: float = 0.5
    """``--slot-prompt-similarity``: the share of a request's prompt a slot's cached prompt must match
    for the request to go to that slot rather than to an idle one (0 disables the preference)."""
    lora: tuple[str, ...] = ()
    """``--lora``: LoRA adapter files loaded at start; llama.cpp numbers them from 0 in this order
    (the ``openai`` engine's ``lora_ids`` option names them)."""

    def __post_init__(self) -> None:
        if self.slots < 1 or self.threads < 1:
            raise LlmLocalError(f"slots ({self.slots}) and threads ({self.threads}) must be at least 1")
        if self.ctx_tokens < self.slots * 64:
            raise LlmLocalError(f"ctx_tokens {self.ctx_tokens} is under 64 per slot for {self.slots} slots")
        if self.cache_reuse_tokens < 0 or self.cache_ram_mib < -1:
            raise LlmLocalError("cache_reuse_tokens must be >= 0 and cache_ram_mib >= -1 (-1: no limit)")
        if not 0.0 <= self.slot_similarity <= 1.0:
            raise LlmLocalError(f"slot_similarity {self.slot_similarity} is not within 0..1")

    @property
    def ctx_tokens_per_slot(self) -> int:
        return self.ctx_tokens // self.slots


@dataclass(frozen=True)
class ServerInfo:
    name: str
    url: str
    pid: int
    port: int
    log_file: Path
    settings: ServerSettings


def server_args(binary: Path, model: Path, port: int, settings: ServerSettings) -> list[str]:
    """The llama-server command line. ``--fit off``: llama.cpp must not shrink the stated context."""
    return [
        str(binary), "--model", str(model), "--host", HOST, "--port", str(port),
        "--parallel", str(settings.slots), "--ctx-size", str(settings.ctx_tokens),
        "--threads", str(settings.threads), "--threads-batch", str(settings.threads),
        "--cache-prompt" if settings.cache_prompt else "--no-cache-prompt",
        "--cache-reuse", str(settings.cache_reuse_tokens), "--cache-ram", str(settings.cache_ram_mib),
        "--slot-prompt-similarity", str(settings.slot_similarity),
        "--fit", "off", "--metrics", "--no-webui",
        *(arg for path in settings.lora for arg in ("--lora", path)),
    ]  # fmt: skip


def check_name(name: str) -> str:
    """A server name is a folder name: letters, digits, ``_.-``, at most 64 characters."""
    if not _NAME.match(name):
        raise LlmLocalError(f"server name {name!r} must be letters, digits, '_', '.' or '-' (at most 64)")
    return name


def state_dir(name: str) -> Path:
    """``<run root>/llm/<name>``, the run root being the local broker's (its state dir's parent)."""
    return default_state_dir().parent / "llm" / check_name(name)


def server_status(name: str = DEFAULT_NAME) -> ServerInfo | None:
    """The server *name* if its recorded pid is alive and still that llama-server, else None."""
    home = state_dir(name)
    record = _read_state(home)
    if record is None:
        return None
    try:
        pid, port = int(record["pid"]), int(record["port"])
        if not _is_our_server(pid, str(record["binary"]), port):
            return None
        return ServerInfo(
            name=name,
            url=str(record["url"]),
            pid=pid,
            port=port,
            log_file=Path(record["log_file"]),
            settings=ServerSettings(**record["settings"]),
        )
    except (KeyError, TypeError, ValueError) as exc:  # a record of another version, or hand-edited
        log.warning("ignoring %s: %s: %s", home / _STATE_FILE, type(exc).__name__, exc)
        return None


def start_server(
    binary: Path,
    model: Path,
    *,
    name: str = DEFAULT_NAME,
    settings: ServerSettings | None = None,
    port: int | None = None,
    timeout_s: float = 120.0,
) -> ServerInfo:
    """Start server *name* on *port* (default: a free one) and wait until ``/health`` says ok.

    Raises :class:`LlmLocalError` if that name already runs, if the process exits during start-up
    (the message carries the tail of its log), or if it is not healthy within *timeout_s*.
    """
    settings = settings or ServerSettings()
    running = server_status(name)
    if running is not None:
        raise LlmLocalError(f"llama-server {name!r} is already running: {running.url} (pid {running.pid})")
    home = state_dir(name)
    home.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    for attempt in range(1, _MAX_START_ATTEMPTS + 1):
        chosen = port or free_port()
        try:
            return _launch_and_wait(home, name, binary, model, chosen, settings, deadline)
        except _BindError as exc:
            if port is not None or attempt == _MAX_START_ATTEMPTS:
                raise LlmLocalError(str(exc)) from exc
            log.warning("port %d taken (attempt %d), retrying with another", chosen, attempt)
    raise AssertionError("unreachable")


class _BindError(LlmLocalError):
    """llama-server exited because its port was taken."""


def _launch_and_wait(
    home: Path, name: str, binary: Path, model: Path, port: int, settings: ServerSettings, deadline: float
) -> ServerInfo:
    log_file = home / _LOG_FILE
    cmd = server_args(binary, model, port, settings)
    with log_file.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=home, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: no Ctrl-C from the terminal, outlives this process
        )  # fmt: skip
    CHILDREN[proc.pid] = proc
    info = ServerInfo(
        name=name, url=f"http://{HOST}:{port}", pid=proc.pid, port=port, log_file=log_file, settings=settings
    )
    # Written before waiting, so that `stop` finds the process even if this one is interrupted.
    record = {
        "name": name, "url": info.url, "pid": proc.pid, "port": port, "binary": str(binary),
        "model": str(model), "log_file": str(log_file), "settings": asdict(settings),
        "command": cmd, "started_at": time.time(),
    }  # fmt: skip
    write_atomic(home / _STATE_FILE, json.dumps(record, indent=2) + "\n")
    started = time.monotonic()
    try:
        _wait_healthy(proc, info, deadline)
    except BaseException:
        terminate(proc.pid, 1.0, "llama-server", LlmLocalError)
        (home / _STATE_FILE).unlink(missing_ok=True)
        raise
    log.info("llama-server %r healthy at %s in %.1f s (pid %d)", name, info.url, time.monotonic() - started,
             proc.pid)  # fmt: skip
    return info


def _wait_healthy(proc: subprocess.Popen[bytes], info: ServerInfo, deadline: float) -> None:
    last = "no answer yet"
    while True:
        code = proc.poll()
        if code is not None:
            text = read_log(info.log_file)
            error = _BindError if _BIND_FAILURE in text else LlmLocalError
            raise error(f"llama-server exited with code {code} during start-up:\n{tail_text(text, 15)}")
        if time.monotonic() > deadline:
            raise LlmLocalError(
                f"llama-server not healthy at {info.url}/health before the timeout ({last}):\n"
                f"{tail_text(read_log(info.log_file), 15)}"
            )
        status, body = health(info.url)
        if status == 200:
            return
        last = f"/health answered {status}: {body[:200]}" if status else body
        time.sleep(0.2)


def health(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """``GET <url>/health`` as (HTTP status, body); status 0 with the reason when nothing answered."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, f"no answer: {exc}"


def stop_server(name: str = DEFAULT_NAME, timeout_s: float = 15.0) -> bool:
    """Stop server *name*: SIGTERM, then SIGKILL after *timeout_s*. True if one was running."""
    info = server_status(name)
    if info is not None:
        terminate(info.pid, timeout_s, "llama-server", LlmLocalError)
    (state_dir(name) / _STATE_FILE).unlink(missing_ok=True)
    return info is not None


def running_servers() -> list[ServerInfo]:
    """Every named server that runs now, by name."""
    root = default_state_dir().parent / "llm"
    names = sorted(path.parent.name for path in root.glob(f"*/{_STATE_FILE}"))
    return [info for name in names if _NAME.match(name) and (info := server_status(name)) is not None]


def free_port() -> int:
    """A loopback port that is free right now (another process can take it before the server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


def _is_our_server(pid: int, binary: str, port: int) -> bool:
    """The pid runs the recorded binary with the recorded port (a reused pid does not)."""
    if pid <= 0 or wait_exit(pid, 0.0):
        return False
    argv = process_argv(pid)
    if not argv or argv[0] != binary or "--port" not in argv[:-1]:
        return False
    return argv[argv.index("--port") + 1] == str(port)


def _read_state(home: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((home / _STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", home / _STATE_FILE, exc)
        return None
    return record if isinstance(record, dict) and "pid" in record else None
