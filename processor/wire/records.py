"""The records at the boundary: typed, frozen values for every message the pipeline writes or reads.

``TokenItemRecord`` and ``BatchRecord`` keep token ids packed (``tokens_from_ids`` and
``ids_from_tokens`` convert); ``new_token_item`` builds a valid item and ``check_item`` states the item
rules every decoder applies (a non-empty id and model, no serving-key separator in the model, at
least one token, four bytes per token, a valid request or none).
The modules beside this one turn these records into bytes and back; nothing here reads bytes.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal, cast

from processor.core.contract import Contract
from processor.core.serving import SEPARATOR
from processor.core.signature import shape_signature
from processor.wire.errors import DecodeError
from processor.wire.request import GenerationRequest

_U32 = next(code for code in "IL" if array(code).itemsize == 4)

_BIG_ENDIAN = sys.byteorder == "big"


def tokens_from_ids(ids: Iterable[int]) -> bytes:
    """Pack token ids as little-endian uint32 (the ``tokens`` field)."""
    try:
        packed = array(_U32, ids)
    except OverflowError as exc:
        raise ValueError(f"token id out of uint32 range: {exc}") from None
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def ids_from_tokens(tokens: bytes | bytearray | memoryview) -> array[int]:
    """Unpack the ``tokens`` field into an ``array('I')`` of token ids."""
    ids = array(_U32)
    ids.frombytes(tokens)  # ValueError unless a multiple of 4 bytes
    if _BIG_ENDIAN:
        ids.byteswap()
    return ids


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenItemRecord:
    """A decoded ``TokenItem``. ``shape`` is the unsigned signature; ``tokens`` stays packed."""

    item_id: str
    job_id: str = ""
    model: str
    shape: int
    token_count: int
    tokens: bytes
    shape_components: tuple[str, ...] | None = None
    produced_ms: int
    output_budget: int | None = None
    metadata: dict[str, str] | None = None
    request: GenerationRequest | None = None
    """What the item asks of the model (``TokenItem.request``); None: the consumer's defaults."""

    def token_ids(self) -> array[int]:
        return ids_from_tokens(self.tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchRecord:
    """A decoded ``Batch`` (what a consumer reads). ``shape`` is unsigned."""

    batch_id: str
    consumer: str
    model: str
    shape: int
    lane: int
    padded_length: int
    pad_multiple: int
    created_ms: int
    oversized: bool = False
    items: list[TokenItemRecord]
    attempts: list[int] = field(default_factory=list)
    """Which dispatch of each item this batch is, in item order (``Batch.attempts``); empty when every
    item is on its first (:meth:`attempt`)."""

    def attempt(self, index: int) -> int:
        """The attempt of ``items[index]``: 1 unless ``attempts`` says otherwise."""
        return self.attempts[index] if self.attempts else 1


Status = Literal["ok", "failed", "rejected", "cancelled", "expired"]

STATUSES: tuple[Status, ...] = ("ok", "failed", "rejected", "cancelled", "expired")
"""``CompletionStatus``'s symbols in schema order (the enum's index on the wire). ``cancelled`` and
``expired`` (appended later) are written by the processor only, for items of a job that ended
before they were dispatched (processor/core/endings.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRecord:
    """The outcome of one item. ``padded_tokens`` is the item's share: its batch's padded length."""

    item_id: str
    job_id: str = ""
    batch_id: str = ""
    consumer: str = ""
    model: str
    status: Status
    reason: str | None = None
    input_tokens: int
    output_tokens: int = 0
    padded_tokens: int = 0
    output: bytes = b""
    queued_ms: int = 0
    engine_ms: int = 0
    completed_ms: int
    cached_tokens: int = 0
    """Prompt tokens the server served from its prefix cache (``Completion.cached_tokens``)."""
    cache_hit: bool = False
    attempt: int = 1
    """Which dispatch of the item this answers (``Completion.attempt``): 1, then one more per retry."""
    retriable: bool = False
    """A failure worth another try (``Completion.retriable``): the processor may send the item again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemOutcomeRecord:
    """One item's part of a :class:`CompletionBatchRecord`: a Completion less the batch's fields."""

    item_id: str
    status: Status
    cache_hit: bool = False
    cached_tokens: int = 0
    retriable: bool = False
    attempt: int = 1
    job_id: str = ""
    reason: str | None = None
    input_tokens: int
    output_tokens: int = 0
    output: bytes = b""
    queued_ms: int = 0


#: How a consumer writes a batch's completions: one ``CompletionBatch`` message per batch (split only
#: when too large for one Kafka message), or one ``Completion`` message per item.
CompletionForm = Literal["batch", "item"]

COMPLETION_FORMS: tuple[CompletionForm, ...] = ("batch", "item")


#: The fields a batch's completions share, written once in a ``CompletionBatch``.
BATCH_COMPLETION_FIELDS = ("batch_id", "consumer", "model", "padded_tokens", "engine_ms", "completed_ms")

_OUTCOME_FIELDS = tuple(f.name for f in fields(ItemOutcomeRecord))


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionBatchRecord:
    """The outcomes of (some of) one batch's items: one message instead of one per item.

    It says exactly what :meth:`completions` says; a batch's shared fields are written once.
    """

    batch_id: str
    consumer: str
    model: str
    padded_tokens: int = 0
    engine_ms: int = 0
    completed_ms: int
    items: list[ItemOutcomeRecord]

    @classmethod
    def of(cls, completions: Sequence[CompletionRecord]) -> CompletionBatchRecord:
        """The batch form of one batch's completions; ``ValueError`` unless they share the batch's fields."""
        if not completions:
            raise ValueError("a CompletionBatch needs at least one completion to take its batch fields from")
        first = completions[0]
        shared = {name: getattr(first, name) for name in BATCH_COMPLETION_FIELDS}
        for c in completions:
            other = next((n for n in BATCH_COMPLETION_FIELDS if getattr(c, n) != shared[n]), None)
            if other is not None:
                raise ValueError(
                    f"completion {c.item_id!r}: {other}={getattr(c, other)!r}, "
                    f"its batch's first completion has {shared[other]!r}"
                )
        items = [ItemOutcomeRecord(**{n: getattr(c, n) for n in _OUTCOME_FIELDS}) for c in completions]
        return cls(**shared, items=items)

    def completions(self) -> list[CompletionRecord]:
        """One :class:`CompletionRecord` per item, the batch's fields copied into each."""
        shared = {name: getattr(self, name) for name in BATCH_COMPLETION_FIELDS}
        return [CompletionRecord(**shared, **{n: getattr(o, n) for n in _OUTCOME_FIELDS}) for o in self.items]


@dataclass(frozen=True, slots=True)
class ContractRecord:
    """A consumer's announcement: its :class:`Contract` and when it was made."""

    contract: Contract
    announced_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerSnapshotRecord:
    instance: str
    taken_ms: int
    sequence: int
    counters: dict[str, int]
    per_model: dict[str, dict[str, int]]
    per_consumer: dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterRecord:
    reason: str
    source_topic: str
    partition: int
    offset: int
    original: bytes
    original_key: bytes | None = None
    dead_ms: int
    detail: str | None = None
    """What exactly was wrong, for a person (``reason`` is the short code); None in older records."""


def new_token_item(
    item_id: str,
    model: str,
    token_ids: Sequence[int],
    produced_ms: int,
    *,
    job_id: str = "",
    shape_components: Sequence[str] | None = None,
    shape: int | None = None,
    output_budget: int | None = None,
    metadata: Mapping[str, str] | None = None,
    request: GenerationRequest | None = None,
) -> TokenItemRecord:
    """Build a record the way a producer would: shape from the components unless given."""
    if shape is None:
        shape = shape_signature(shape_components or ())
    return TokenItemRecord(
        item_id=item_id,
        job_id=job_id,
        model=model,
        shape=shape,
        token_count=len(token_ids),
        tokens=tokens_from_ids(token_ids),
        shape_components=None if shape_components is None else tuple(shape_components),
        produced_ms=produced_ms,
        output_budget=output_budget,
        metadata=None if metadata is None else dict(metadata),
        request=request,
    )


def verify_shape(rec: TokenItemRecord) -> bool | None:
    """Whether ``shape`` matches ``shape_components`` (None when no components were sent).

    Not done on decode: the shape is the producer's claim and the hot path trusts it.
    """
    if rec.shape_components is None:
        return None
    return shape_signature(rec.shape_components) == rec.shape


def item_problem(
    item_id: str, model: str, token_count: int, tokens: bytes, request_fault: str | None = None
) -> tuple[str, str] | None:
    """The one place the item rules live, in the order they are checked; decoders raise it, encoders
    refuse it. ``request_fault`` is :func:`~processor.wire.request.request_problem` of the item's
    request (None: valid, or no request), which the decoders take from their cache of requests."""
    if not item_id:
        return "empty-item-id", "item_id is empty"
    if not model:
        return "empty-model", f"item {item_id!r}: model is empty"
    if SEPARATOR in model:
        return (
            "invalid-model",
            f"item {item_id!r}: model {model!r} contains {SEPARATOR!r}, which joins a model and an "
            "adapter in a serving key (name the adapter in the item's request instead)",
        )
    if token_count < 1:
        return "negative-token-count", f"item {item_id!r}: token_count {token_count} < 1"
    if len(tokens) != 4 * token_count:
        return (
            "token-count-mismatch",
            f"item {item_id!r}: {len(tokens)} token bytes, expected 4 * {token_count} = {4 * token_count}",
        )
    if request_fault is not None:
        return "invalid-request", f"item {item_id!r}: invalid request: {request_fault}"
    return None


def check_item(rec: TokenItemRecord, request_fault: str | None = None) -> None:
    """Structure first, then meaning: callers check trailing bytes before the item rules.
    ``request_fault`` as for :func:`item_problem`."""
    tokens = rec.tokens
    token_count = rec.token_count
    model = rec.model
    if (
        not rec.item_id
        or not model
        or token_count < 1
        or len(tokens) != 4 * token_count
        or SEPARATOR in model
        or request_fault is not None
    ):
        problem = item_problem(rec.item_id, model, token_count, tokens, request_fault)
        raise DecodeError(*cast(tuple[str, str], problem))
