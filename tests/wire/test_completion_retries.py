"""A completion's ``attempt`` and ``retriable`` (retries inside the pipeline, docs/jobs.md): written
and read by every decoder, and the messages of the schema before them still read, as attempt 1 and
not retriable. (processor/wire/completions.py, processor/wire/heads.py)"""

from __future__ import annotations

from processor.wire.completion_heads import (
    decode_completion_head,
    decode_completion_head_strict,
    decode_completions_head,
)
from processor.wire.completions import (
    PRE_RETRY_COMPLETION,
    PRE_RETRY_COMPLETION_BATCH,
    decode_completions,
    encode_completion,
    encode_completion_batch,
)
from processor.wire.records import CompletionBatchRecord, CompletionRecord, ItemOutcomeRecord


def failed(item_id: str, retriable: bool, attempt: int = 1, status: str = "failed") -> CompletionRecord:
    return CompletionRecord(
        item_id=item_id,
        job_id="nightly",
        batch_id="b-1",
        consumer="c",
        model="m",
        status=status,  # type: ignore[arg-type]
        reason="engine timed out after 30 s",
        input_tokens=7,
        completed_ms=1_700_000_000_000,
        cached_tokens=300,  # two varint bytes: the head walks back over them
        attempt=attempt,
        retriable=retriable,
    )


def test_a_retriable_failure_reads_as_such_in_both_forms_and_in_every_head() -> None:
    one = failed("a", True, attempt=2)
    value = encode_completion(one)
    assert decode_completions(value) == [one]
    assert decode_completion_head(value).retriable and decode_completion_head_strict(value).retriable
    assert decode_completion_head(value).cached_tokens == 300
    assert decode_completions_head(value).retriable == ["a"]
    recs = [failed("x", True, 3), failed("y", False), failed("z", True, 200, status="ok")]
    batch = encode_completion_batch(CompletionBatchRecord.of(recs))
    assert decode_completions(batch) == recs
    head = decode_completions_head(batch)
    assert head.retriable == ["x"]  # an ok item's flag means nothing
    assert head.cached_tokens == [300, 300, 300]


def test_messages_written_before_attempt_and_retriable_read_as_attempt_1_not_retriable() -> None:
    rec = failed("a", True, attempt=2)
    fields = {n: getattr(rec, n) for n in CompletionRecord.__dataclass_fields__}
    old = PRE_RETRY_COMPLETION.encode(fields)
    (read,) = decode_completions(old)
    assert (read.attempt, read.retriable, read.cached_tokens) == (1, False, 300)
    assert decode_completion_head(old) == decode_completion_head_strict(old)
    assert not decode_completion_head(old).retriable and decode_completion_head(old).cached_tokens == 300
    outcome = ItemOutcomeRecord(item_id="x", status="failed", input_tokens=3, retriable=True, attempt=3)
    batch = {"batch_id": "b-1", "consumer": "c", "model": "m", "padded_tokens": 0, "engine_ms": 0}
    items = [{n: getattr(outcome, n) for n in outcome.__dataclass_fields__}]
    old_batch = PRE_RETRY_COMPLETION_BATCH.encode({**batch, "completed_ms": 5, "items": items})
    assert [(c.attempt, c.retriable) for c in decode_completions(old_batch)] == [(1, False)]
    assert decode_completions_head(old_batch).retriable == ()


def test_the_pre_retry_headers_are_the_ones_already_on_the_topics() -> None:
    """The current schemas before this change (golden messages.json at the time) wrote these."""
    assert PRE_RETRY_COMPLETION.header.hex() == "c301f24abc75868a0c24"
    assert PRE_RETRY_COMPLETION_BATCH.header.hex() == "c301455f4e38983b90e4"


def test_a_job_share_carries_max_attempts_and_records_of_before_read_with_none() -> None:
    from processor.core.shares import JobPolicy
    from processor.wire.job_share import (
        PRE_RETRY_JOB_SHARE_HEADER,
        JobShareRecord,
        decode_job_share_record,
        encode_job_share_record,
    )

    rec = JobShareRecord("nightly", JobPolicy(weight=2.0), 5, cancelled_ms=7, deadline_ms=9, max_attempts=5)
    assert decode_job_share_record(encode_job_share_record(rec)) == rec
    # the header the current schema had before max_attempts (records already on the topic): its
    # records are the current ones less the last field (a null union: one zero byte)
    assert PRE_RETRY_JOB_SHARE_HEADER.hex() == "c301125922b172f580c2"
    older = JobShareRecord("nightly", JobPolicy(weight=2.0), 5, cancelled_ms=7, deadline_ms=9)
    current = encode_job_share_record(older)
    assert current.endswith(b"\x00")
    assert decode_job_share_record(PRE_RETRY_JOB_SHARE_HEADER + current[10:-1]) == older
