"""docs/wire-format.md lists every header a tokenfabric reader knows, each under its record's name
with its fingerprint: a schema that gains a field cannot ship without its new header there."""

from __future__ import annotations

import re
from pathlib import Path

from processor.jobs import codec as jobs_codec
from processor.wire import completions, control, fastavro_io, items, job_share
from processor.wire.schemas import MAGIC, NAME_BY_FP_BYTES

READERS = (completions, control, fastavro_io, items)
"""The wire modules: importing them registers every earlier schema's header in ``NAME_BY_FP_BYTES``."""

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"
ROW = re.compile(r"^\| (\w+)[^|]* \| `(c3 01(?: [0-9a-f]{2}){8})` \| (\d+) \|$", re.M)


def documented() -> dict[str, tuple[str, int]]:
    """Header hex to (record, fingerprint), from the table under "The header"."""
    return {header: (record, int(fp)) for record, header, fp in ROW.findall(DOC.read_text(encoding="utf-8"))}


def known() -> dict[str, str]:
    """Every header the code reads, to its record name."""
    assert all(module.__name__.startswith("processor.wire.") for module in READERS)
    headers = {(MAGIC + fp).hex(" "): name for fp, name in NAME_BY_FP_BYTES.items()}
    headers[jobs_codec.HEADER.hex(" ")] = "Job"
    shares = (
        job_share.JOB_SHARE_HEADER,
        job_share.PRE_RETRY_JOB_SHARE_HEADER,
        job_share.PREVIOUS_JOB_SHARE_HEADER,
    )
    headers.update(dict.fromkeys((h.hex(" ") for h in shares), "JobShare"))
    return headers


def test_every_header_the_code_reads_is_in_the_table_under_its_record() -> None:
    table = documented()
    for header, name in known().items():
        assert header in table, f"docs/wire-format.md lists no {name} header {header}"
        record, fingerprint = table[header]
        assert record == name and fingerprint == int.from_bytes(bytes.fromhex(header)[2:], "little"), header
    assert len(table) == len(known())  # and nothing the code no longer knows
