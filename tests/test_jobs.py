"""Jobs without Kafka: templates, rows, tokenising, the job record, the journal, collecting, submitting.

The Kafka-facing parts are driven with stand-ins (a producer and a job writer that record what they
are given; completions offered to a collector by hand), so every rule of submit and collect is
checked here in milliseconds. tests/test_jobs_kafka.py runs the same commands on a real broker.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from processor.cli.submit import Aborted, SubmitPlan, submit
from processor.cli.tokenfabric import main
from processor.core.signature import shape_signature
from processor.jobs.codec import decode_job, encode_job
from processor.jobs.collect import JobCollector, journal_path
from processor.jobs.datasets import Dataset, DatasetError, file_sha256, read_output, write_output
from processor.jobs.journal import Journal, JournalError
from processor.jobs.model import (
    BadRow,
    JobRecord,
    RowResult,
    check_job_name,
    item_id,
    row_of,
    summarize,
)
from processor.jobs.templates import RowError, TemplateError, load_template, parse_template
from processor.jobs.textprep import TextTokenizer, TokenizerError
from processor.wire.completions import encode_completion
from processor.wire.errors import DecodeError
from processor.wire.records import CompletionRecord, ids_from_tokens

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "jobs"


def template(*parts: dict[str, Any], **top: Any) -> Any:
    return parse_template({"parts": list(parts), **top}, "t")


SYSTEM = {"name": "system", "text": "Be brief.\n", "cacheable": True}
TOOLS = {"name": "tools", "text": '{"type": "object", "properties": {}}\n', "cacheable": True}
QUESTION = {"name": "q", "text": "Q: {question}\nA:"}


# ------------------------------------------------------------------------------------------------
# templates


def test_the_shape_is_the_signature_of_the_cacheable_parts_in_order() -> None:
    t = template(SYSTEM, TOOLS, QUESTION)
    assert t.shape == shape_signature([SYSTEM["text"], TOOLS["text"]])
    assert t.columns == ("question",)
    assert t.render({"question": "why?"}) == 'Be brief.\n{"type": "object", "properties": {}}\nQ: why?\nA:'
    assert template(TOOLS, SYSTEM, QUESTION).shape != t.shape


def test_the_example_template_reads_the_same_as_toml_and_json(tmp_path: Path) -> None:
    toml = load_template(EXAMPLES / "sentiment.toml")
    as_json = tmp_path / "sentiment.json"
    as_json.write_text(
        json.dumps(
            {
                "model": toml.model,
                "output_budget": toml.output_budget,
                "parts": [{"name": p.name, "text": p.text, "cacheable": p.cacheable} for p in toml.parts],
            }
        )
    )
    again = load_template(as_json)
    assert (again.shape, again.columns, again.model, again.output_budget) == (
        toml.shape,
        toml.columns,
        "default",
        8,
    )
    assert again.render({"review": "ok"}) == toml.render({"review": "ok"})


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([QUESTION, SYSTEM], "is cacheable but follows non-cacheable part 'q'"),
        ([{"name": "s", "text": "Hi {name}", "cacheable": True}], "contains {name}"),
        ([{"name": "q", "text": "{n:>5}"}], "format specs and conversions are not supported"),
        ([{"name": "q", "text": "{}"}], "empty placeholder"),
        ([{"name": "q", "text": "a { b"}], "literal braces"),
        ([{"name": "q", "text": "x", "cachable": True}], "unknown key(s) cachable"),
        ([QUESTION, QUESTION], "two parts are named 'q'"),
        ([{"name": "q", "text": "x", "cacheable": "yes"}], "'cacheable' must be true or false"),
        ([], "non-empty list"),
    ],
)
def test_template_mistakes_are_refused_with_the_part_named(parts: list[Any], message: str) -> None:
    with pytest.raises(TemplateError, match=None) as exc:
        parse_template({"parts": parts}, "t.toml")
    assert message in str(exc.value)
    assert str(exc.value).startswith("template t.toml")


def test_template_files_need_a_known_suffix_and_valid_syntax(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("parts: []")
    (tmp_path / "t.toml").write_text("[[parts]\n")
    with pytest.raises(TemplateError, match=r"name it \.toml or \.json"):
        load_template(tmp_path / "t.yaml")
    with pytest.raises(TemplateError, match="not valid TOML"):
        load_template(tmp_path / "t.toml")
    with pytest.raises(TemplateError, match="No such file"):
        load_template(tmp_path / "missing.toml")


def test_rendering_refuses_missing_and_null_columns_and_writes_other_values_plainly() -> None:
    t = template(SYSTEM, {"name": "q", "text": "{a}|{b}|{c}|{{literal}}"})
    assert (
        t.render({"a": 3, "b": 1.5, "c": {"k": [True, None]}})
        == 'Be brief.\n3|1.5|{"k": [true, null]}|{literal}'
    )
    with pytest.raises(RowError, match="missing column 'b'"):
        t.render({"a": 1, "c": 2})
    with pytest.raises(RowError, match="column 'a' is null"):
        t.render({"a": None, "b": 1, "c": 2})


def test_item_ids_carry_the_row_and_only_this_jobs_ids_parse() -> None:
    assert item_id("job-1", 42) == "job-1:42"
    assert row_of("job-1", "job-1:42") == 42
    for foreign in ("job-12:42", "job-1:", "job-1:x", "job-1:007", "job-1:4 2", "other:1", "job-1:٣"):
        assert row_of("job-1", foreign) is None, foreign
    assert check_job_name("a.b_c-1") == "a.b_c-1"
    for bad in ("", "a:b", "a b", "x" * 101, "é"):
        with pytest.raises(ValueError, match="job name"):
            check_job_name(bad)


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


# ------------------------------------------------------------------------------------------------
# tokenising


def test_the_default_tokenizer_neither_truncates_nor_pads() -> None:
    tok = TextTokenizer()
    long_text, short_text = "word " * 300, "hi"
    long_ids, short_ids = (e.ids for e in tok.encode_many([long_text, short_text]))
    assert len(long_ids) > 300  # the file asks for truncation at 128 and padding to 128
    assert len(short_ids) == 3  # [CLS] hi [SEP]: the tokenizer's own special tokens, no padding


def test_a_prompt_the_tokenizer_refuses_is_reported_alone() -> None:
    results = TextTokenizer().encode_many(["fine", "bad \ud800 surrogate", "also fine"])
    assert results[0].ids and results[2].ids
    assert results[1].error is not None and "tokenizer refused" in results[1].error


def test_a_missing_tokenizer_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="no such file"):
        TextTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="not a tokenizers JSON file"):
        TextTokenizer(tmp_path)


# ------------------------------------------------------------------------------------------------
# the job record


def job_record(dataset: Path, **changes: Any) -> JobRecord:
    fields: dict[str, Any] = {
        "name": "job-1",
        "state": "submitted",
        "dataset": str(dataset),
        "dataset_sha256": file_sha256(dataset),
        "template": "t.toml",
        "shape": (1 << 64) - 5,
        "model": "default",
        "tokenizer": "tokenizer.json",
        "rows": 4,
        "items": 3,
        "input_tokens": 30,
        "bad_rows": (BadRow(2, "missing column 'review'"),),
        "started_ms": 1_700_000_000_000,
        "submitted_ms": 1_700_000_001_000,
    }
    fields.update(changes)
    return JobRecord(**fields)


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


def test_progress_marks_a_job_finished_once_every_item_has_a_result(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    rec = job_record(data)
    assert rec.with_progress(2, 0, 10, 5).state == "submitted"
    done = rec.with_progress(2, 1, 10, 7)
    assert (done.state, done.finished_ms, done.progress_ms) == ("finished", 7, 7)
    aborted = job_record(data, state="aborted", submitted_ms=None, error="interrupted")
    assert aborted.with_progress(3, 0, 0, 9).state == "aborted"  # keeps its state, gets finished_ms
    assert aborted.with_progress(3, 0, 0, 9).finished_ms == 9


def test_padding_waste_is_one_minus_prompt_over_padded_tokens_of_batched_rows(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    results = [
        RowResult(row=0, status="ok", input_tokens=6, output_tokens=4, padded_tokens=8),
        RowResult(row=1, status="failed", input_tokens=8, padded_tokens=8),
        RowResult(row=3, status="rejected", input_tokens=100, padded_tokens=0),  # never batched
    ]
    s = summarize(job_record(data), results)
    assert (s.ok, s.failed, s.invalid, s.missing, s.complete) == (1, 2, 1, 0, True)
    assert (s.input_tokens, s.output_tokens, s.padded_tokens) == (114, 4, 16)
    assert s.padding_waste == pytest.approx(1 - 14 / 16)
    assert "padding waste 12.50%" in "\n".join(s.lines())


# ------------------------------------------------------------------------------------------------
# journal and collecting


def test_the_journal_keeps_one_result_per_row_and_survives_a_torn_line(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("{}\n")
    job, path = job_record(data), tmp_path / "out.jsonl.journal"
    with Journal.open(path, job) as j:
        assert j.add([RowResult(row=1, status="ok"), RowResult(row=1, status="failed")], {0: 5}) == 1
        assert j.add([RowResult(row=1, status="ok"), RowResult(row=0, status="ok")], {0: 9, 1: 2}) == 1
        with pytest.raises(JournalError, match="in use"):
            Journal.open(path, job)
    path.write_bytes(path.read_bytes() + b'{"row": 3, "stat')
    with Journal.open(path, job) as j:
        assert sorted(j.results) == [0, 1] and j.results[1].status == "ok"
        assert j.checkpoint == {0: 9, 1: 2}
    assert path.read_bytes().endswith(b"}\n")
    with pytest.raises(JournalError, match="belongs to job 'job-1' started at 1700000000000"):
        Journal.open(path, job_record(data, started_ms=1))


def completion(item: str, status: str = "ok", **changes: Any) -> bytes:
    fields: dict[str, Any] = {
        "item_id": item,
        "job_id": "job-1",
        "batch_id": "b1",
        "consumer": "card",
        "model": "default",
        "status": status,
        "reason": None if status == "ok" else "engine fell over",
        "input_tokens": 10,
        "output_tokens": 4 if status == "ok" else 0,
        "padded_tokens": 16,
        "output": b"out:" + item.encode() if status == "ok" else b"",
        "completed_ms": 123,
    }
    fields.update(changes)
    return encode_completion(CompletionRecord(**fields))


def test_a_collector_joins_first_results_to_rows_and_resumes_from_its_journal(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(4)))
    job = job_record(data)
    out = tmp_path / "out.jsonl"
    c = JobCollector.open(job, out)
    c.starts = {0: 0, 1: 0}
    c.offer(0, 0, "job-1:0", completion("job-1:0"))
    c.offer(0, 1, "job-1:0", completion("job-1:0", "failed"))  # a duplicate: the first one wins
    c.offer(1, 0, "job-1:2", completion("job-1:2"))  # the bad row: not an item of this job
    c.offer(1, 1, "job-1:9", completion("job-1:9"))  # past the last row
    c.offer(1, 2, "job-1:3", b"garbage")
    assert c.commit({0: 2, 1: 3}) == 1
    assert (c.stray, c.undecodable, c.complete) == (2, 1, False)
    c.materialize()
    assert [(r["row"], r["status"]) for r in read_output(out)] == [(0, "ok"), (2, "invalid")]
    c.close()

    again = JobCollector.open(job, out)  # a restart: rows and offsets come back from the journal
    assert again.journal.checkpoint == {0: 2, 1: 3} and sorted(again.journal.results) == [0]
    again.starts = dict(again.journal.checkpoint)
    again.offer(0, 1, "job-1:0", completion("job-1:0", "failed"))  # below the checkpoint: ignored
    again.offer(0, 2, "job-1:1", completion("job-1:1", "failed"))
    again.offer(1, 3, "job-1:3", completion("job-1:3", output=b"\xff\xfe"))
    again.commit({0: 3, 1: 4})
    assert again.complete
    again.materialize()
    rows = read_output(out)
    assert [(r["row"], r["status"], r["input"]) for r in rows] == [
        (0, "ok", {"n": 0}),
        (1, "failed", {"n": 1}),
        (2, "invalid", {"n": 2}),
        (3, "ok", {"n": 3}),
    ]
    assert rows[0]["output"] == "out:job-1:0" and rows[1]["reason"] == "engine fell over"
    assert (rows[3]["output"], rows[3]["output_base64"]) == (None, "//4=")
    s = again.summary()
    assert (s.ok, s.failed, s.invalid, s.missing) == (2, 1, 1, 0)
    again.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "out.jsonl", "out.jsonl.journal"]


def test_collect_refuses_a_dataset_that_changed_since_submit(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"n": 0}\n')
    job = job_record(data)
    data.write_text('{"n": 1}\n')
    with pytest.raises(DatasetError, match="changed since job job-1 was submitted"):
        JobCollector.open(job, tmp_path / "out.jsonl")
    assert not journal_path(tmp_path / "out.jsonl").exists()


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


# ------------------------------------------------------------------------------------------------
# submitting


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, item_id: str, model: str, tokens: bytes, **kw: Any) -> int:
        self.sent.append({"item_id": item_id, "model": model, "tokens": tokens, **kw})
        return int(kw["shape"])

    def close(self, timeout: float = 0) -> None:
        pass

    def flush(self, timeout: float = 0) -> int:
        return 0


class FakeWriter:
    def __init__(self) -> None:
        self.records: list[JobRecord] = []

    def write(self, rec: JobRecord) -> None:
        self.records.append(rec)


def plan(tmp_path: Path, lines: list[str], max_bad_rows: int = 100) -> SubmitPlan:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    return SubmitPlan(
        "job-1",
        template(SYSTEM, QUESTION),
        Dataset(data),
        TextTokenizer(),
        "m",
        16,
        max_bad_rows,
    )


def test_submit_produces_good_rows_reports_bad_ones_and_records_the_job(tmp_path: Path) -> None:
    p = plan(
        tmp_path, ['{"question": "a"}', '{"q": 1}', "oops", '{"question": "\\ud800"}', '{"question": 7}']
    )
    producer, writer, reported = FakeProducer(), FakeWriter(), []
    final = submit(p, producer, writer, on_bad=reported.append)  # type: ignore[arg-type]
    assert [s["item_id"] for s in producer.sent] == ["job-1:0", "job-1:4"]
    assert {(s["model"], s["shape"], s["job_id"], s["output_budget"]) for s in producer.sent} == {
        ("m", p.template.shape, "job-1", 16)
    }
    ids = ids_from_tokens(producer.sent[0]["tokens"])
    assert list(ids) == list(p.tokenizer.encode_many([p.template.render({"question": "a"})])[0].ids)
    assert [r.state for r in writer.records] == ["submitting", "submitted"]
    assert [b.row for b in reported] == [1, 2, 3] and [b.row for b in final.bad_rows] == [1, 2, 3]
    assert final.bad_rows[0].reason == "missing column 'question'"
    assert (final.rows, final.items, final.input_tokens) == (
        5,
        2,
        len(ids) + len(producer.sent[1]["tokens"]) // 4,
    )
    assert final.dataset_sha256 == file_sha256(p.dataset.path) and final.submitted_ms is not None


def test_submit_aborts_past_max_bad_rows_and_records_why(tmp_path: Path) -> None:
    p = plan(tmp_path, ['{"x": 1}'] * 3 + ['{"question": "a"}'], max_bad_rows=2)
    writer = FakeWriter()
    with pytest.raises(Aborted, match="more than 2 bad rows"):
        submit(p, FakeProducer(), writer)  # type: ignore[arg-type]
    last = writer.records[-1]
    assert (last.state, last.submitted_ms, len(last.bad_rows)) == ("aborted", None, 3)
    assert last.error is not None and "--max-bad-rows" in last.error


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "d.jsonl", "--job", "a:b", "--template", "t.toml"], "job name 'a:b'"),
        (
            ["submit", "d.jsonl", "--job", "j", "--template", "t.toml", "--max-bad-rows", "5000"],
            "--max-bad-rows",
        ),
        (["submit", "CSV", "--job", "j", "--template", "TOML"], "uses column(s) 'question' that"),
        (["collect", "--job", "j", "--out", "out.txt"], "name it .jsonl or .parquet"),
        (
            ["collect", "--job", "j", "--out", "o.jsonl", "--wait", "--timeout-s", "0"],
            "--timeout-s must be > 0",
        ),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_path, toml_path = tmp_path / "d.csv", tmp_path / "t.toml"
    csv_path.write_text("id,text\n1,x\n")
    toml_path.write_text('[[parts]]\nname = "q"\ntext = "{question}"\n')
    argv = [str(csv_path) if a == "CSV" else str(toml_path) if a == "TOML" else a for a in argv]
    assert main([*argv, "--bootstrap", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
