"""Read request traces into typed records, so tests, benchmarks and reports replay real arrival data.

The stdlib, msgspec (the native format's fast path) and :mod:`processor.core.signature`; nothing
here touches Kafka. Three formats, ``jsonl`` (native), ``mooncake`` and ``azure``: what each line
must hold, and the records they become, are processor.sim.traceformats.

Files are UTF-8 (a BOM is dropped). Gzip-compressed files are detected by their magic bytes (not the
name) and read transparently.

Order: :func:`iter_trace` streams records in file order; :func:`read_trace` returns them sorted by
``t_ms`` with a *stable* sort (ties keep file order). The shipped traces are already sorted, so the
sort is a linear pass for them; an unsorted file is accepted rather than rejected because merged or
hand-edited traces often are.

Every problem in the data raises :class:`TraceError` with one line of the form ``file:line: message``.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import operator
import os
import zlib
from collections.abc import Iterable, Iterator
from operator import attrgetter
from pathlib import Path

from processor.core.measures import percentile
from processor.sim.traceformats import (
    TraceError,
    TraceRecord,
    decoded_lines,
    iter_azure,
    iter_mooncake,
    jsonl_chunks,
)

__all__ = [
    "FORMATS",
    "SHIPPED",
    "TraceError",
    "TraceRecord",
    "iter_trace",
    "read_shipped",
    "read_trace",
    "shipped_trace",
    "trace_stats",
]

FORMATS = ("jsonl", "mooncake", "azure")

#: Shipped trace name -> (file name under ``data/traces``, format).
SHIPPED: dict[str, tuple[str, str]] = {
    "mooncake_synthetic": ("mooncake_synthetic_trace.jsonl.gz", "mooncake"),
    "mooncake_conversation": ("mooncake_conversation_trace.jsonl.gz", "mooncake"),
    "azure_code": ("AzureLLMInferenceTrace_code.csv.gz", "azure"),
    "azure_conv": ("AzureLLMInferenceTrace_conv.csv.gz", "azure"),
    # built from data/templates and azure_conv's lengths by processor.sim.templated (the main job's)
    "templated": ("templated_trace.jsonl.gz", "jsonl"),
}

TRACES_ENV = "TOKENFABRIC_TRACES"


def _open_binary(path: Path) -> io.BufferedIOBase:
    """Open a trace for reading bytes, gunzipping when the file starts with the gzip magic."""
    try:
        with path.open("rb") as raw:
            magic = raw.read(2)
        return gzip.open(path, "rb") if magic == b"\x1f\x8b" else path.open("rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot open: {exc.strerror or exc}") from None


# ------------------------------------------------------------------------------------------------ public


def iter_trace(
    path: str | Path,
    fmt: str,
    *,
    shape_blocks: int = 1,
    default_model: str = "default",
    limit: int | None = None,
) -> Iterator[TraceRecord]:
    """Stream a trace's records in *file* order (use :func:`read_trace` for ``t_ms`` order).

    ``shape_blocks`` (mooncake only) is how many leading ``hash_ids`` make the shape: 1 groups requests
    by their first 512-token block, 0 puts every request in one shape. ``limit`` stops after that many
    records. Raises :class:`TraceError` lazily, on first iteration for a missing file and as the bad line
    is reached for bad data.
    """
    _check_arguments(fmt, shape_blocks, default_model, limit)
    return _iter(Path(path), fmt, shape_blocks, default_model, limit)


def _check_arguments(fmt: str, shape_blocks: int, default_model: str, limit: int | None) -> None:
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r} (expected one of: {', '.join(FORMATS)})")
    if shape_blocks < 0:
        raise ValueError(f"shape_blocks must be >= 0, got {shape_blocks}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if not default_model:
        raise ValueError("default_model must be a non-empty string")


def _iter(path: Path, fmt: str, shape_blocks: int, model: str, limit: int | None) -> Iterator[TraceRecord]:
    count = 0
    for chunk in _chunks(path, fmt, shape_blocks, model, limit):
        for record in chunk:
            yield record
            count += 1
            if count == limit:
                return


_CHUNK_RECORDS = 4096
"""The line-by-line formats hand their records on in lists of this many (the native one by chunk)."""


def _chunks(
    path: Path, fmt: str, shape_blocks: int, model: str, limit: int | None
) -> Iterator[list[TraceRecord]]:
    """The trace's records in file order, a list at a time (the last may go past ``limit``)."""
    if limit == 0:
        return
    name = str(path)
    state = [0]
    with _open_binary(path) as stream:
        lines = decoded_lines(stream, name, state)
        chunks: Iterator[list[TraceRecord]]
        if fmt == "jsonl":
            chunks = jsonl_chunks(stream, name, state)
        else:
            records = (
                iter_mooncake(lines, name, shape_blocks, model)
                if fmt == "mooncake"
                else iter_azure(lines, name, model)
            )
            chunks = iter(lambda: list(itertools.islice(records, _CHUNK_RECORDS)), [])
        count = 0
        try:
            for chunk in chunks:
                yield chunk
                count += len(chunk)
                if limit is not None and count >= limit:
                    return
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise TraceError(f"{name}:{state[0] + 1}: corrupt or truncated gzip data ({exc})") from None
        except csv.Error as exc:
            raise TraceError(f"{name}:{state[0]}: bad CSV: {exc}") from None


def read_trace(
    path: str | Path,
    fmt: str,
    *,
    shape_blocks: int = 1,
    default_model: str = "default",
    limit: int | None = None,
) -> list[TraceRecord]:
    """All records of a trace (the first ``limit`` in file order), stably sorted by ``t_ms``."""
    _check_arguments(fmt, shape_blocks, default_model, limit)
    records: list[TraceRecord] = []
    for chunk in _chunks(Path(path), fmt, shape_blocks, default_model, limit):
        records += chunk
    if limit is not None:
        del records[limit:]
    times = list(map(_T_MS, records))
    if any(map(operator.gt, times, itertools.islice(times, 1, None))):
        records.sort(key=_T_MS)  # list.sort is stable: ties keep file order
    return records


_T_MS = attrgetter("t_ms")


def _repo_traces_dirs() -> Iterator[Path]:
    here = Path(__file__).resolve().parent
    for folder in (here, *here.parents):
        candidate = folder / "data" / "traces"
        if candidate.is_dir():
            yield candidate


def shipped_trace(name: str) -> Path:
    """Path of a trace shipped in the repo's ``data/traces`` (see ``SHIPPED`` for the names).

    ``$TOKENFABRIC_TRACES`` (a directory) is searched first, for the ``.gz`` file or its uncompressed
    original, so an installed package (which does not carry ``data/``) can point at a copy; then every
    ``data/traces`` from this package's directory upward, which finds the repo checkout.
    """
    try:
        filename, _fmt = SHIPPED[name]
    except KeyError:
        raise TraceError(f"unknown shipped trace {name!r} (expected one of: {', '.join(SHIPPED)})") from None
    dirs: list[Path] = []
    env = os.environ.get(TRACES_ENV)
    if env:
        dirs.append(Path(env))
    dirs.extend(_repo_traces_dirs())
    for folder in dirs:
        for candidate in (folder / filename, folder / filename.removesuffix(".gz")):
            if candidate.is_file():
                return candidate
    searched = ", ".join(str(d) for d in dirs) or "nothing (no data/traces above the package)"
    raise TraceError(f"shipped trace {name!r} ({filename}) not found; searched {searched}; set {TRACES_ENV}")


def read_shipped(
    name: str, *, shape_blocks: int = 1, default_model: str = "default", limit: int | None = None
) -> list[TraceRecord]:
    """:func:`read_trace` of a shipped trace, with its format taken from ``SHIPPED``."""
    path = shipped_trace(name)
    return read_trace(
        path, SHIPPED[name][1], shape_blocks=shape_blocks, default_model=default_model, limit=limit
    )


def trace_stats(records: Iterable[TraceRecord]) -> dict[str, int | float | None]:
    """Summary figures for reports: ``items``, ``tokens`` (prompt), ``shapes`` and ``models`` (distinct),
    ``min_length``, ``median_length``, ``p99_length``, ``max_length`` and ``span_ms`` (last - first
    ``t_ms``). Length figures are ``None`` for an empty trace."""
    recs = records if isinstance(records, list) else list(records)
    if not recs:
        return {
            "items": 0, "tokens": 0, "shapes": 0, "models": 0, "min_length": None,
            "median_length": None, "p99_length": None, "max_length": None, "span_ms": 0,
        }  # fmt: skip
    lengths = sorted(r.length for r in recs)
    times = [r.t_ms for r in recs]
    return {
        "items": len(recs),
        "tokens": sum(lengths),
        "shapes": len({r.shape for r in recs}),
        "models": len({r.model for r in recs}),
        "min_length": lengths[0],
        "median_length": percentile(lengths, 0.5),
        "p99_length": percentile(lengths, 0.99),
        "max_length": lengths[-1],
        "span_ms": max(times) - min(times),
    }
