"""The fixed values of the golden messages (schemas/golden/): one value of every record, the previous
schemas' messages and TokenItems with requests. tests/wire/test_golden.py writes them to the files
and holds the files to the code; kept apart so that file stays a page of tests.

The values are chosen so that any library writes the same bytes: every map has one entry (Avro
leaves the order of a map's entries to the writer), a shape signature of 2^63 or more shows the
signed long on the wire, and every double is exact in binary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from processor.core.contract import Contract
from processor.core.shares import JobPolicy
from processor.core.signature import to_signed
from processor.jobs import codec as jobs_codec
from processor.jobs.model import BadRow, JobRecord
from processor.wire.completions import (
    PREVIOUS_COMPLETION,
    PREVIOUS_COMPLETION_BATCH,
    decode_completion,
    decode_completion_batch,
    encode_completion,
    encode_completion_batch,
)
from processor.wire.control import (
    decode_contract,
    decode_dead_letter,
    decode_ledger_snapshot,
    encode_contract,
    encode_dead_letter,
    encode_ledger_snapshot,
)
from processor.wire.fastavro_io import (
    PRE_ATTEMPTS_BATCH,
    PREVIOUS_BATCH,
    PREVIOUS_TOKEN_ITEM,
    PreviousSchema,
)
from processor.wire.items import (
    decode_batch,
    decode_token_item,
    encode_batch_record,
    encode_token_item,
)
from processor.wire.records import (
    BATCH_COMPLETION_FIELDS,
    BatchRecord,
    CompletionBatchRecord,
    CompletionRecord,
    ContractRecord,
    DeadLetterRecord,
    ItemOutcomeRecord,
    LedgerSnapshotRecord,
    TokenItemRecord,
    new_token_item,
)
from processor.wire.request import GenerationRequest
from tests.wire.helpers import item_dict

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, epoch ms
MODEL = "llama-3-8b"
SYSTEM_PROMPT = "You are a helpful assistant."  # signature 0xd59c19d1bab8f5d5 (docs/signatures.md)

LABEL_SCHEMA = '{"type":"object","properties":{"label":{"type":"string"}},"required":["label"]}'

FULL_REQUEST = GenerationRequest(
    priority=1,
    temperature=0.25,  # doubles exact in binary, so every language prints the same JSON number
    top_p=0.5,
    top_k=40,
    seed=1234,
    stop=("\n\n",),
    stop_token_ids=(128009,),
    logprobs=2,
    json_schema=LABEL_SCHEMA,
    extra='{"repetition_penalty":1.5}',
)
"""A request with every field set but the adapter (the golden batch is the base model's) and the
two other structured-output constraints (at most one is allowed): :data:`REQUEST_ITEMS` show those."""

ITEM = new_token_item(
    "golden-1",
    MODEL,
    [128000, 9906, 1917],
    T0,
    job_id="golden-job",
    shape_components=[SYSTEM_PROMPT],
    output_budget=256,
    metadata={"tenant": "acme"},
    request=FULL_REQUEST,
)
"""An item with every optional field set."""

PLAIN_ITEM = new_token_item("golden-2", MODEL, [128000, 40, 1097, 264, 2872], T0 + 5, shape=ITEM.shape)
"""The same shape sent without its components, no output budget, no metadata: every union null."""

CONTRACT = Contract("card-a", MODEL, budget_tokens=4096, max_items=32, pad_multiple=8, max_inflight=2)

BATCH = BatchRecord(
    batch_id="processor-0-1767225599000-42",
    consumer=CONTRACT.consumer,
    model=MODEL,
    shape=ITEM.shape,
    lane=2,
    padded_length=CONTRACT.padded_length(max(ITEM.token_count, PLAIN_ITEM.token_count)),
    pad_multiple=CONTRACT.pad_multiple,
    created_ms=T0 + 250,
    items=[ITEM, PLAIN_ITEM],
    attempts=[2, 1],
)
"""The first item is on its second attempt (a retriable failure sent it back: its completion is
``OK``, of attempt 2), so the batch carries ``attempts``; :data:`FIRST_ATTEMPT_BATCH` is the same
batch on first attempts."""

FIRST_ATTEMPT_BATCH = dataclasses.replace(BATCH, attempts=[])
""":data:`BATCH` with every item on its first attempt: written with the header before ``attempts``."""

ENGINE_MS = 60
COMPLETED_MS = BATCH.created_ms + ENGINE_MS + 4


def completion_of(item: TokenItemRecord, **outcome: Any) -> CompletionRecord:
    """``item``'s completion in :data:`BATCH`: the fields docs/consumers.md says a consumer copies
    from the item and the batch, ``queued_ms`` as ``created_ms - produced_ms``, and ``outcome``."""
    return CompletionRecord(
        item_id=item.item_id,
        job_id=item.job_id,
        batch_id=BATCH.batch_id,
        consumer=BATCH.consumer,
        model=BATCH.model,
        input_tokens=item.token_count,
        padded_tokens=BATCH.padded_length,
        queued_ms=BATCH.created_ms - item.produced_ms,
        engine_ms=ENGINE_MS,
        completed_ms=COMPLETED_MS,
        **outcome,
    )


OK = completion_of(
    ITEM, status="ok", output_tokens=2, output=b"Hi!", cached_tokens=2, cache_hit=True, attempt=2
)
"""Two of its three prompt tokens served from the engine's prefix cache (one computed), on the
item's second attempt (its first failed retriably, as ``FAILED`` does)."""

FAILED = completion_of(
    PLAIN_ITEM, status="failed", reason="engine error: RuntimeError: out of memory", retriable=True
)
"""A failure worth another try: the processor sends the item back to the lanes."""

JOB = JobRecord(
    name="golden-job",
    state="submitted",
    dataset="/data/prompts.jsonl",
    dataset_sha256="0" * 64,
    template="/data/template.txt",
    shape=ITEM.shape,
    model=MODEL,
    tokenizer="/data/tokenizer.json",
    rows=3,
    items=2,
    input_tokens=ITEM.token_count + PLAIN_ITEM.token_count,
    bad_rows=(BadRow(2, "empty prompt"),),
    started_ms=T0 - 1000,
    submitted_ms=T0 + 10,
)


@dataclass(frozen=True, slots=True)
class Golden:
    """One record's fixed value and the codec functions that write and read it."""

    name: str
    value: object
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], object]


GOLDEN_RECORDS = [
    Golden("TokenItem", ITEM, encode_token_item, decode_token_item),
    Golden("Batch", BATCH, encode_batch_record, decode_batch),
    Golden("Completion", OK, encode_completion, decode_completion),
    Golden(
        "CompletionBatch",
        CompletionBatchRecord.of([OK, FAILED]),
        encode_completion_batch,
        decode_completion_batch,
    ),
    Golden("ConsumerContract", ContractRecord(CONTRACT, T0 - 2000), encode_contract, decode_contract),
    Golden(
        "LedgerSnapshot",
        LedgerSnapshotRecord(
            instance="processor-0",
            taken_ms=T0 + 500,
            sequence=7,
            counters={"received_tokens": ITEM.token_count + PLAIN_ITEM.token_count},
            per_model={MODEL: {"received_items": 2}},
            per_consumer={CONTRACT.consumer: {"routed_items": 2}},
        ),
        encode_ledger_snapshot,
        decode_ledger_snapshot,
    ),
    Golden(
        "DeadLetter",
        DeadLetterRecord(
            reason="bad-magic",
            detail="not an Avro single-object message (expected Batch, no C3 01 header)",
            source_topic="tokenfabric.batches.card-a",
            partition=0,
            offset=17,
            original=b"not a batch",
            original_key=b"processor-0-1767225599000-41",
            dead_ms=T0 + 300,
        ),
        encode_dead_letter,
        decode_dead_letter,
    ),
    Golden("Job", JOB, jobs_codec.encode_job, jobs_codec.decode_job),
    Golden(
        "JobShare",
        (JOB.name, JobPolicy(weight=2.0, max_tokens=1_000_000), T0 - 500),
        lambda share: jobs_codec.encode_job_share(*share),
        jobs_codec.decode_job_share,
    ),
]

GOLDEN_BY_NAME = {g.name: g for g in GOLDEN_RECORDS}

ADAPTER = "support-tone"

REQUEST_ITEMS = [
    dataclasses.replace(ITEM, item_id=f"golden-request-{i}", request=request)
    for i, request in enumerate(
        (
            GenerationRequest(adapter=ADAPTER, temperature=0.0, choices=("positive", "negative", "neutral")),
            GenerationRequest(seed=-7, regex="[0-9]{4}-[0-9]{2}-[0-9]{2}", stop=("\n",)),
            GenerationRequest(adapter=ADAPTER),
        ),
        start=1,
    )
]
"""TokenItems whose requests show what the golden item's does not: an adapter (the processor
schedules it under the serving key ``llama-3-8b@support-tone``), a choice list, a regex, a negative
seed, and a request that names only the adapter (every other field its default)."""


def _as_previous(rec: CompletionRecord) -> CompletionRecord:
    """``rec`` as a consumer older than ``cached_tokens`` wrote it, and as readers now read that."""
    return CompletionRecord(**{**_fields_of(rec), "cached_tokens": 0, "attempt": 1, "retriable": False})


def _fields_of(rec: CompletionRecord) -> dict[str, Any]:
    return {name: getattr(rec, name) for name in CompletionRecord.__dataclass_fields__}


PREVIOUS_OUTCOMES = CompletionBatchRecord.of([_as_previous(OK), _as_previous(FAILED)])


def _previous_batch_message(rec: CompletionBatchRecord) -> bytes:
    fields = {name: getattr(rec, name) for name in BATCH_COMPLETION_FIELDS}
    items = [{n: getattr(o, n) for n in ItemOutcomeRecord.__dataclass_fields__} for o in rec.items]
    return PREVIOUS_COMPLETION_BATCH.encode({**fields, "items": items})


def without_request(rec: TokenItemRecord) -> TokenItemRecord:
    return dataclasses.replace(rec, request=None)


PREVIOUS_ITEM_RECORDS: list[tuple[PreviousSchema, Golden]] = [
    (
        PREVIOUS_TOKEN_ITEM,
        Golden(
            "TokenItem",
            without_request(ITEM),
            lambda rec: PREVIOUS_TOKEN_ITEM.encode(item_dict(rec)),
            decode_token_item,
        ),
    ),
    (
        PREVIOUS_BATCH,
        Golden(
            "Batch",
            dataclasses.replace(FIRST_ATTEMPT_BATCH, items=[without_request(i) for i in BATCH.items]),
            lambda rec: PREVIOUS_BATCH.encode(
                {
                    **{f: getattr(rec, f) for f in BatchRecord.__dataclass_fields__ if f != "items"},
                    "shape": to_signed(rec.shape),
                    "items": [item_dict(i) for i in rec.items],
                }
            ),
            decode_batch,
        ),
    ),
]
"""Messages written before TokenItem gained ``request`` (Batch with it, in its items): what a
producer (or a processor) not yet upgraded writes. Every reader reads them with no request."""

PREVIOUS_COMPLETION_RECORDS: list[tuple[PreviousSchema, Golden]] = [
    (
        PREVIOUS_COMPLETION,
        Golden(
            "Completion",
            _as_previous(OK),
            lambda rec: PREVIOUS_COMPLETION.encode(_fields_of(rec)),
            decode_completion,
        ),
    ),
    (
        PREVIOUS_COMPLETION_BATCH,
        Golden(
            "CompletionBatch",
            PREVIOUS_OUTCOMES,
            _previous_batch_message,
            decode_completion_batch,
        ),
    ),
]
"""Messages in a record's previous schema (before ``cached_tokens``): what consumers not yet
upgraded write, and what the results topic holds from before. Readers read them with 0 there."""

PRE_ATTEMPTS_RECORDS: list[tuple[PreviousSchema, Golden]] = [
    (PRE_ATTEMPTS_BATCH, Golden("Batch", FIRST_ATTEMPT_BATCH, encode_batch_record, decode_batch)),
]
"""A Batch written before ``attempts``: what the processor writes while every item of a batch is on
its first attempt (byte for byte what it wrote before retries), so consumer apps not yet upgraded
read it. Readers read it with ``attempts`` empty."""

PREVIOUS_RECORDS = [*PREVIOUS_COMPLETION_RECORDS, *PREVIOUS_ITEM_RECORDS, *PRE_ATTEMPTS_RECORDS]

JOB_RECORDS = ("Job", "JobShare")
