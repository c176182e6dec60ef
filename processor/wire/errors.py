"""Decoding is a trust boundary: what a decoder raises, and the internal signal of a malformed body.

Anything that is not a well-formed message of the expected schema raises :class:`DecodeError` (and
nothing else), with a short ``reason`` fit for a dead-letter record or a metric label. Encoders
refuse, with ``ValueError``, what the decoders would reject.
"""

from __future__ import annotations

from typing import Any


class DecodeError(ValueError):
    """A message that is not a valid record of the expected schema.

    ``reason`` is short and stable: for the frame, in the order they are checked, ``bad-magic``,
    ``unknown-schema``, ``avro-decode``, ``trailing-bytes``; for an item, in the order of
    ``processor.wire.records.item_problem`` (a message breaking several rules gets the first one's),
    ``empty-item-id``, ``empty-model``, ``invalid-model`` (a model holding the serving key's ``@``),
    ``negative-token-count``, ``token-count-mismatch``, ``invalid-request``; for a
    contract, ``invalid-contract``. The message says what exactly was wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, str(self)))


#: The frame's reasons, in the order they are checked (every record).
FRAME_REASONS = ("bad-magic", "unknown-schema", "avro-decode", "trailing-bytes")
#: A TokenItem's reasons (alone or in a Batch), in ``processor.wire.records.item_problem``'s order.
ITEM_REASONS = (
    "empty-item-id",
    "empty-model",
    "invalid-model",
    "negative-token-count",
    "token-count-mismatch",
    "invalid-request",
)
#: A ConsumerContract's and a JobShare's own reasons.
CONTRACT_REASONS = ("invalid-contract",)
SHARE_REASONS = ("invalid-share",)
#: A registry-framed ingest message's own reasons (processor.wire.registry_framing).
REGISTRY_REASONS = ("unknown-schema-id", "unresolvable-schema")
#: Every ``DecodeError.reason``: docs/wire-format.md's table (tests/test_docs_agree.py holds both).
DECODE_REASONS = (*FRAME_REASONS, *REGISTRY_REASONS, *ITEM_REASONS, *CONTRACT_REASONS, *SHARE_REASONS)


class Malformed(Exception):
    """Internal: the Avro body is not well formed (turned into DecodeError('avro-decode'))."""


MALFORMED = (Malformed, IndexError, UnicodeDecodeError)
