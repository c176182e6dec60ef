"""Datasets (processor/jobs/datasets.py): rows numbered in file order from JSONL, CSV and Parquet, and
outputs that keep a Parquet dataset's input types."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from processor.jobs.datasets import Dataset, DatasetError, write_output
from processor.jobs.model import RowResult

# ------------------------------------------------------------------------------------------------
# datasets


def test_jsonl_rows_are_numbered_in_file_order_and_bad_lines_stay_rows(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    lines = [b'{"a": 1}', b"", b"not json", b"[1, 2]", b'{"a": "\xff"}', b'  {"a": 2}  ']
    path.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    rows = list(Dataset(path).rows())
    assert [r.row for r in rows] == [0, 1, 2, 3, 4]
    assert rows[0].values == {"a": 1} and rows[4].values == {"a": 2}
    assert rows[1].error is not None and rows[1].error.startswith("not JSON")
    assert rows[2].error == "a JSON list, not an object"
    assert rows[3].error is not None and rows[3].error.startswith("not UTF-8")


def test_csv_rows_know_their_columns_and_flag_ragged_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(b'\xef\xbb\xbfid,review\nr1,"multi\nline"\n\nr2\nr3,ok,extra\nr4,\xff\n')
    ds = Dataset(path)
    assert ds.columns == ("id", "review")
    rows = list(ds.rows())
    assert [r.row for r in rows] == [0, 1, 2, 3]
    assert rows[0].values == {"id": "r1", "review": "multi\nline"} and rows[0].error is None
    assert rows[1].error == "1 fields, the header has 2"
    assert rows[2].error == "3 fields, the header has 2"
    assert rows[3].error == "column 'review' is not UTF-8"


def test_parquet_rows_keep_their_types(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [1, 2], "review": ["a", None]}), path)
    ds = Dataset(path)
    assert ds.columns == ("id", "review")
    assert [(r.row, r.values) for r in ds.rows()] == [
        (0, {"id": 1, "review": "a"}),
        (1, {"id": 2, "review": None}),
    ]


def test_unknown_or_missing_datasets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown format"):
        Dataset(tmp_path / "d.xlsx")
    with pytest.raises(DatasetError, match="no such file"):
        Dataset(tmp_path / "d.jsonl")


def test_parquet_outputs_keep_a_parquet_datasets_input_types(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [7, 8], "tags": [["a"], []]}), data)
    ds = Dataset(data)
    out = tmp_path / "out.parquet"
    pairs = [(RowResult(row=0, status="ok", output=b"x"), {"id": 7, "tags": ["a"]})]
    assert write_output(out, pairs, ds) == 1
    table = pq.read_table(out)
    assert table.schema.field("input").type == pa.struct(
        [("id", pa.int64()), ("tags", pa.list_(pa.string()))]
    )
    assert table.to_pylist()[0]["input"] == {"id": 7, "tags": ["a"]}
