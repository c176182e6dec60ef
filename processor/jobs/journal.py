"""The collect journal: an append-only JSON-lines file that makes ``collect`` resumable and idempotent.

It lives beside the output (``<out>.journal``) and holds, in order:

1. a header line naming the job submission it belongs to (``job``, ``started_ms``, ``dataset_sha256``);
2. row result lines: a result is appended only when it supersedes the row's result so far
   (:meth:`RowResult.supersedes <processor.jobs.model.RowResult.supersedes>`: a later job attempt,
   or a later try of the item within one), so duplicate completions on the results topic cannot
   produce duplicate rows, and a row has at most one line per (attempt, try). Reading the journal
   back keeps the latest per row by the same rule, whatever the order of its lines;
3. now and then a checkpoint line with the results-topic offsets (per partition) that every result
   line above it accounts for, and the job's retry attempts it covers (``attempts``: an attempt
   not listed there is read from its start, however far the offsets are).

Writes go result lines first, then the checkpoint, then ``fsync``. If the process dies between any
two steps the journal is still right: a torn last line is cut off when the journal is reopened; result
lines after the last checkpoint are kept, and the messages they came from are read again from the
older checkpoint and skipped because their rows are already present. The output file itself is only
ever derived from the journal, so it can be rebuilt at any time.

One writer at a time: the journal is held under an exclusive ``flock`` while open, and a second
collect on the same output is refused rather than interleaved.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from processor.jobs.model import JobRecord, RowResult

FORMAT_VERSION = 1


class JournalError(RuntimeError):
    """The journal cannot be used (locked, from another submission, corrupt); the message says what to do."""


class Journal:
    """The rows collected so far and the offsets they account for. Use :meth:`open`."""

    def __init__(self, path: Path, file: IO[bytes], header: dict[str, Any]) -> None:
        self.path = path
        self.header = header
        self.results: dict[int, RowResult] = {}
        self.checkpoint: dict[int, int] | None = None
        #: The retry attempts (job names) whose results the checkpoint accounts for.
        self.attempts: frozenset[str] = frozenset()
        self._file = file

    @classmethod
    def open(cls, path: str | Path, job: JobRecord) -> Journal:
        """Open (or create) the journal of ``job`` at ``path``, locked, with its rows read back."""
        p = Path(path)
        f = open(p, "a+b")  # noqa: SIM115 - the journal keeps the handle (and its lock) until close()
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise JournalError(
                f"{p} is in use by another collect or collector; wait for it or stop it"
            ) from None
        try:
            journal = cls._replay(p, f, job)
        except BaseException:
            f.close()
            raise
        return journal

    @classmethod
    def _replay(cls, path: Path, f: IO[bytes], job: JobRecord) -> Journal:
        f.seek(0)
        data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            f.truncate(len(complete))  # a torn last line from a crash mid-write
        want = {
            "journal": FORMAT_VERSION,
            "job": job.name,
            "started_ms": job.started_ms,
            "dataset_sha256": job.dataset_sha256,
        }
        lines = complete.splitlines()
        if not lines:
            journal = cls(path, f, want)
            journal._append([json.dumps(want)])
            return journal
        header = _parse(path, 1, lines[0])
        if {k: header.get(k) for k in want} != want:
            raise JournalError(
                f"{path} belongs to job {header.get('job')!r} started at {header.get('started_ms')}, "
                f"not to job {job.name!r} started at {job.started_ms}: choose another output or delete it"
            )
        journal = cls(path, f, header)
        for n, line in enumerate(lines[1:], start=2):
            entry = _parse(path, n, line)
            if "checkpoint" in entry:
                journal.checkpoint = {int(p): int(o) for p, o in entry["checkpoint"].items()}
                journal.attempts = frozenset(entry.get("attempts", ()))
            else:
                result = RowResult.from_json(entry)
                if result.supersedes(journal.results.get(result.row)):
                    journal.results[result.row] = result
        return journal

    def add(
        self,
        results: Iterable[RowResult],
        checkpoint: dict[int, int] | None,
        attempts: frozenset[str] | None = None,
    ) -> int:
        """Append the results that supersede their rows' (new rows, later attempts), then
        ``checkpoint`` with the ``attempts`` it covers; returns how many results were appended."""
        lines: list[str] = []
        for r in results:
            if not r.supersedes(self.results.get(r.row)):
                continue
            self.results[r.row] = r
            lines.append(json.dumps(r.to_journal(), ensure_ascii=False))
        new = len(lines)
        attempts = self.attempts if attempts is None else attempts
        if checkpoint is not None and (checkpoint != self.checkpoint or attempts != self.attempts):
            self.checkpoint, self.attempts = dict(checkpoint), attempts
            entry: dict[str, Any] = {"checkpoint": {str(p): o for p, o in sorted(checkpoint.items())}}
            if attempts:
                entry["attempts"] = sorted(attempts)
            lines.append(json.dumps(entry))
        if lines:
            self._append(lines)
        return new

    def _append(self, lines: list[str]) -> None:
        self._file.seek(0, os.SEEK_END)
        self._file.write("".join(line + "\n" for line in lines).encode("utf-8"))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()  # releases the lock

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse(path: Path, n: int, line: bytes) -> dict[str, Any]:
    try:
        entry = json.loads(line)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        raise JournalError(
            f"{path}:{n}: not a journal line (the file is damaged; delete it to collect again)"
        )
    return entry
