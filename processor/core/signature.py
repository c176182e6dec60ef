"""Shape signatures: one unsigned 64-bit number naming the cacheable prefix of a prompt template.

A producer lists the cacheable components of its template in order (system prompt, few-shot block,
tool schema, ...). Two prompts with the same components in the same order can share an engine's
prefix KV cache, so the processor keeps them in the same *shape* and never mixes shapes in a batch.

Byte layout (stable across machines and languages; see docs/signatures.md and the test vectors in
schemas/signature-test-vectors.json):

1. Each component is encoded as UTF-8 (a ``bytes`` component is taken as is) and hashed with
   XXH3-64, seed 0, giving an unsigned 64-bit digest.
2. The digests are written one after another, each as 8 bytes little-endian.
3. The signature is XXH3-64 (seed 0) of that byte string. An empty list hashes the empty string.

Avro has no unsigned long: on the wire the signature travels as the signed 64-bit integer with the
same bits (``to_signed`` / ``to_unsigned``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

import xxhash

_U64 = (1 << 64) - 1


def component_digest(component: str | bytes) -> int:
    """XXH3-64 (seed 0) of one component's UTF-8 bytes."""
    data = component.encode("utf-8") if isinstance(component, str) else component
    return xxhash.xxh3_64_intdigest(data)


def signature_of_digests(digests: Sequence[int]) -> int:
    """Reduce an ordered list of component digests to one signature."""
    packed = struct.pack(f"<{len(digests)}Q", *digests)
    return xxhash.xxh3_64_intdigest(packed)


def shape_signature(components: Iterable[str | bytes]) -> int:
    """The signature of an ordered list of cacheable components."""
    return signature_of_digests([component_digest(c) for c in components])


def blocks_signature(block_ids: Iterable[int]) -> int:
    """Signature of a trace's leading prefix-block ids (Mooncake ``hash_ids``).

    Each block id is one component, written as its decimal string, so a producer holding the same
    ids computes the same signature with nothing but the rule above.
    """
    return shape_signature(str(int(b)) for b in block_ids)


def to_signed(signature: int) -> int:
    """The signed 64-bit integer with the same bits (for Avro ``long``)."""
    if not 0 <= signature <= _U64:
        raise ValueError(f"signature {signature} is not an unsigned 64-bit integer")
    return signature - (1 << 64) if signature >= 1 << 63 else signature


def to_unsigned(value: int) -> int:
    """The unsigned 64-bit signature from its signed wire form."""
    if not -(1 << 63) <= value < 1 << 63:
        raise ValueError(f"value {value} is not a signed 64-bit integer")
    return value & _U64
