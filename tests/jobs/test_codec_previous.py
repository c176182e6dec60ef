"""Job records written before retries and the cancelled / expired counts still read (processor/jobs/codec.py).

The jobs topic is compacted, not emptied: a finished job's record from before the schema gained
``retry_of``, ``attempt``, ``results_cancelled`` and ``results_expired`` stays there for as long as
the job is kept, so ``jobs`` and ``collect`` must read it with those fields' defaults.
"""

from __future__ import annotations

import pytest

from processor.jobs import codec
from processor.jobs.model import BadRow, JobRecord
from processor.wire.errors import DecodeError

#: The golden Job message as the codec wrote it before the added fields (schemas/golden/messages.json
#: of that time): header ``c3012d70fa061fcd92d3``, fingerprint 15245473221747306541.
PREVIOUS_MESSAGE = bytes.fromhex(
    "c3012d70fa061fcd92d314676f6c64656e2d6a6f6202262f646174612f70726f6d7074732e6a736f6e6c8001"
    + "30" * 64
    + "242f646174612f74656d706c6174652e747874d5a8b8d4c88bf3e354146c6c616d612d332d3862282f6461"
    "74612f746f6b656e697a65722e6a736f6e060410020418656d7074792070726f6d707400b090d5edee660294"
    "a0d5edee66000000000000"
)
PREVIOUS_FINGERPRINT = 15245473221747306541


def test_the_previous_schema_is_todays_less_the_added_fields_with_its_old_fingerprint() -> None:
    assert b"\xc3\x01" + PREVIOUS_FINGERPRINT.to_bytes(8, "little") == codec.PREVIOUS_HEADER
    assert codec.PREVIOUS_HEADER != codec.HEADER
    for name in codec.ADDED_JOB_FIELDS:
        assert f'"name":"{name}"' in codec.CANONICAL_FORM
        assert f'"name":"{name}"' not in codec.PREVIOUS_CANONICAL_FORM


def test_a_record_written_before_retries_reads_with_the_added_fields_defaults() -> None:
    rec = codec.decode_job(PREVIOUS_MESSAGE)
    assert (rec.name, rec.state, rec.rows, rec.items, rec.bad_rows) == (
        "golden-job",
        "submitted",
        3,
        2,
        (BadRow(2, "empty prompt"),),
    )
    assert (rec.retry_of, rec.attempt, rec.results_cancelled, rec.results_expired) == (None, 1, 0, 0)
    # Written again, it takes today's schema and reads back the same.
    again = codec.encode_job(rec)
    assert again[:10] == codec.HEADER and codec.decode_job(again) == rec


def test_a_retry_attempt_round_trips_and_a_truncated_previous_record_is_refused() -> None:
    rec = JobRecord(
        name="reviews.r2",
        state="submitted",
        dataset="/d.jsonl",
        dataset_sha256="ab" * 32,
        template="/t.toml",
        shape=5,
        model="m",
        tokenizer="/tok.json",
        rows=10,
        items=3,
        started_ms=1,
        submitted_ms=2,
        results_ok=1,
        results_failed=2,
        results_cancelled=1,
        results_expired=1,
        retry_of="reviews",
        attempt=2,
    )
    assert codec.decode_job(codec.encode_job(rec)) == rec
    with pytest.raises(DecodeError):
        codec.decode_job(PREVIOUS_MESSAGE[:-3])
