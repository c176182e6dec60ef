"""A run's per-card figures from the batches read back: padding, fill, shape switches, modelled cache."""

from __future__ import annotations

from processor.local.compare import CardFigures, RunFigures, _Batch, _card


def _b(n: int, t: int, shapes: set[int], items: int = 2, padded: int = 100, real: int = 150) -> _Batch:
    return _Batch("c", f"b{n}", t, padded, real, frozenset(shapes), items)


def test_waste_fill_switches_and_the_modelled_cache() -> None:
    batches = [_b(1, 1, {1}), _b(2, 2, {1}), _b(3, 3, {2}), _b(4, 4, {1, 2}), _b(5, 5, {3, 4, 5, 6, 7})]
    f = _card(batches, budget=400, cache_shapes=4)
    assert (f.batches, f.items, f.padded_tokens, f.real_tokens) == (5, 10, 1000, 750)
    assert f.padding_waste == 0.25
    assert f.budget_fill == 1000 / (5 * 400)
    assert f.shape_switches == 3  # {1}->{2}->{1,2}->{3..7}
    assert f.mixed_shape_batches == 2
    assert f.cache_hits == 2  # batch 2 ({1} cached) and batch 4 ({1,2} cached); 5 shapes never fit in 4
    assert f.shapes == 7


def test_a_single_oversized_item_is_left_out_of_budget_fill() -> None:
    f = _card([_b(1, 1, {1}, items=1, padded=900, real=900), _b(2, 2, {1}, padded=100, real=200)], 400, 4)
    assert f.fill_batches == 1 and f.budget_fill == 200 / 400


def test_run_figures_add_up_cards() -> None:
    run = RunFigures("embed", completed_tokens=1000, makespan_s=4.0)
    run.cards = {"a": CardFigures(100, batches=2, real_tokens=90, padded_tokens=100, fill_batches=2,
                                  fill_padded_tokens=100),
                 "b": CardFigures(200, batches=2, real_tokens=100, padded_tokens=200, fill_batches=2,
                                  fill_padded_tokens=200)}  # fmt: skip
    assert run.real_tokens_per_s == 250
    assert abs(run.padding_waste - (1 - 190 / 300)) < 1e-12
    assert run.budget_fill == 300 / 600
    d = run.to_dict()
    for key in ("engine", "items", "items_completed_once", "audit_clean", "makespan_s", "real_tokens_per_s",
                "padding_waste", "budget_fill", "shape_switches", "cache_hit_rate"):  # fmt: skip
        assert key in d
