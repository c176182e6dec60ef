"""Dataset rows in (JSONL, CSV, Parquet) and joined results out (JSONL, Parquet), by file extension.

Row numbers are the contract between ``submit`` and ``collect``: row ``n`` is the ``n``-th data row
(0-based) in file order, as :func:`Dataset.rows` yields it. Blank lines in JSONL and CSV are not rows;
a CSV header is not a row. Both commands read through this one module, and the job record keeps the
file's SHA-256 so ``collect`` refuses a file that changed in between.

A row that cannot be parsed (a JSONL line that is not a JSON object, a CSV line with the wrong number
of fields, bytes that are not UTF-8) is still a row: it comes back with ``error`` set, so it is
reported by its number instead of shifting every later row.

Outputs are written to a temporary file beside the target and renamed over it (``os.replace``), so a
reader never sees half a file and a crash leaves the previous output intact.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

from processor.jobs.model import RowResult

DatasetFormat = Literal["jsonl", "csv", "parquet"]
OutputFormat = Literal["jsonl", "parquet"]
_SUFFIXES: dict[str, DatasetFormat] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".jsonl.gz": "jsonl",
    ".ndjson.gz": "jsonl",
    ".csv": "csv",
    ".csv.gz": "csv",
    ".parquet": "parquet",
}
_PARQUET_ROW_GROUP = 10_000


class DatasetError(ValueError):
    """The file cannot be read as a dataset (or written as an output); the message says why."""


@dataclass(frozen=True, slots=True)
class DatasetRow:
    """One data row: its values, or ``error`` when the row could not be parsed."""

    row: int
    values: dict[str, Any] | None
    error: str | None = None


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in sorted(_SUFFIXES, key=len, reverse=True) if name.endswith(s)), path.suffix)


def dataset_format(path: str | Path) -> DatasetFormat:
    fmt = _SUFFIXES.get(_suffix(Path(path)))
    if fmt is None:
        known = ", ".join(_SUFFIXES)
        raise DatasetError(f"dataset {path}: unknown format; name it with one of {known}")
    return fmt


def need_pyarrow() -> None:
    """Raise DatasetError, saying what to install, when Parquet is asked for and pyarrow is missing:
    checked when the command starts, not after it has read a whole job."""
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise DatasetError("Parquet needs pyarrow: pip install 'tokenfabric[jobs]'")


def output_format(path: str | Path) -> OutputFormat:
    name = Path(path).name.lower()
    if name.endswith(".jsonl"):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    raise DatasetError(f"output {path}: name it .jsonl or .parquet (the format is read from the suffix)")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Dataset:
    """A dataset file. ``columns`` is known up front for CSV and Parquet (None for JSONL)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()
        self.format = dataset_format(self.path)
        if not self.path.is_file():
            raise DatasetError(f"dataset {path}: no such file")
        self.columns: tuple[str, ...] | None = None
        if self.format == "csv":
            with self._text() as f:
                header = next(csv.reader(f), None)
            if not header:
                raise DatasetError(f"dataset {path}: empty CSV (the first line must be the header)")
            self.columns = tuple(header)
        elif self.format == "parquet":
            self.columns = tuple(self._arrow_schema().names)

    def _text(self) -> IO[str]:
        if self.path.name.lower().endswith(".gz"):
            raw: IO[bytes] = cast(IO[bytes], gzip.open(self.path, "rb"))  # noqa: SIM115 - closed with the wrapper
        else:
            raw = open(self.path, "rb")  # noqa: SIM115 - closed with the wrapper
        return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="surrogateescape", newline="")

    def _arrow_schema(self) -> Any:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetError("Parquet needs pyarrow: pip install 'tokenfabric[jobs]'") from None
        try:
            return pq.read_schema(self.path)
        except Exception as exc:  # pyarrow's errors are ArrowInvalid, OSError, ...
            raise DatasetError(f"dataset {self.path}: not a Parquet file: {exc}") from None

    def input_type(self) -> Any:
        """The Arrow type of the ``input`` column of a Parquet output (a JSON string for JSONL)."""
        import pyarrow as pa

        if self.format == "parquet":
            schema = self._arrow_schema()
            return pa.struct([schema.field(i) for i in range(len(schema))])
        if self.format == "csv":
            return pa.struct([pa.field(c, pa.string()) for c in self.columns or ()])
        return pa.string()

    def rows(self) -> Iterator[DatasetRow]:
        if self.format == "jsonl":
            return self._jsonl_rows()
        if self.format == "csv":
            return self._csv_rows()
        return self._parquet_rows()

    def _jsonl_rows(self) -> Iterator[DatasetRow]:
        opener = gzip.open if self.path.name.lower().endswith(".gz") else open
        row = 0
        with opener(self.path, "rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                yield _json_row(row, raw)
                row += 1

    def _csv_rows(self) -> Iterator[DatasetRow]:
        header = self.columns or ()
        with self._text() as f:
            reader = csv.reader(f)
            next(reader, None)
            row = 0
            try:
                for fields in reader:
                    if not fields:
                        continue
                    yield _csv_row(row, header, fields)
                    row += 1
            except csv.Error as exc:
                # The reader cannot resynchronise (an unterminated quote eats the rest of the file).
                raise DatasetError(f"dataset {self.path}: CSV error after row {row - 1}: {exc}") from None

    def _parquet_rows(self) -> Iterator[DatasetRow]:
        import pyarrow.parquet as pq

        row = 0
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=4096):
            for values in batch.to_pylist():
                yield DatasetRow(row, values)
                row += 1


def _json_row(row: int, raw: bytes) -> DatasetRow:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return DatasetRow(row, None, f"not UTF-8 ({exc.reason} at byte {exc.start})")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return DatasetRow(row, None, f"not JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(value, dict):
        return DatasetRow(row, None, f"a JSON {type(value).__name__}, not an object")
    return DatasetRow(row, value)


def _csv_row(row: int, header: tuple[str, ...], fields: list[str]) -> DatasetRow:
    values = dict(zip(header, fields, strict=False))
    if len(fields) != len(header):
        return DatasetRow(row, values, f"{len(fields)} fields, the header has {len(header)}")
    for name, value in values.items():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return DatasetRow(row, values, f"column {name!r} is not UTF-8")
    return DatasetRow(row, values)


# --------------------------------------------------------------------------------------------------
# Outputs


def output_record(result: RowResult, values: dict[str, Any] | None) -> dict[str, Any]:
    """One output row: the result's fields, then the input row under ``input``."""
    return {**result.to_json(), "input": values}


def _json_line(record: dict[str, Any]) -> bytes:
    line = json.dumps(record, ensure_ascii=False, default=str)
    try:
        return (line + "\n").encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a malformed input row: escape them
        return (json.dumps(record, ensure_ascii=True, default=str) + "\n").encode("ascii")


def write_output(
    path: str | Path, records: Iterable[tuple[RowResult, dict[str, Any] | None]], dataset: Dataset
) -> int:
    """Write joined rows to ``path`` atomically; returns how many were written."""
    target = Path(path)
    fmt = output_format(target)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        n = _write_jsonl(tmp, records) if fmt == "jsonl" else _write_parquet(tmp, records, dataset)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(target.parent)
    return n


def _write_jsonl(tmp: Path, records: Iterable[tuple[RowResult, dict[str, Any] | None]]) -> int:
    n = 0
    with open(tmp, "wb") as f:
        for result, values in records:
            f.write(_json_line(output_record(result, values)))
            n += 1
        f.flush()
        os.fsync(f.fileno())
    return n


def _write_parquet(
    tmp: Path, records: Iterable[tuple[RowResult, dict[str, Any] | None]], dataset: Dataset
) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    input_type = dataset.input_type()
    schema = pa.schema(
        [
            ("row", pa.int64()),
            ("status", pa.string()),
            ("reason", pa.string()),
            ("output", pa.string()),
            ("output_base64", pa.string()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("padded_tokens", pa.int64()),
            ("batch_id", pa.string()),
            ("consumer", pa.string()),
            ("completed_ms", pa.int64()),
            ("input", input_type),
        ]
    )
    as_json = pa.types.is_string(input_type)
    n = 0
    buffer: list[dict[str, Any]] = []
    with pq.ParquetWriter(tmp, schema) as writer:
        for result, values in records:
            record = output_record(result, values)
            if as_json and values is not None:
                record["input"] = json.dumps(values, ensure_ascii=True, default=str)
            elif dataset.format == "csv" and values is not None:
                record["input"] = {k: _clean(v) for k, v in values.items()}
            buffer.append(record)
            n += 1
            if len(buffer) >= _PARQUET_ROW_GROUP:
                writer.write_table(pa.Table.from_pylist(buffer, schema=schema))
                buffer.clear()
        if buffer or n == 0:
            writer.write_table(pa.Table.from_pylist(buffer, schema=schema))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    return n


def _clean(value: str | None) -> str | None:
    """A CSV value fit for Parquet (valid UTF-8): undecodable bytes become U+FFFD."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_output(path: str | Path) -> list[dict[str, Any]]:
    """Every row of an output file (for tests and tools)."""
    p = Path(path)
    if output_format(p) == "jsonl":
        with open(p, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    import pyarrow.parquet as pq

    return list(pq.read_table(p).to_pylist())
