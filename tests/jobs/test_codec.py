"""The job record on the wire (processor/jobs/codec.py) and its schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processor.core.shares import JobPolicy
from processor.jobs.codec import decode_job, decode_job_share, encode_job, encode_job_share
from processor.wire.completions import encode_completion
from processor.wire.errors import DecodeError
from processor.wire.records import CompletionRecord
from tests.common import ROOT
from tests.jobs.helpers import job_record


def test_job_records_round_trip_through_the_wire_format(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    rec = job_record(data)
    assert decode_job(encode_job(rec)) == rec
    with pytest.raises(DecodeError) as exc:
        decode_job(
            encode_completion(
                CompletionRecord(item_id="x", model="m", status="ok", input_tokens=1, completed_ms=0)
            )
        )
    assert exc.value.reason == "unknown-schema"
    with pytest.raises(DecodeError):
        decode_job(encode_job(rec)[:-3])


def test_the_job_schema_is_documented_and_packaged_identically() -> None:
    source, packaged = ROOT / "schemas" / "Job.avsc", ROOT / "processor" / "wire" / "avsc" / "Job.avsc"
    assert source.read_bytes() == packaged.read_bytes()
    schema = json.loads(source.read_text())
    assert (schema["name"], schema["namespace"]) == ("Job", "tokenfabric") and schema["doc"]
    assert all(f.get("doc", "").strip() for f in schema["fields"])


def test_a_job_share_round_trips_and_a_bad_one_is_refused_with_a_reason() -> None:
    policy = JobPolicy(weight=2.5, max_tokens_per_s=1000.0, max_tokens=None, burst_ms=500)
    assert decode_job_share(encode_job_share("nightly", policy, 123)) == ("nightly", policy, 123)
    assert decode_job_share(encode_job_share("j", JobPolicy(), 0))[1] == JobPolicy()
    bad = encode_job_share("j", JobPolicy(), 0).replace(b"\x00\x00\x00\x00\x00\x00\xf0?", b"\x00" * 8)
    with pytest.raises(DecodeError) as info:
        decode_job_share(bad)
    assert info.value.reason == "invalid-share"
    with pytest.raises(DecodeError) as info:
        decode_job_share(b"\xc3\x01" + bytes(8) + b"x")
    assert info.value.reason == "unknown-schema"
