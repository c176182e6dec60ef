"""The synthetic trace generator (processor/sim/tracegen.py)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from processor.core.signature import shape_signature
from processor.sim.tracegen import (
    synthetic_records,
    synthetic_shape,
    template_shape,
    templated_records,
    write_jsonl,
)
from processor.sim.traces import read_trace

# ---------------------------------------------------------------------------------------- tracegen


def test_synthetic_records_deterministic_and_bounded() -> None:
    kw = {"shapes": 50, "models": ("a", "b", "c"), "min_len": 16, "max_len": 4096, "rate_per_s": 200.0}
    a = synthetic_records(5_000, seed=7, **kw)  # type: ignore[arg-type]
    assert a == synthetic_records(5_000, seed=7, **kw)  # type: ignore[arg-type]
    assert a != synthetic_records(5_000, seed=8, **kw)  # type: ignore[arg-type]
    assert all(16 <= r.length <= 4096 for r in a)
    assert {r.model for r in a} == {"a", "b", "c"}
    signatures = {synthetic_shape(k) for k in range(50)}
    assert {r.shape for r in a} <= signatures and synthetic_shape(0) == shape_signature(["synthetic-shape-0"])
    counts: dict[int, int] = {}
    for r in a:
        counts[r.shape] = counts.get(r.shape, 0) + 1
    assert max(counts, key=lambda s: counts[s]) == synthetic_shape(0)  # Zipf: rank 0 is hottest
    times = [r.t_ms for r in a]
    assert times == sorted(times) and 15_000 < times[-1] < 35_000  # ~5000 / 200 per s = 25 s
    lengths = sorted(r.length for r in a)
    assert lengths[0] < lengths[len(lengths) // 2] < lengths[-1]


def test_synthetic_edge_cases() -> None:
    burst = synthetic_records(10, seed=1, shapes=1, min_len=8, max_len=8, rate_per_s=None)
    assert [(r.t_ms, r.length, r.shape, r.model) for r in burst] == [
        (0, 8, synthetic_shape(0), "default")
    ] * 10
    assert synthetic_records(0, seed=1, shapes=3, min_len=1, max_len=2, rate_per_s=1.0) == []
    with pytest.raises(ValueError):
        synthetic_records(1, seed=1, shapes=3, min_len=5, max_len=2, rate_per_s=1.0)
    with pytest.raises(ValueError):
        synthetic_records(1, seed=1, shapes=0, min_len=1, max_len=2, rate_per_s=1.0)


@pytest.mark.parametrize("name", ["syn.jsonl", "syn.jsonl.gz"])
def test_write_jsonl_round_trips(tmp_path: Path, name: str) -> None:
    records = synthetic_records(
        300, seed=3, shapes=5, models=("x", "y"), min_len=1, max_len=900, rate_per_s=50
    )
    records[4] = msgspec.structs.replace(records[4], output_length=12)
    records[5] = msgspec.structs.replace(records[5], job="nightly")
    path = write_jsonl(records, tmp_path / name)
    assert read_trace(path, "jsonl") == records


def test_templated_records_are_prefix_plus_user_part_with_zipf_templates_split_over_models() -> None:
    users = [0, 10, 200, 3000]
    kw = {"templates": 10, "models": ("a", "b"), "prefix_min": 150, "prefix_max": 2500}
    recs = templated_records(4000, seed=5, user_lengths=users, **kw)  # type: ignore[arg-type]
    assert recs == templated_records(4000, seed=5, user_lengths=users, **kw)  # type: ignore[arg-type]
    assert recs != templated_records(4000, seed=6, user_lengths=users, **kw)  # type: ignore[arg-type]
    assert all(r.t_ms == 0 for r in recs)  # a backlog
    by_shape: dict[int, list[int]] = {}
    model_of: dict[int, str] = {}
    for r in recs:
        by_shape.setdefault(r.shape, []).append(r.length)
        assert model_of.setdefault(r.shape, r.model) == r.model  # a template belongs to one model
    assert set(by_shape) == {template_shape(k) for k in range(10)}
    for lengths in by_shape.values():
        prefix = min(lengths)  # a user part of 0 tokens is drawn for every template at this size
        assert 150 <= prefix <= 2500 and {n - prefix for n in lengths} == set(users)
    assert [model_of[template_shape(k)] for k in range(10)] == ["a"] * 5 + ["b"] * 5  # hottest half on a
    counts = sorted(((len(v), s) for s, v in by_shape.items()), reverse=True)
    assert counts[0][1] == template_shape(0)  # Zipf: rank 0 is hottest
    streamed = templated_records(500, seed=5, user_lengths=users, rate_per_s=100.0)
    assert [r.t_ms for r in streamed] == sorted(r.t_ms for r in streamed) and streamed[-1].t_ms > 0
    with pytest.raises(ValueError):
        templated_records(1, seed=1, user_lengths=[])
    with pytest.raises(ValueError):
        templated_records(1, seed=1, user_lengths=[5], prefix_min=10, prefix_max=5)
