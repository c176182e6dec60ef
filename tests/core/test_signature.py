"""Shape signatures against the published test vectors (schemas/signature-test-vectors.json).

The vectors are what a producer in another language checks its implementation against, so this
test recomputes every one of them with processor.core.signature, and, where Debian's ``xxhsum`` is
installed (``apt-get install xxhash``), with that independent XXH3 implementation too.

Regenerate the file (only when deliberately changing or adding vectors):

    .venv/bin/python tests/core/test_signature.py --write
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]  # not tests.common: this file also runs as a script
VECTORS = ROOT / "schemas" / "signature-test-vectors.json"

if __name__ == "__main__":  # run as a script: make the repo importable without an install
    sys.path.insert(0, str(ROOT))

from processor.core.signature import (  # noqa: E402
    blocks_signature,
    component_digest,
    shape_signature,
    signature_of_digests,
    to_signed,
    to_unsigned,
)

U64 = (1 << 64) - 1


def _vectors() -> list[dict[str, Any]]:
    return json.loads(VECTORS.read_text(encoding="utf-8"))["vectors"]


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


# (When the file is missing, as before its first --write, test_vectors_cover_the_promised_cases fails.)
_PARAMS = _vectors() if VECTORS.exists() else []


@pytest.mark.parametrize("vector", _PARAMS, ids=_ids(_PARAMS))
def test_vector_matches_the_implementation(vector: dict[str, Any]) -> None:
    components = vector["components"]
    digests = [component_digest(c) for c in components]
    assert [len(c.encode("utf-8")) for c in components] == vector["component_utf8_lengths"]
    assert [f"{d:016x}" for d in digests] == vector["component_digests_hex"]
    packed = struct.pack(f"<{len(digests)}Q", *digests)
    assert packed.hex() == vector["digest_bytes_hex"]
    signature = shape_signature(components)
    assert signature == signature_of_digests(digests) == vector["signature"]
    assert f"{signature:016x}" == vector["signature_hex"]
    assert to_signed(signature) == vector["signature_signed"]
    assert to_unsigned(vector["signature_signed"]) == signature


def test_block_vector_follows_the_decimal_string_rule() -> None:
    vector = next(v for v in _vectors() if "block_ids" in v)
    assert vector["components"] == [str(b) for b in vector["block_ids"]]
    assert blocks_signature(vector["block_ids"]) == vector["signature"]


def test_vectors_cover_the_promised_cases() -> None:
    vectors = _vectors()
    assert 8 <= len(vectors) <= 12
    all_components = [c for v in vectors for c in v["components"]]
    assert any(v["components"] == [] for v in vectors)
    assert "" in all_components
    assert any(not c.isascii() for c in all_components)
    assert max(len(c.encode()) for c in all_components) > 240  # XXH3's long-input path
    assert len(set(_ids(vectors))) == len(vectors)
    assert len({v["signature"] for v in vectors}) == len(vectors)


def test_bytes_component_is_taken_as_is() -> None:
    assert component_digest("héllo") == component_digest("héllo".encode())


@pytest.mark.parametrize(
    ("unsigned", "signed"),
    [(0, 0), (1, 1), ((1 << 63) - 1, (1 << 63) - 1), (1 << 63, -(1 << 63)), (U64, -1)],
)
def test_signed_forms(unsigned: int, signed: int) -> None:
    assert to_signed(unsigned) == signed
    assert to_unsigned(signed) == unsigned


@given(st.integers(0, U64))
def test_to_signed_round_trips(signature: int) -> None:
    signed = to_signed(signature)
    assert -(1 << 63) <= signed < (1 << 63)
    assert to_unsigned(signed) == signature
    assert struct.pack("<q", signed) == struct.pack("<Q", signature)  # same bits


@given(st.integers(-(1 << 63), (1 << 63) - 1))
def test_to_unsigned_round_trips(value: int) -> None:
    assert to_signed(to_unsigned(value)) == value


@pytest.mark.parametrize("bad", [-1, 1 << 64])
def test_to_signed_refuses_non_u64(bad: int) -> None:
    with pytest.raises(ValueError):
        to_signed(bad)


@pytest.mark.parametrize("bad", [1 << 63, -(1 << 63) - 1])
def test_to_unsigned_refuses_non_i64(bad: int) -> None:
    with pytest.raises(ValueError):
        to_unsigned(bad)


@pytest.mark.skipif(shutil.which("xxhsum") is None, reason="xxhsum not installed (apt-get install xxhash)")
def test_vectors_agree_with_xxhsum(tmp_path: Path) -> None:
    """An independent XXH3-64 (the reference C implementation's CLI) gives the same digests."""
    for vector in _vectors():
        files = []
        for i, component in enumerate(vector["components"]):
            path = tmp_path / f"{vector['name']}-{i}.bin"
            path.write_bytes(component.encode("utf-8"))
            files.append(path)
        packed = tmp_path / f"{vector['name']}-digests.bin"
        packed.write_bytes(bytes.fromhex(vector["digest_bytes_hex"]))
        files.append(packed)
        expected = [*vector["component_digests_hex"], vector["signature_hex"]]
        assert _xxhsum(files) == expected, vector["name"]


def _xxhsum(files: list[Path]) -> list[str]:
    out = subprocess.run(
        ["xxhsum", "-H3", *map(str, files)], check=True, capture_output=True, text=True
    ).stdout
    found = dict(re.findall(r"^XXH3 \((.*)\) = ([0-9a-f]{16})$", out, re.MULTILINE))
    return [found[str(f)] for f in files]


# ------------------------------------------------------------------------------------------------
# generator (python tests/core/test_signature.py --write)

_LONG = "".join(f"{i:04d} " for i in range(300))  # 1500 bytes: XXH3's >240-byte path
_MID = "Answer in JSON with keys 'answer' and 'confidence'. " * 4  # 208 bytes: the 129-240 path

_CASES: list[tuple[str, str, list[str] | list[int]]] = [
    ("empty-list", "No components: the signature of the empty string.", []),
    ("one-empty-string", "A single empty component.", [""]),
    ("two-empty-strings", "Two empty components: differs from one.", ["", ""]),
    ("system-prompt", "One ordinary ASCII component.", ["You are a helpful assistant."]),
    (
        "system-and-tools",
        "Two components in order.",
        ["You are a helpful assistant.", "tools: search, calculator"],
    ),
    (
        "order-matters",
        "The same two components reversed: a different signature.",
        ["tools: search, calculator", "You are a helpful assistant."],
    ),
    (
        "non-ascii",
        "Components are hashed as UTF-8 (no normalisation).",
        ["Système : réponds en français.", "日本語のシステムプロンプト", "🚀 emoji"],
    ),
    (
        "short-lengths",
        "Components of 1, 3, 8 and 16 bytes (XXH3's short-input paths).",
        ["a", "abc", "abcdefgh", "0123456789abcdef"],
    ),
    ("long-strings", "A 208-byte and a 1500-byte component.", [_MID, _LONG]),
    (
        "mooncake-blocks",
        "blocks_signature(range(40)): each block id as its decimal string; 320 digest bytes.",
        list(range(40)),
    ),
]


def _make_vector(name: str, note: str, spec: list[str] | list[int]) -> dict[str, Any]:
    vector: dict[str, Any] = {"name": name, "note": note}
    if spec and isinstance(spec[0], int):
        vector["block_ids"] = spec
    components = [str(c) for c in spec]
    digests = [component_digest(c) for c in components]
    signature = shape_signature(components)
    vector |= {
        "components": components,
        "component_utf8_lengths": [len(c.encode("utf-8")) for c in components],
        "component_digests_hex": [f"{d:016x}" for d in digests],
        "digest_bytes_hex": struct.pack(f"<{len(digests)}Q", *digests).hex(),
        "signature": signature,
        "signature_hex": f"{signature:016x}",
        "signature_signed": to_signed(signature),
    }
    return vector


def _write() -> None:
    document = {
        "description": (
            "Shape signature test vectors for tokenfabric (see docs/signatures.md). "
            "component_digests_hex: XXH3-64 (seed 0) of each component's UTF-8 bytes, as 16 hex "
            "digits (the number, most significant first, as xxhsum -H3 prints it). digest_bytes_hex: "
            "those digests written one after another as 8 bytes little-endian; signature: XXH3-64 "
            "(seed 0) of those bytes, as an unsigned decimal, as 16 hex digits, and as the signed "
            "64-bit integer with the same bits (the Avro long on the wire)."
        ),
        "vectors": [_make_vector(*case) for case in _CASES],
    }
    VECTORS.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(_CASES)} vectors to {VECTORS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    _write()
