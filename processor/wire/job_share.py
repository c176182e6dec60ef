"""The ``JobShare`` record whole: a job's share policy and its lifecycle (cancelled, deadline).

One record per job on the compacted job-shares topic, keyed by the job's name: compaction keeps the
latest, so the latest record must carry everything the job's processors need to know, and every
writer (``submit``, ``share``, ``cancel``) writes the whole record, keeping the fields it does not
change (processor/ops/lifecycle.py reads the current one first). A cancel and a deadline ride on the
share record, not on a record of their own, because two records under one key would compact each
other away, and a key of their own would be a second grammar on a topic every processor already
reads from the beginning (docs/jobs.md, "Lifecycle").

Records written before ``cancelled_ms`` and ``deadline_ms`` existed (``LIFECYCLE_FIELDS_ADDED``) carry
the previous fingerprint (``PREVIOUS_JOB_SHARE_HEADER``) and read with both null; those written
before ``max_attempts`` (``RETRY_FIELDS_ADDED``, ``PRE_RETRY_JOB_SHARE_HEADER``) read with it null.
An older reader does not know the current header (it logs the record as undecodable and keeps the
policy it had): upgrade the processors before cancelling a job, giving it a deadline or attempts.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any

import fastavro
from fastavro.schema import parse_schema, to_parsing_canonical_form

from processor.core.shares import JobPolicy
from processor.wire.errors import DecodeError
from processor.wire.fastavro_io import decode_with_writers
from processor.wire.schemas import MAGIC, rabin_fingerprint, schema_dir

LIFECYCLE_FIELDS_ADDED = ("cancelled_ms", "deadline_ms")
"""The fields ``JobShare`` gained with cancel and deadlines (both null by default)."""
RETRY_FIELDS_ADDED = ("max_attempts",)
"""The field ``JobShare`` gained with retries inside the pipeline (null by default: 3 attempts)."""


@dataclass(frozen=True, slots=True)
class JobShareRecord:
    """A job's share policy and lifecycle, as one ``JobShare`` message carries them."""

    job: str
    policy: JobPolicy
    set_ms: int
    """Wall-clock time the record was written, epoch milliseconds."""
    cancelled_ms: int | None = None
    """When the job was cancelled; None while it is not. Final: writers keep it."""
    deadline_ms: int | None = None
    """When the job's undispatched items expire; None for no deadline."""
    max_attempts: int | None = None
    """Dispatches each item gets in all (processor/core/retries.py); None for the default, 3."""


def _schema(added: tuple[str, ...]) -> tuple[Any, bytes]:
    raw = json.loads((schema_dir() / "JobShare.avsc").read_text(encoding="utf-8"))
    raw["fields"] = [f for f in raw["fields"] if f["name"] not in added]
    parsed = parse_schema(raw, {}, expand=True)
    fingerprint = rabin_fingerprint(to_parsing_canonical_form(parsed).encode())
    return parsed, MAGIC + fingerprint.to_bytes(8, "little")


_SCHEMA, JOB_SHARE_HEADER = _schema(())
_PREVIOUS_SCHEMA, PREVIOUS_JOB_SHARE_HEADER = _schema((*LIFECYCLE_FIELDS_ADDED, *RETRY_FIELDS_ADDED))
_PRE_RETRY_SCHEMA, PRE_RETRY_JOB_SHARE_HEADER = _schema(RETRY_FIELDS_ADDED)
JOB_SHARE_CANONICAL_FORM = to_parsing_canonical_form(_SCHEMA)
"""The current schema's Parsing Canonical Form (its fingerprint is in :data:`JOB_SHARE_HEADER`)."""
_WRITERS = {
    JOB_SHARE_HEADER: _SCHEMA,
    PRE_RETRY_JOB_SHARE_HEADER: _PRE_RETRY_SCHEMA,
    PREVIOUS_JOB_SHARE_HEADER: _PREVIOUS_SCHEMA,
}


def encode_job_share_record(rec: JobShareRecord) -> bytes:
    """``rec`` as a message value of the job-shares topic."""
    p = rec.policy
    d = {
        "job": rec.job,
        "weight": float(p.weight),
        "max_tokens_per_s": p.max_tokens_per_s,
        "max_tokens": p.max_tokens,
        "burst_ms": p.burst_ms,
        "set_ms": rec.set_ms,
        "cancelled_ms": rec.cancelled_ms,
        "deadline_ms": rec.deadline_ms,
        "max_attempts": rec.max_attempts,
    }
    out = io.BytesIO()
    out.write(JOB_SHARE_HEADER)
    fastavro.schemaless_writer(out, _SCHEMA, d, strict=True)
    return out.getvalue()


def encode_previous_job_share(rec: JobShareRecord) -> bytes:
    """``rec`` as a writer of the previous schema wrote it (no lifecycle: tests, upgrades)."""
    p = rec.policy
    d = {"job": rec.job, "weight": float(p.weight), "max_tokens_per_s": p.max_tokens_per_s}
    d |= {"max_tokens": p.max_tokens, "burst_ms": p.burst_ms, "set_ms": rec.set_ms}
    out = io.BytesIO()
    out.write(PREVIOUS_JOB_SHARE_HEADER)
    fastavro.schemaless_writer(out, _PREVIOUS_SCHEMA, d, strict=True)
    return out.getvalue()


def decode_job_share_record(value: bytes | bytearray | memoryview | None) -> JobShareRecord:
    """A job-shares message, current or previous schema; :class:`DecodeError` for anything else,
    ``invalid-share`` for a policy :class:`JobPolicy` refuses (a weight of 0, say)."""
    d = decode_with_writers(value, _WRITERS, _SCHEMA, "JobShare")
    try:
        policy = JobPolicy(d["weight"], d["max_tokens_per_s"], d["max_tokens"], d["burst_ms"])
    except ValueError as exc:
        raise DecodeError("invalid-share", f"job {d['job']!r}: {exc}") from None
    if d["max_attempts"] is not None and d["max_attempts"] < 1:
        raise DecodeError("invalid-share", f"job {d['job']!r}: max_attempts {d['max_attempts']} < 1")
    return JobShareRecord(
        d["job"], policy, d["set_ms"], d["cancelled_ms"], d["deadline_ms"], d["max_attempts"]
    )
