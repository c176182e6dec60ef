"""Every earlier writer schema a tokenfabric reader still reads ships as an ``.avsc`` file under
``schemas/previous/`` (docs/wire-format.md, "The header"), held to the code: each file's CRC-64-AVRO
fingerprint is the header the code reads under that record's name, and every such header has its
file. An integrator reads what older writers sent from these files, not from a description.

The files are self-contained (a Batch's TokenItem inlined), with the docs of the current schema.
Written from the code's own schemas (only when a schema changed on purpose; then review the diff):
``.venv/bin/python tests/wire/test_previous_schemas.py --write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import to_parsing_canonical_form

from processor.jobs import codec as jobs_codec
from processor.wire import completions, control, fastavro_io, job_share
from processor.wire.schemas import HEADERS, MAGIC, rabin_fingerprint
from tests.wire.test_documented_headers import known

DIR = Path(__file__).resolve().parents[2] / "schemas" / "previous"


def earlier() -> dict[str, tuple[Any, bytes]]:
    """Each earlier schema the code reads: file name -> (its parsed schema, its header)."""
    previous = {
        "TokenItem.before-request": fastavro_io.PREVIOUS_TOKEN_ITEM,
        "Batch.before-request": fastavro_io.PREVIOUS_BATCH,
        "Batch.before-attempts": fastavro_io.PRE_ATTEMPTS_BATCH,
        "Completion.before-cached-tokens": completions.PREVIOUS_COMPLETION,
        "CompletionBatch.before-cached-tokens": completions.PREVIOUS_COMPLETION_BATCH,
        "Completion.before-endings": completions.PRE_ENDINGS_COMPLETION,
        "CompletionBatch.before-endings": completions.PRE_ENDINGS_COMPLETION_BATCH,
        "Completion.before-retries": completions.PRE_RETRY_COMPLETION,
        "CompletionBatch.before-retries": completions.PRE_RETRY_COMPLETION_BATCH,
        "ConsumerContract.before-batching": control._PREVIOUS_CONTRACT,
        "ConsumerContract.before-adapter": control._PRE_ADAPTER_CONTRACT,
        "DeadLetter.before-detail": control._PREVIOUS_DEAD_LETTER,
    }
    out = {f"{name}.avsc": (p.schema, p.header) for name, p in previous.items()}
    shares = job_share
    out["JobShare.before-lifecycle.avsc"] = (shares._PREVIOUS_SCHEMA, shares.PREVIOUS_JOB_SHARE_HEADER)
    out["JobShare.before-max-attempts.avsc"] = (shares._PRE_RETRY_SCHEMA, shares.PRE_RETRY_JOB_SHARE_HEADER)
    return out


def plain(schema: Any) -> Any:
    """A fastavro-parsed schema as JSON Avro: its own ``__`` keys dropped."""
    if isinstance(schema, list):
        return [plain(s) for s in schema]
    if isinstance(schema, dict):
        return {k: plain(v) for k, v in schema.items() if not k.startswith("__")}
    return schema


def text(schema: Any) -> str:
    """Keys sorted: a parsed schema's key order depends on what fastavro parsed before it."""
    return json.dumps(plain(schema), indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def header_of(path: Path) -> bytes:
    """The single-object header a writer of the schema in ``path`` puts before each message."""
    canonical = to_parsing_canonical_form(parse_schema(json.loads(path.read_text(encoding="utf-8")), {}))
    return MAGIC + rabin_fingerprint(canonical.encode()).to_bytes(8, "little")


def test_every_earlier_schema_the_code_reads_ships_as_a_file() -> None:
    current = {h.hex(" ") for h in HEADERS.values()}
    current |= {jobs_codec.HEADER.hex(" "), job_share.JOB_SHARE_HEADER.hex(" ")}
    wanted = {header: name for header, name in known().items() if header not in current}
    files = sorted(DIR.glob("*.avsc"))
    shipped = {header_of(path).hex(" "): path.name for path in files}
    assert set(shipped) == set(wanted), "schemas/previous/ and the headers the code reads differ"
    for header, file in shipped.items():
        assert file.split(".")[0] == wanted[header], f"{file} holds a {wanted[header]} schema"
    assert len(files) == len(shipped)  # no two files of one schema


def test_each_file_is_the_codes_schema_byte_for_byte() -> None:
    for name, (schema, header) in earlier().items():
        path = DIR / name
        assert path.read_text(encoding="utf-8") == text(schema), f"{name}: run this file with --write"
        assert header_of(path) == header, name


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    DIR.mkdir(exist_ok=True)
    for name, (schema, _) in earlier().items():
        (DIR / name).write_text(text(schema), encoding="utf-8")
