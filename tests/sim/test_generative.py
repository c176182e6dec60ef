"""The generative backlog: templated's rows with production-length prefixes that rows truly share."""

from __future__ import annotations

import struct

from processor.sim.generative import (
    MAX_PROMPT_TOKENS,
    PREFIX_SCALE,
    cacheable_tokens,
    generative_rows,
    generative_tokens,
    generative_workload,
)
from processor.sim.templated import CLS_ID, SEP_ID, build_records, load_workload


def _ids(payload: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(payload) // 4}I", payload))


def test_prefixes_are_scaled_and_the_rows_are_templated_s() -> None:
    base, gen = load_workload(), generative_workload()
    assert [t.prefix_tokens for t in gen.templates] == [
        PREFIX_SCALE * t.prefix_tokens for t in base.templates
    ]
    assert (
        min(t.prefix_tokens for t in gen.templates) == 208
        and max(t.prefix_tokens for t in gen.templates) == 1664
    )
    rows, templated = generative_rows(400), build_records()[:400]
    assert [(r.record.id, r.template, r.record.shape) for r in rows] == [
        (r.record.id, r.template, r.record.shape) for r in templated
    ]
    assert all(r.record.length <= MAX_PROMPT_TOKENS for r in rows)
    # a user part that fitted beside MiniLM's prefix keeps its length (the same trace row, divided by 10)
    assert sum(a.user_tokens == b.user_tokens for a, b in zip(rows, templated, strict=True)) > 0.95 * len(
        rows
    )


def test_rows_of_a_template_share_exactly_its_prefix() -> None:
    rows = generative_rows(200)
    prefix_of = {t.name: t.prefix_tokens for t in generative_workload().templates}
    seen: dict[str, list[int]] = {}
    for row in rows:
        ids = _ids(generative_tokens(row))
        assert len(ids) == row.record.length
        assert ids[0] == CLS_ID and ids[-1] == SEP_ID
        prefix = ids[1 : 1 + prefix_of[row.template]]
        assert seen.setdefault(row.template, prefix) == prefix
        assert len(ids) - 2 - len(prefix) == row.user_tokens
    firsts = [p[:16] for p in seen.values()]
    assert len({tuple(p) for p in firsts}) == len(firsts)  # templates do not share their prefixes
    assert cacheable_tokens(rows) == sum(1 + prefix_of[r.template] for r in rows)
