"""The simulated engine (processor/engines/sim.py) and building it from string options."""

from __future__ import annotations

import time

import pytest

from processor.core.signature import shape_signature
from processor.engines.base import ItemResult, make_engine
from processor.engines.sim import SimEngine
from processor.sim.cardmodel import CardSpec
from tests.apps.helpers import outgoing_batch, received, token_record

# ------------------------------------------------------------------------------------------------
# engines


def test_sim_engine_at_time_scale_zero_is_instant_and_reports_cache_hits() -> None:
    engine = SimEngine(CardSpec(tokens_per_s=1_000.0, overhead_ms=100.0, cache=2), time_scale=0.0)
    shape_a, shape_b = shape_signature(["a"]), shape_signature(["b"])
    batch_a = received(
        outgoing_batch(
            "b1",
            "card-a",
            [token_record("i1", 100, shape_a, output_budget=7), token_record("i2", 50, shape_a)],
            padded_length=104,
        )
    )
    batch_b = received(outgoing_batch("b2", "card-a", [token_record("i3", 10, shape_b)], padded_length=16))
    started = time.perf_counter()
    first = engine.run(batch_a)
    assert engine.last_batch_ms == pytest.approx(100.0 + 208 * 1000.0 / 1000.0)  # modelled, not slept
    second = engine.run(batch_a)
    other = engine.run(batch_b)
    assert time.perf_counter() - started < 0.1
    assert [r.item_id for r in first] == ["i1", "i2"]
    assert [r.cache_hit for r in first + second + other] == [False, False, True, True, False]
    assert first[0] == ItemResult("i1", "ok", b"sim:i1", 7, None, False)
    assert 1 <= first[1].output_tokens <= 64  # no budget: a small deterministic number
    assert second[1].output_tokens == first[1].output_tokens


def test_sim_engine_sleeps_the_scaled_model_time() -> None:
    engine = SimEngine(CardSpec(tokens_per_s=1_000.0, overhead_ms=0.0), time_scale=0.5)
    batch = received(outgoing_batch("b1", "card-a", [token_record("i1", 100, 1)], padded_length=200))
    started = time.perf_counter()
    engine.run(batch)  # 200 tokens at 1000/s = 200 ms, halved
    assert 0.09 <= time.perf_counter() - started < 0.5


def test_make_engine_builds_sim_from_strings_and_refuses_the_rest() -> None:
    engine = make_engine("sim", {"tps": "2000", "overhead_ms": "1", "cache": "3", "time_scale": "0"})
    assert isinstance(engine, SimEngine)
    assert engine.card == CardSpec(tokens_per_s=2000.0, overhead_ms=1.0, cache=3)
    assert engine.time_scale == 0.0
    with pytest.raises(ValueError, match="unknown engine 'gpu'"):
        make_engine("gpu", {})
    with pytest.raises(ValueError, match="tps='fast' is not a number"):
        make_engine("sim", {"tps": "fast"})
    with pytest.raises(ValueError, match="unknown option"):
        make_engine("sim", {"batch": "1"})
    with pytest.raises(ValueError, match="tps must be > 0"):
        make_engine("sim", {"tps": "0"})
