"""The templated backlog: rows rendered from a few prompt templates, the offline job tokenfabric is for.

A platform team's backlog is many rows rendered from a handful of prompt templates: each template's
cacheable components (system prompt, few-shot block, tool schema) are shared by all its rows, and each
row adds a user part of its own length. This module builds that workload, deterministically, from
shipped data only:

* the templates: ``data/templates/*.json`` (the ``tokenfabric submit`` template format, docs/jobs.md),
  listed in ``data/templates/manifest.json`` in popularity order with the MiniLM word-piece count of
  their cacheable text (``prefix_tokens``, checked against the real tokenizer by the tests);
* the user parts' lengths: the real prompt lengths (``ContextTokens``) of the shipped Azure LLM
  inference 2023 conversation trace (``azure_conv``, CC BY 4.0, data/traces/README.md), row by row in
  arrival order, **scaled** by ``1 / length_divisor`` (10: the trace's prompts are for a chat LLM, up to
  14k tokens, and the embed engine takes at most 512) and **clipped** so that ``[CLS] + prefix + user +
  [SEP]`` fits ``max_tokens`` (512, MiniLM's positions; about 1% of rows are clipped);
* the template of each row: Zipf(``zipf_s``) over the templates' popularity ranks, drawn with
  ``random.Random(seed)``, so a (manifest, trace) pair names one exact workload everywhere.

An item's shape is ``shape_signature(template's cacheable texts)`` (processor.core.signature), exactly
what ``tokenfabric submit`` gives a row of that template; its length is ``2 + prefix_tokens + user``;
``output_length`` is the row's ``GeneratedTokens``; ``t_ms`` its arrival time in the Azure trace.

The result is shipped as the named trace ``templated`` (``data/traces/templated_trace.jsonl.gz``, the
native ``jsonl`` format plus ``template`` and ``user_tokens`` keys that readers ignore), so ``demo``,
``simulate`` and ``produce`` replay it like any other; ``python -m processor.sim.templated`` rewrites
it and the tests check that the shipped file is what this module builds.

Token ids: items for the embed engine need ids in MiniLM's vocabulary (the producer's
``synthetic_tokens`` are 17-bit). :func:`wordpiece_tokens` gives ``[CLS]``, ``length - 2`` stand-in word
pieces (deterministic per item id) and ``[SEP]``: the cost of a forward pass depends on the count, not
the text, so only the lengths (real) matter.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import random
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from processor.core.signature import shape_signature
from processor.sim.traces import TraceError, TraceRecord, read_shipped

__all__ = [
    "MANIFEST",
    "TemplateSpec",
    "Workload",
    "build_records",
    "load_workload",
    "templated_records",
    "wordpiece_tokens",
    "write_trace",
]

MANIFEST = "manifest.json"
#: MiniLM's special tokens and the first and last ordinary word piece of its 30,522-id vocabulary.
CLS_ID, SEP_ID = 101, 102
FIRST_PIECE, VOCAB_SIZE = 1996, 30522


@dataclass(frozen=True, slots=True)
class TemplateSpec:
    """One template of the workload: its cacheable texts, in order, and their word-piece count."""

    name: str
    components: tuple[str, ...]
    prefix_tokens: int
    model: str

    @property
    def shape(self) -> int:
        return shape_signature(self.components)


@dataclass(frozen=True, slots=True)
class Workload:
    """The manifest: templates in popularity order (rank 0 the most popular) and how rows are drawn."""

    templates: tuple[TemplateSpec, ...]
    seed: int
    zipf_s: float
    length_source: str
    length_divisor: int
    max_tokens: int
    items: int

    def weights(self) -> list[float]:
        """Zipf weights of the popularity ranks: rank k weighs 1 / (k + 1) ** zipf_s."""
        return [1.0 / (k + 1) ** self.zipf_s for k in range(len(self.templates))]

    def user_tokens(self, context_tokens: int, template: TemplateSpec) -> int:
        """A trace prompt length scaled by 1/length_divisor, clipped to fit beside the prefix."""
        room = self.max_tokens - 2 - template.prefix_tokens
        return max(1, min(room, math.ceil(context_tokens / self.length_divisor)))


def templates_dir() -> Path:
    """``data/templates`` of the checkout that holds this package (TraceError if there is none)."""
    here = Path(__file__).resolve().parent
    for folder in (here, *here.parents):
        candidate = folder / "data" / "templates"
        if (candidate / MANIFEST).is_file():
            return candidate
    raise TraceError(f"no data/templates/{MANIFEST} above {here} (the templates ship with the repository)")


def load_workload(folder: Path | None = None) -> Workload:
    """The manifest and every template it lists; TraceError with one line for a bad file."""
    folder = folder or templates_dir()
    path = folder / MANIFEST
    try:
        raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        specs = []
        for entry in raw["templates"]:
            doc = json.loads((folder / entry["file"]).read_text(encoding="utf-8"))
            components = tuple(p["text"] for p in doc["parts"] if p.get("cacheable", False))
            specs.append(
                TemplateSpec(Path(entry["file"]).stem, components, int(entry["prefix_tokens"]), doc["model"])
            )
        return Workload(
            templates=tuple(specs),
            seed=int(raw["seed"]),
            zipf_s=float(raw["zipf_s"]),
            length_source=str(raw["length_source"]),
            length_divisor=int(raw["length_divisor"]),
            max_tokens=int(raw["max_tokens"]),
            items=int(raw["items"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TraceError(f"{path}: cannot read the templated workload: {exc}") from None


@dataclass(frozen=True, slots=True)
class TemplatedRow:
    """A record of the templated trace, with the template it came from and its user part's length."""

    record: TraceRecord
    template: str
    user_tokens: int


def templated_records(workload: Workload, lengths: Sequence[TraceRecord]) -> list[TemplatedRow]:
    """One row per record of ``lengths`` (a real trace, in arrival order), ``workload.items`` at most."""
    rng = random.Random(workload.seed)
    weights = workload.weights()
    ranks = range(len(workload.templates))
    shapes = [t.shape for t in workload.templates]
    rows = []
    for index, source in enumerate(lengths[: workload.items]):
        rank = rng.choices(ranks, weights)[0]
        template = workload.templates[rank]
        user = workload.user_tokens(source.length, template)
        record = TraceRecord(
            t_ms=source.t_ms,
            model=template.model,
            shape=shapes[rank],
            length=2 + template.prefix_tokens + user,
            id=str(index),
            output_length=source.output_length,
            line=index + 1,
        )
        rows.append(TemplatedRow(record, template.name, user))
    return rows


def build_records(workload: Workload | None = None) -> list[TemplatedRow]:
    """The shipped templated trace, built from the manifest and the shipped length source."""
    workload = workload or load_workload()
    source = read_shipped(workload.length_source, limit=workload.items)
    return templated_records(workload, source)


def _lines(rows: Sequence[TemplatedRow]) -> Iterator[str]:
    for row in rows:
        r = row.record
        obj = {
            "t_ms": r.t_ms,
            "model": r.model,
            "shape": r.shape,
            "length": r.length,
            "id": r.id,
            "output_length": r.output_length,
            "template": row.template,
            "user_tokens": row.user_tokens,
        }
        yield json.dumps(obj, separators=(",", ":")) + "\n"


def trace_bytes(rows: Sequence[TemplatedRow]) -> bytes:
    """The uncompressed JSON Lines content of the trace (what the tests compare)."""
    return "".join(_lines(rows)).encode("utf-8")


def write_trace(path: Path, rows: Sequence[TemplatedRow]) -> None:
    """Gzip (level 9, no name or time in the header) so that the same rows give the same bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0) as out:
        out.write(trace_bytes(rows))
    path.write_bytes(buffer.getvalue())


def wordpiece_tokens(item_id: str, length: int) -> bytes:
    """``[CLS]``, ``length - 2`` stand-in word pieces drawn from a seed of the item id, ``[SEP]``.

    Packed little-endian uint32 as the wire's ``tokens`` field expects; every id is in MiniLM's
    vocabulary, so the embed engine runs the item (a ``length`` under 2 gives ``[CLS] [SEP]``).
    """
    rng = random.Random(xxhash.xxh3_64_intdigest(item_id.encode("utf-8")))
    pieces = [rng.randrange(FIRST_PIECE, VOCAB_SIZE) for _ in range(max(0, length - 2))]
    return struct.pack(f"<{len(pieces) + 2}I", CLS_ID, *pieces, SEP_ID)


if __name__ == "__main__":  # rewrite the shipped trace: python -m processor.sim.templated
    from processor.sim.traces import shipped_trace

    target = shipped_trace("azure_conv").parent / "templated_trace.jsonl.gz"
    built = build_records()
    write_trace(target, built)
    print(f"wrote {len(built):,} rows to {target}")
