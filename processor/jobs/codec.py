"""The ``Job`` record on the wire: Avro single-object encoding, like every other tokenfabric message.

Kept apart from :mod:`processor.wire` (the pipeline's records and its hot-path codec) so the job
machinery can evolve without touching it; it reuses that package's header rules
(:mod:`processor.wire.schemas`: ``C3 01`` + CRC-64-AVRO fingerprint of the Parsing Canonical Form) and
its :class:`~processor.wire.errors.DecodeError`, so a reader of the jobs topic fails the same way as
any other reader.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
from fastavro.schema import parse_schema, to_parsing_canonical_form

from processor.core.shares import JobPolicy
from processor.core.signature import to_signed, to_unsigned
from processor.jobs.model import JOB_STATES, BadRow, JobRecord
from processor.wire.fastavro_io import decode_with_writers
from processor.wire.job_share import JobShareRecord, decode_job_share_record, encode_job_share_record
from processor.wire.schemas import MAGIC, rabin_fingerprint, schema_dir

SCHEMA_NAME = "Job"
#: The fields the Job record gained after its first schema (retry attempts, cancelled and expired
#: counts, the submit options), each with a default: records on the jobs topic written before them still read.
ADDED_JOB_FIELDS = ("retry_of", "attempt", "results_cancelled", "results_expired", "options")


def _raw(name: str) -> dict[str, Any]:
    raw = json.loads((schema_dir() / f"{name}.avsc").read_text(encoding="utf-8"))
    assert isinstance(raw, dict)
    return raw


def _load(name: str = SCHEMA_NAME) -> tuple[Any, str]:
    parsed = parse_schema(_raw(name))
    return parsed, to_parsing_canonical_form(parsed)


def _previous_job_schema() -> dict[str, Any]:
    """The Job schema before :data:`ADDED_JOB_FIELDS`: today's less those fields, byte for byte the
    schema the codec wrote with until then (tests/jobs/test_codec_previous.py holds its fingerprint)."""
    raw = _raw(SCHEMA_NAME)
    return {**raw, "fields": [f for f in raw["fields"] if f["name"] not in ADDED_JOB_FIELDS]}


_SCHEMA, CANONICAL_FORM = _load()
FINGERPRINT = rabin_fingerprint(CANONICAL_FORM.encode())
HEADER = MAGIC + FINGERPRINT.to_bytes(8, "little")
PREVIOUS_SCHEMA = parse_schema(_previous_job_schema())
PREVIOUS_CANONICAL_FORM = to_parsing_canonical_form(PREVIOUS_SCHEMA)
PREVIOUS_HEADER = MAGIC + rabin_fingerprint(PREVIOUS_CANONICAL_FORM.encode()).to_bytes(8, "little")
#: The writer schema of each header the decoder reads: today's, and the one before retries.
_WRITERS = {HEADER: _SCHEMA, PREVIOUS_HEADER: PREVIOUS_SCHEMA}


def encode_job(rec: JobRecord) -> bytes:
    """A job record as a message value; ``ValueError`` for a state the schema does not know."""
    if rec.state not in JOB_STATES:
        raise ValueError(f"job state {rec.state!r} is not one of {JOB_STATES}")
    d = {
        "name": rec.name,
        "state": rec.state,
        "dataset": rec.dataset,
        "dataset_sha256": rec.dataset_sha256,
        "template": rec.template,
        "shape": to_signed(rec.shape),
        "model": rec.model,
        "tokenizer": rec.tokenizer,
        "rows": rec.rows,
        "items": rec.items,
        "input_tokens": rec.input_tokens,
        "bad_rows": [{"row": b.row, "reason": b.reason} for b in rec.bad_rows],
        "started_ms": rec.started_ms,
        "submitted_ms": rec.submitted_ms,
        "error": rec.error,
        "results_ok": rec.results_ok,
        "results_failed": rec.results_failed,
        "output_tokens": rec.output_tokens,
        "progress_ms": rec.progress_ms,
        "finished_ms": rec.finished_ms,
        "retry_of": rec.retry_of,
        "attempt": rec.attempt,
        "results_cancelled": rec.results_cancelled,
        "results_expired": rec.results_expired,
        "options": rec.options,
    }
    out = io.BytesIO()
    out.write(HEADER)
    try:
        fastavro.schemaless_writer(out, _SCHEMA, d)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"job {rec.name!r}: cannot encode: {exc}") from None
    return out.getvalue()


def decode_job(value: bytes | bytearray | memoryview | None) -> JobRecord:
    """A message value as a job record (today's schema or the previous one, whose records get the
    added fields' defaults); :class:`DecodeError` for anything else."""
    d = decode_with_writers(value, _WRITERS, _SCHEMA, "Job")
    return JobRecord(
        name=d["name"],
        state=d["state"],
        dataset=d["dataset"],
        dataset_sha256=d["dataset_sha256"],
        template=d["template"],
        shape=to_unsigned(d["shape"]),
        model=d["model"],
        tokenizer=d["tokenizer"],
        rows=d["rows"],
        items=d["items"],
        input_tokens=d["input_tokens"],
        bad_rows=tuple(BadRow(b["row"], b["reason"]) for b in d["bad_rows"]),
        started_ms=d["started_ms"],
        submitted_ms=d["submitted_ms"],
        error=d["error"],
        results_ok=d["results_ok"],
        results_failed=d["results_failed"],
        output_tokens=d["output_tokens"],
        progress_ms=d["progress_ms"],
        finished_ms=d["finished_ms"],
        retry_of=d["retry_of"],
        attempt=d["attempt"],
        results_cancelled=d["results_cancelled"],
        results_expired=d["results_expired"],
        options=d["options"],
    )


def encode_job_share(job: str, policy: JobPolicy, set_ms: int, max_attempts: int | None = None) -> bytes:
    """A job's share (weight and quotas: docs/shares.md) as a message value of the job-shares topic,
    with no cancel and no deadline, and ``max_attempts`` (None: the default; the whole record:
    :mod:`processor.wire.job_share`)."""
    return encode_job_share_record(JobShareRecord(job, policy, set_ms, max_attempts=max_attempts))


def decode_job_share(value: bytes | bytearray | memoryview | None) -> tuple[str, JobPolicy, int]:
    """(job, policy, set_ms) of a job-shares message, current or previous schema; :class:`DecodeError`
    for anything else, ``invalid-share`` for a policy :class:`JobPolicy` refuses (a weight of 0, say)."""
    rec = decode_job_share_record(value)
    return rec.job, rec.policy, rec.set_ms
