"""``demo --repeat``: the runs' order alternates, the report stands on the median repeat, and the JSON
carries the median makespan, its range, and every repeat with the headline keys."""

from __future__ import annotations

from processor.cli.demo_repeats import HEADLINE_KEYS, headline, median_repeat, run_dict, run_order
from processor.local.compare import RunFigures

RUNS = ("tokenfabric", "plain-queue", "share-queue")


def _run(makespan_s: float, duplicates: int = 0) -> RunFigures:
    f = RunFigures("llm", items=10, tokens=100, items_completed_once=10, audit_clean=True)
    f.makespan_s, f.duplicate_completions, f.prefix_tokens = makespan_s, duplicates, 80
    return f


def test_the_order_alternates_between_repeats() -> None:
    assert run_order(RUNS, 0) == list(RUNS)
    assert run_order(RUNS, 1) == list(reversed(RUNS))
    assert run_order(RUNS, 2) == list(RUNS)


def test_the_median_repeat_is_one_of_the_repeats_and_the_lower_middle_for_an_even_count() -> None:
    repeats = [_run(9.0), _run(7.0), _run(8.0)]
    assert median_repeat(repeats) is repeats[2]
    assert median_repeat([_run(2.0), _run(1.0)]).makespan_s == 1.0


def test_a_runs_json_has_the_headline_keys_the_median_and_every_repeat() -> None:
    repeats = [_run(9.0), _run(7.0, duplicates=2), _run(8.0)]
    doc = run_dict(repeats, audits=False)
    assert set(HEADLINE_KEYS) <= set(doc)
    assert doc["makespan_s"] == 8.0 and doc["makespan_s_range"] == [7.0, 9.0]
    assert doc["audit_clean"] is None  # a run that cannot audit says so
    assert [r["makespan_s"] for r in doc["repeats"]] == [9.0, 7.0, 8.0]
    assert [r["duplicates"] for r in doc["repeats"]] == [0, 2, 0]
    assert all(set(HEADLINE_KEYS) <= set(r) for r in doc["repeats"])
    assert run_dict(repeats, audits=True)["audit_clean"] is True


def test_the_headline_compares_tokenfabric_with_the_better_baseline() -> None:
    line = headline({"tokenfabric": [_run(4.0)], "plain-queue": [_run(10.0)], "share-queue": [_run(8.0)]})
    assert "better baseline (share-queue) / tokenfabric: 2.00x" in line
    assert max(len(text) for text in line.splitlines()) <= 80
