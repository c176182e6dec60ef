"""The sizing calculator (benchmarks/sizing.py): docs/operations.md shows what it prints, and the
fleet it sizes grows with the load as it must."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.benchmarks.helpers import load_script, run
from tests.common import ROOT

sizing = load_script("sizing")


def test_docs_operations_shows_the_tables_the_calculator_prints() -> None:
    printed = run("sizing.py", "--markdown").stdout.strip()
    assert printed in (ROOT / "docs" / "operations.md").read_text(), (
        "rerun: python benchmarks/sizing.py --markdown"
    )


def test_the_fleet_grows_with_the_load_and_processors_never_outnumber_partitions() -> None:
    m = sizing.Measured()
    small = sizing.fleet(sizing.Load(tokens_per_day=1e10), m)
    big = sizing.fleet(sizing.Load(tokens_per_day=1e12), m)
    assert big.processors > small.processors and big.consumers == pytest.approx(
        100 * small.consumers, rel=0.05
    )
    for f in (small, big):
        assert 2 <= f.processors <= f.partitions and f.brokers >= 3
    assert big.restore_s == pytest.approx(100 * small.restore_s * small.partitions / big.partitions)


def test_what_breaks_first_is_the_hand_back_with_small_items_and_the_brokers_with_large() -> None:
    m = sizing.Measured()
    small = sizing.limits(sizing.Load(tokens_per_day=1e10, tokens_per_item=100), m)
    first, factor = next(iter(small.items()))
    assert first.startswith("restore pause") and 1 < factor < 10
    large = sizing.limits(sizing.Load(tokens_per_day=1e10, tokens_per_item=1_000), m)
    assert next(iter(large)) == "broker throughput"
    faster = replace(m, restore_items_per_s=2 * m.restore_items_per_s)
    assert sizing.limits(sizing.Load(tokens_per_item=100), faster)[first] == pytest.approx(2 * factor)


def test_a_bad_argument_is_one_line() -> None:
    with pytest.raises(SystemExit) as ended:
        sizing.main(["--tokens-per-day", "0"])
    assert ended.value.code == 2
