"""The templated backlog: the shipped trace is what the generator builds from the shipped templates."""

from __future__ import annotations

import gzip
import struct
from collections import Counter
from pathlib import Path

from processor.core.signature import shape_signature
from processor.sim.templated import (
    CLS_ID,
    SEP_ID,
    VOCAB_SIZE,
    build_records,
    load_workload,
    templates_dir,
    trace_bytes,
    wordpiece_tokens,
)
from processor.sim.traces import read_shipped, shipped_trace


def test_the_shipped_trace_is_what_the_generator_builds() -> None:
    shipped = gzip.decompress(shipped_trace("templated").read_bytes())
    assert shipped == trace_bytes(build_records())


def test_rows_follow_the_templates_and_fit_the_embed_engine() -> None:
    workload = load_workload()
    records = read_shipped("templated")
    assert len(records) == workload.items
    shapes = {t.shape: t for t in workload.templates}
    assert set(Counter(r.shape for r in records)) == set(shapes)
    counts = Counter(r.shape for r in records)
    ranked = [counts[t.shape] for t in workload.templates]
    assert ranked[0] > ranked[-1] * 4  # Zipf: the most popular template far above the least
    for r in records:
        t = shapes[r.shape]
        assert 2 + t.prefix_tokens < r.length <= workload.max_tokens
    assert len({r.length for r in records}) > 300  # user parts of every length


def test_user_lengths_are_the_azure_trace_scaled_and_clipped() -> None:
    workload = load_workload()
    source = read_shipped("azure_conv", limit=200)
    rows = build_records(workload)[:200]
    clipped = 0
    for row, src in zip(rows, source, strict=True):
        room = workload.max_tokens - 2 - (row.record.length - 2 - row.user_tokens)
        scaled = -(-src.length // workload.length_divisor)
        assert row.user_tokens == min(room, scaled)
        clipped += scaled > room
    assert clipped < 20


def test_template_files_are_submit_templates_with_the_same_shape() -> None:
    from processor.jobs.templates import load_template
    from processor.jobs.textprep import TextTokenizer

    tokenizer = TextTokenizer()  # MiniLM's: ./run setup installs it, as tests/jobs/test_textprep.py needs
    folder = templates_dir()
    for spec in load_workload().templates:
        template = load_template(folder / f"{spec.name}.json")
        assert template.shape == spec.shape == shape_signature(spec.components)
        ids = tokenizer.encode_many(["".join(spec.components)])[0].ids
        assert len(ids) - 2 == spec.prefix_tokens, spec.name  # without [CLS] and [SEP]


def test_wordpiece_tokens_are_framed_in_vocabulary_and_deterministic() -> None:
    raw = wordpiece_tokens("item-7", 40)
    ids = struct.unpack(f"<{len(raw) // 4}I", raw)
    assert len(ids) == 40 and ids[0] == CLS_ID and ids[-1] == SEP_ID
    assert all(1000 < i < VOCAB_SIZE for i in ids[1:-1])
    assert wordpiece_tokens("item-7", 40) == raw != wordpiece_tokens("item-8", 40)


def test_the_templates_readme_names_every_template() -> None:
    readme = (templates_dir() / "README.md").read_text(encoding="utf-8")
    for spec in load_workload().templates:
        assert f"`{spec.name}.json`" in readme
    assert Path(templates_dir() / "manifest.json").is_file()
