"""Trace reading (processor/sim/traces.py, processor/sim/traceformats.py): the shipped real traces and
every error path."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.signature import blocks_signature, shape_signature
from processor.sim import traceformats
from processor.sim.traceformats import _iter_jsonl
from processor.sim.traces import (
    SHIPPED,
    TraceError,
    TraceRecord,
    iter_trace,
    read_shipped,
    read_trace,
    shipped_trace,
    trace_stats,
)

# name -> (rows, total input tokens, total output tokens, span_ms), computed once from the files and
# matching data/traces/README.md (61.2 M, 144.8 M, 18.1 M, 22.4 M input tokens).
EXPECTED = {
    "mooncake_synthetic": (3_993, 61_194_628, 595_432, 1_022_025),
    "mooncake_conversation": (12_031, 144_793_823, 4_122_048, 3_536_999),
    "azure_code": (8_819, 18_059_974, 245_896, 3_435_948),
    "azure_conv": (19_366, 22_361_870, 4_088_665, 3_501_721),
}

SHA256 = {
    "mooncake_synthetic": "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
    "mooncake_conversation": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    "azure_code": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    "azure_conv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
}


@pytest.fixture(scope="module")
def shipped() -> dict[str, list[TraceRecord]]:
    return {name: read_shipped(name) for name in SHIPPED}


# ------------------------------------------------------------------------------------ shipped traces


@pytest.mark.parametrize("name", sorted(SHA256))  # the upstream files; templated: tests/sim/test_templated.py
def test_shipped_copy_is_the_unmodified_upstream_file(name: str) -> None:
    path = shipped_trace(name)
    assert path.name == SHIPPED[name][0]
    assert hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() == SHA256[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_counts_and_token_totals(name: str, shipped: dict[str, list[TraceRecord]]) -> None:
    records = shipped[name]
    rows, tokens, out_tokens, span = EXPECTED[name]
    stats = trace_stats(records)
    assert stats["items"] == len(records) == rows
    assert stats["tokens"] == sum(r.length for r in records) == tokens
    assert sum(r.output_length or 0 for r in records) == out_tokens
    assert stats["span_ms"] == span
    assert records[0].t_ms == 0
    assert all(a.t_ms <= b.t_ms for a, b in itertools.pairwise(records))
    assert [r.id for r in records] == [str(i) for i in range(rows)]  # files are already sorted
    assert all(r.length > 0 and r.output_length is not None and r.model == "default" for r in records)


def test_stats_match_readme(shipped: dict[str, list[TraceRecord]]) -> None:
    syn = trace_stats(shipped["mooncake_synthetic"])
    assert (syn["min_length"], syn["median_length"], syn["max_length"]) == (13, 11_587, 191_378)
    assert round(syn["p99_length"] or 0) == 66_456
    assert syn["shapes"] == 2_211  # distinct first blocks
    conv = trace_stats(shipped["mooncake_conversation"])
    assert conv["shapes"] == 1  # every request starts with block 0
    assert trace_stats(read_shipped("mooncake_conversation", shape_blocks=2))["shapes"] == 7_373
    code = trace_stats(shipped["azure_code"])
    assert (code["min_length"], code["median_length"], code["p99_length"], code["max_length"]) == (
        3, 1_469, 7_436, 7_437,
    )  # fmt: skip


def test_mooncake_shape_is_blocks_signature_of_leading_ids(shipped: dict[str, list[TraceRecord]]) -> None:
    path = shipped_trace("mooncake_synthetic")
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    records = shipped["mooncake_synthetic"]
    for rec in records[:50]:
        assert rec.shape == blocks_signature([rows[int(rec.id)]["hash_ids"][0]])
    assert records[0].shape == blocks_signature([0])
    two = read_trace(path, "mooncake", shape_blocks=2, limit=20)
    assert [r.shape for r in two] == [blocks_signature(rows[int(r.id)]["hash_ids"][:2]) for r in two]
    assert len({r.shape for r in read_trace(path, "mooncake", shape_blocks=0)}) == 1


def test_azure_one_shape_per_model_and_ms_times() -> None:
    records = read_shipped("azure_code", default_model="llama", limit=3)
    assert {r.shape for r in records} == {shape_signature(["azure:llama"])}
    # 18:17:03.9799600, 18:17:04.0319600, 18:17:04.0599600 (floored to ms from the first row)
    assert [(r.t_ms, r.length, r.output_length, r.id, r.line) for r in records][:2] == [
        (0, 4808, 10, "0", 2),
        (52, 3180, 8, "1", 3),
    ]


def test_gz_and_plain_give_the_same_records(tmp_path: Path) -> None:
    for name in ("mooncake_synthetic", "azure_code"):
        gz = shipped_trace(name)
        plain = tmp_path / SHIPPED[name][0].removesuffix(".gz")
        plain.write_bytes(gzip.decompress(gz.read_bytes()))
        fmt = SHIPPED[name][1]
        assert read_trace(plain, fmt) == read_trace(gz, fmt)
    # detection is by content, not by name
    odd = tmp_path / "compressed.jsonl"
    odd.write_bytes(gzip.compress(b'{"t_ms": 1, "model": "m", "shape": 7, "length": 3}\n'))
    assert read_trace(odd, "jsonl") == [TraceRecord(1, "m", 7, 3, "0", None, 1)]


def test_shipped_trace_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / SHIPPED["azure_conv"][0]
    shutil.copyfile(shipped_trace("azure_conv"), copy)
    monkeypatch.setenv("TOKENFABRIC_TRACES", str(tmp_path))
    assert shipped_trace("azure_conv") == copy
    assert shipped_trace("azure_code").parent.name == "traces"  # falls back to the repo copy
    with pytest.raises(TraceError, match="unknown shipped trace 'nope'"):
        shipped_trace("nope")


# -------------------------------------------------------------------------------------- native jsonl


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_shape_components_ids_and_unknown_keys(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.jsonl", [
        '{"t_ms": 5, "model": "m", "components": ["sys", "tools"], "length": 10, "extra": [1]}',
        "",
        '{"t_ms": 7, "model": "m", "shape": 18446744073709551615, "length": 1, "id": "x", '
        '"output_length": 0}',
    ])  # fmt: skip
    assert read_trace(path, "jsonl") == [
        TraceRecord(5, "m", shape_signature(["sys", "tools"]), 10, "0", None, 1),
        TraceRecord(7, "m", (1 << 64) - 1, 1, "x", 0, 3),
    ]


def test_read_trace_sorts_stably_and_iter_keeps_file_order(tmp_path: Path) -> None:
    path = _write(tmp_path, "u.jsonl", [
        json.dumps({"t_ms": t, "model": "m", "shape": 1, "length": 1, "id": i}) for t, i in
        [(5, "a"), (1, "b"), (5, "c"), (1, "d")]
    ])  # fmt: skip
    assert [r.id for r in read_trace(path, "jsonl")] == ["b", "d", "a", "c"]
    assert [r.id for r in iter_trace(path, "jsonl")] == ["a", "b", "c", "d"]
    assert [r.id for r in read_trace(path, "jsonl", limit=2)] == ["b", "a"]


GOOD = {"t_ms": 0, "model": "m", "shape": 1, "length": 5}

JSONL_ERRORS = [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({**GOOD, "length": -3}), '"length" must be a positive integer, got -3'),
    (json.dumps({**GOOD, "length": 0}), '"length" must be a positive integer'),
    (json.dumps({**GOOD, "length": 2.5}), '"length" must be a positive integer, got 2.5'),
    (json.dumps({**GOOD, "length": True}), '"length" must be a positive integer, got True'),
    (json.dumps({**GOOD, "t_ms": "3"}), '"t_ms" must be an integer'),
    (json.dumps({k: v for k, v in GOOD.items() if k != "length"}), 'missing field "length"'),
    (json.dumps({**GOOD, "shape": 1 << 64}), '"shape" must be an unsigned 64-bit integer'),
    (json.dumps({**GOOD, "shape": -1}), '"shape" must be an unsigned 64-bit integer'),
    (json.dumps({**GOOD, "components": ["a"]}), 'exactly one of "shape" or "components"'),
    (json.dumps({k: v for k, v in GOOD.items() if k != "shape"}), 'exactly one of "shape" or "components"'),
    (json.dumps({**{k: v for k, v in GOOD.items() if k != "shape"}, "components": [1]}), '"components"'),
    (json.dumps({**GOOD, "model": ""}), '"model" must be a non-empty string'),
    (json.dumps({**GOOD, "id": 4}), '"id" must be a string'),
    (json.dumps({**GOOD, "output_length": -1}), '"output_length" must be a non-negative integer'),
]


@pytest.mark.parametrize(("bad", "message"), JSONL_ERRORS)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, bad: str, message: str) -> None:
    path = _write(tmp_path, "trace.jsonl", [json.dumps(GOOD), "", bad])
    with pytest.raises(TraceError) as info:
        read_trace(path, "jsonl")
    text = str(info.value)
    assert text.startswith(f"{path}:3: ") and message in text and "\n" not in text


MOONCAKE_GOOD = {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [4, 5]}

MOONCAKE_ERRORS = [
    (json.dumps({**MOONCAKE_GOOD, "input_length": -3}), '"input_length" must be a positive integer, got -3'),
    (json.dumps({**MOONCAKE_GOOD, "timestamp": 1.5}), '"timestamp" must be an integer'),
    (json.dumps({**MOONCAKE_GOOD, "hash_ids": ["a"]}), '"hash_ids" must hold non-negative integers'),
    (json.dumps({**MOONCAKE_GOOD, "hash_ids": 3}), '"hash_ids" must be a list'),
    (json.dumps({k: v for k, v in MOONCAKE_GOOD.items() if k != "hash_ids"}), 'missing field "hash_ids"'),
    ('{"timestamp": 0,', "malformed JSON"),
]


@pytest.mark.parametrize(("bad", "message"), MOONCAKE_ERRORS)
def test_mooncake_errors_name_file_and_line(tmp_path: Path, bad: str, message: str) -> None:
    path = _write(tmp_path, "moon.jsonl", [json.dumps(MOONCAKE_GOOD), bad])
    with pytest.raises(TraceError, match=r"moon\.jsonl:2: ") as info:
        read_trace(path, "mooncake")
    assert message in str(info.value)


AZURE_ERRORS = [
    ("2023-11-16 18:17:04.0319600,-3,8", '"ContextTokens" must be a positive integer'),
    ("2023-11-16 18:17:04.0319600,0,8", '"ContextTokens" must be a positive integer'),
    ("2023-11-16 18:17:04.0319600,3.5,8", '"ContextTokens" must be a positive integer'),
    ("2023-11-16 18:17:04.0319600,3,x", '"GeneratedTokens" must be a non-negative integer'),
    ("2023-11-16 25:17:04.0319600,3,8", '"TIMESTAMP" must look like'),
    ("2023-02-30 18:17:04.0319600,3,8", '"TIMESTAMP" must look like'),
    ("yesterday,3,8", '"TIMESTAMP" must look like'),
    ("2023-11-16 18:17:04.0319600,3", "expected 3 columns, got 2"),
]


@pytest.mark.parametrize(("bad", "message"), AZURE_ERRORS)
def test_azure_errors_name_file_and_line(tmp_path: Path, bad: str, message: str) -> None:
    path = tmp_path / "az.csv"
    path.write_text(
        f"TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n{bad}"
    )
    with pytest.raises(TraceError, match=r"az\.csv:3: ") as info:
        read_trace(path, "azure")
    assert message in str(info.value)


def test_azure_bad_header_and_midnight(tmp_path: Path) -> None:
    bad = tmp_path / "hdr.csv"
    bad.write_text("time,in,out\n2023-11-16 18:17:03.9799600,4808,10\n")
    with pytest.raises(TraceError, match=r"hdr\.csv:1: header must name TIMESTAMP"):
        read_trace(bad, "azure")
    ok = tmp_path / "night.csv"
    ok.write_text(
        "GeneratedTokens,TIMESTAMP,ContextTokens\n1,2023-12-31 23:59:59.9995,7\n2,2024-01-01 00:00:01,8\n"
    )
    assert [(r.t_ms, r.length, r.output_length) for r in read_trace(ok, "azure")] == [(0, 7, 1), (1000, 8, 2)]


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"missing\.jsonl: no such file"):
        read_trace(tmp_path / "missing.jsonl", "jsonl")
    with pytest.raises(TraceError, match=r"unknown trace format 'parquet'"):
        read_trace(tmp_path / "x", "parquet")
    trunc = tmp_path / "trunc.jsonl.gz"
    trunc.write_bytes(gzip.compress(b'{"t_ms": 1, "model": "m", "shape": 7, "length": 3}\n' * 50)[:40])
    with pytest.raises(TraceError, match=r"trunc\.jsonl\.gz:\d+: corrupt or truncated gzip"):
        read_trace(trunc, "jsonl")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"t_ms": 1, "model": "m", "shape": 7, "length": 3}\n{"model": "caf\xe9"}\n')
    with pytest.raises(TraceError, match=r"latin\.jsonl:2: not valid UTF-8"):
        read_trace(latin, "jsonl")


def test_trace_stats_empty_and_interpolation() -> None:
    assert trace_stats([])["items"] == 0
    recs = [TraceRecord(t, "m", 1, n, str(t), None, t + 1) for t, n in enumerate([1, 2, 3, 10])]
    stats = trace_stats(recs)
    assert stats["median_length"] == 2.5 and stats["p99_length"] == pytest.approx(9.79)
    assert stats["span_ms"] == 3 and stats["tokens"] == 16


def test_the_native_format_reads_an_optional_adapter_and_refuses_the_separator(tmp_path: Path) -> None:
    path = tmp_path / "adapters.jsonl"
    path.write_text(
        '{"t_ms": 1, "model": "m", "shape": 7, "length": 3, "adapter": "tone"}\n'
        '{"t_ms": 2, "model": "m", "shape": 7, "length": 4}\n'
        '{"t_ms": 3, "model": "m", "shape": 7, "length": 4, "adapter": "tone"}\n'
    )
    assert [r.adapter for r in read_trace(path, "jsonl")] == ["tone", "", "tone"]
    for line, message in [
        ('"model": "m@x", "adapter": ""', r'adapters.jsonl:1: "model" must not contain "@" .*got \'m@x\''),
        ('"model": "m", "adapter": "a@b"', r'adapters.jsonl:1: "adapter" must not contain "@" .*got \'a@b\''),
        ('"model": "m", "adapter": 3', r'adapters.jsonl:1: "adapter" must be a string, got 3'),
    ]:
        path.write_text(f'{{"t_ms": 1, {line}, "shape": 7, "length": 3}}\n')
        with pytest.raises(TraceError, match=message):
            read_trace(path, "jsonl")


def test_the_native_format_reads_an_optional_job(tmp_path: Path) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text(
        '{"t_ms": 1, "model": "m", "shape": 7, "length": 3, "job": "nightly"}\n'
        '{"t_ms": 2, "model": "m", "shape": 7, "length": 4}\n'
    )
    assert [r.job for r in read_trace(path, "jsonl")] == ["nightly", ""]
    path.write_text('{"t_ms": 1, "model": "m", "shape": 7, "length": 3, "job": 5}\n')
    with pytest.raises(TraceError, match=r'jobs.jsonl:1: "job" must be a string, got 5'):
        read_trace(path, "jsonl")


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(1 << 63, (1 << 64) + 1), st.floats(0, 2),
    st.sampled_from(["", "m", "x", "m@x"]), st.lists(st.sampled_from(["a", "b"]), max_size=2), st.just([1]),
)  # fmt: skip
_KEYS = ("t_ms", "model", "shape", "components", "length", "id", "output_length", "adapter", "extra")


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.dictionaries(st.sampled_from(_KEYS), _VALUES), min_size=1, max_size=4))
def test_the_msgspec_reader_and_the_checked_reader_agree_on_every_line(
    tmp_path_factory: pytest.TempPathFactory, rows: list[dict[str, object]]
) -> None:
    """The fast path decodes with msgspec and hands any line it cannot take to the checked path: both
    accept the same lines, give the same records, and refuse with the same one-line message."""
    path = tmp_path_factory.mktemp("agree") / "t.jsonl"
    lines = [json.dumps({"t_ms": 0, "model": "m", "shape": 1, "length": 5}), *map(json.dumps, rows)]
    path.write_text("\n".join(lines) + "\n")

    def outcome(reader: object) -> object:
        try:
            return list(reader)  # type: ignore[call-overload]
        except TraceError as exc:
            return str(exc)

    fast = outcome(iter_trace(path, "jsonl"))
    checked = outcome(_iter_jsonl(iter(lines), str(path)))
    assert fast == checked


_LINES = st.sampled_from(
    [
        '{"t_ms": 1, "model": "m", "shape": 7, "length": 3}',
        '{"t_ms": 2, "model": "m", "shape": 9, "length": 40, "id": "x", "output_length": 5, "job": "j"}',
        '{"t_ms": 3, "model": "m", "components": ["sys", "tools"], "length": 12}',
        "",
        "   ",
        '{"t_ms": 4, "model": "m", "shape": 18446744073709551615, "length": 1}',
    ]
)


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(_LINES, min_size=1, max_size=30),
    chunk=st.integers(1, 200),
    bom=st.booleans(),
    last_newline=st.booleans(),
)
def test_chunked_decoding_gives_the_records_of_the_line_by_line_reader(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], chunk: int, bom: bool, last_newline: bool
) -> None:
    """The fast path decodes ``_CHUNK_BYTES`` of whole lines at a time: wherever the chunks end (a
    line longer than a chunk, blank lines, a BOM, no final newline), the records and their line
    numbers are those of the checked reader, line by line."""
    path = tmp_path_factory.mktemp("chunks") / "t.jsonl"
    text = "\n".join(lines) + ("\n" if last_newline else "")
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    with mock.patch.object(traceformats, "_CHUNK_BYTES", chunk):
        fast = list(iter_trace(path, "jsonl"))
    assert fast == list(_iter_jsonl(iter(text.splitlines()), str(path)))
