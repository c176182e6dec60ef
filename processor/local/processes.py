"""The local broker's JVM as an operating-system process: is it alive, is it ours, stop it, read its logs."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from processor.local.jars import KafkaLocalError, tail_text

log = logging.getLogger(__name__)

# Popen handles of brokers started by this process, kept so that they can be reaped (no zombies)
# and so that no "subprocess still running" ResourceWarning is raised when the handle is collected.
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def terminate(
    pid: int, timeout_s: float, what: str = "Kafka JVM", failure: type[Exception] = KafkaLocalError
) -> None:
    """SIGTERM (Kafka and llama-server shut down cleanly on it), wait, then SIGKILL; reap the process
    if it is our child. ``what`` names the process in the log; ``failure`` is raised if it survives."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if wait_exit(pid, wait_s):
            break
        if sig == signal.SIGKILL:
            raise failure(f"{what} {pid} survived SIGKILL")
        log.warning("%s %d ignored SIGTERM for %.0f s; sending SIGKILL", what, pid, wait_s)
    CHILDREN.pop(pid, None)


def wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    child = CHILDREN.get(pid)
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
    child = CHILDREN.get(pid)
    if child is not None:  # reap our own child so that it does not linger as a zombie
        return child.poll() is None
    return _proc_state(pid) != "Z"


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]  # the field after "(comm)"


def is_our_java(pid: int, properties: str) -> bool:
    """True if *pid* is alive and runs java kafka.Kafka on this state dir's server.properties."""
    if pid <= 0 or not _pid_alive(pid):
        return False
    argv = process_argv(pid)
    if not argv:
        return False
    return Path(argv[0]).name == "java" and "kafka.Kafka" in argv and properties in argv


def process_argv(pid: int) -> list[str]:
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


def log_tail(log_dir: Path, lines: int = 15, max_errors: int = 12) -> str:
    """The first ERROR lines of the broker's logs (the cause; shutdown noise follows it) and the tail."""
    parts = []
    for name in ("stdout.log", "server.log"):
        path = log_dir / name
        text = read_log(path)
        if not text.strip():
            continue
        errors = list(dict.fromkeys(line for line in text.splitlines() if _is_error_line(line)))[:max_errors]
        if errors:
            parts.append(f"--- first errors in {path}\n" + "\n".join(errors))
        parts.append(f"--- tail of {path}\n{tail_text(text, lines)}")
    return "\n".join(parts) or f"(no log output in {log_dir})"


def _is_error_line(line: str) -> bool:
    return " ERROR " in line or " FATAL " in line or line.startswith(("Caused by:", "Error", "Exception"))


def read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
