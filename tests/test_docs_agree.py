"""The docs agree with each other and with the code's own lists (issue 38: a team integrated from
the docs alone and found a stale Job header, a missing field, statuses and dead-letter reasons left
out, and three rules for which completion counts).

Held here: docs/wire-format.md's record sections (each header and field list is the code's), its
dead-letter reasons and docs/consumers.md's (the code's ``DecodeError`` reasons, every one it
raises), the completion statuses in every page that lists them (the schema's enum and the code's
``STATUSES``), and the rule for which completion counts, stated once and linked from elsewhere.
"""

from __future__ import annotations

import json
import re

from processor.jobs import codec as jobs_codec
from processor.wire import job_share
from processor.wire.errors import DECODE_REASONS, FRAME_REASONS, ITEM_REASONS
from processor.wire.records import STATUSES
from processor.wire.schemas import HEADERS
from tests.common import ROOT

DOCS = ROOT / "docs"
RULE = "Which completion of an item counts"


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (any level), up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    assert m, f"no heading {heading!r}"
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.M).search(text, m.end())
    return text[m.end() : end.start() if end else len(text)]


def first_table_names(text: str) -> list[str]:
    """The backticked names of the first column of the first table in ``text``."""
    rows = re.findall(r"^\| ([^|]+) \|", text[text.index("\n|") :], re.M)
    names: list[str] = []
    for cell in rows:
        if set(cell) <= {"-", " "} or not cell.startswith(("`", "1", "2", "3", "4", "5", "6", "7", "8", "9")):
            continue
        names += re.findall(r"`([^`]+)`", cell)
    return names


def code_header(record: str) -> str:
    header = {"Job": jobs_codec.HEADER, "JobShare": job_share.JOB_SHARE_HEADER}.get(record) or HEADERS[record]
    return header.hex(" ")


def test_each_record_section_names_the_codes_header_and_every_field_in_order() -> None:
    text = read("wire-format.md")
    records = re.findall(r"^`schemas/(\w+)\.avsc`, header `([0-9a-f ]+)`", text, re.M)
    assert {r for r, _ in records} == {*HEADERS, "Job", "JobShare"}
    for record, header in records:
        assert header == code_header(record), f"docs/wire-format.md: {record}'s header is stale"
        table = section(text, record)
        fields = re.findall(r"^\| \d+ \| `(\w+)` \|", table[: table.index("\n\n", table.index("\n|"))], re.M)
        schema = json.loads((ROOT / "schemas" / f"{record}.avsc").read_text(encoding="utf-8"))
        assert fields == [f["name"] for f in schema["fields"]], f"docs/wire-format.md: {record}'s fields"


def test_every_reason_the_code_raises_is_in_its_list_in_order() -> None:
    sources = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "processor").rglob("*.py"))
    raised = set(re.findall(r'DecodeError\(\s*"([a-z-]+)"', sources))
    rules = (ROOT / "processor" / "wire" / "records.py").read_text(encoding="utf-8")
    body = rules[rules.index("def item_problem(") :]
    checked = re.findall(r'return \(?\s*"([a-z-]+)",', body[: body.index("return None")])
    assert tuple(checked) == ITEM_REASONS
    assert raised <= set(DECODE_REASONS), raised - set(DECODE_REASONS)


def test_the_dead_letter_tables_list_the_codes_reasons() -> None:
    rejected = section(read("wire-format.md"), "What the decoders reject")
    assert set(first_table_names(rejected)) == set(DECODE_REASONS)
    consumers = section(read("consumers.md"), "Dead letters")
    assert first_table_names(consumers) == [*FRAME_REASONS, *ITEM_REASONS]  # what a Batch can break
    producers = section(read("producers.md"), "The record")
    assert re.findall(r"`([a-z-]+)`", producers[: producers.index(".\n")]) == list(ITEM_REASONS)


def test_every_page_that_lists_the_statuses_lists_them_all() -> None:
    schema = json.loads((ROOT / "schemas" / "Completion.avsc").read_text(encoding="utf-8"))
    (status,) = [f for f in schema["fields"] if f["name"] == "status"]
    assert tuple(status["type"]["symbols"]) == STATUSES
    for page, text in (
        ("producers.md", section(read("producers.md"), "Results")),
        ("consumer-contract.md", read("consumer-contract.md")),
        ("wire-format.md", section(read("wire-format.md"), "Completion")),
    ):
        missing = [s for s in STATUSES if f"`{s}`" not in text]
        assert not missing, f"docs/{page} does not name the statuses {missing}"


def test_which_completion_counts_is_stated_once_and_linked() -> None:
    assert section(read("wire-format.md"), RULE).count("greatest `attempt`") == 1
    for page in ("producers.md", "operations.md"):
        assert f'"{RULE}"' in read(page), f"docs/{page} does not link the rule"
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        assert "keep the first completion" not in text and "keeps the first completion" not in text, page.name


def test_no_doc_cites_a_file_that_is_gone() -> None:
    for page in sorted(DOCS.glob("*.md")):
        for path in re.findall(
            r"`((?:tests|processor|benchmarks|schemas|k8s)/[\w/.-]+\.(?:py|avsc|json|yml|yaml))`",
            page.read_text(encoding="utf-8"),
        ):
            assert (ROOT / path).exists(), f"docs/{page.name} cites {path}, which is not in the repository"
