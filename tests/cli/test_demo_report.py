"""The demo's report fits the terminal it is printed to, at 80 and at 120 columns, for every engine,
and puts a ratio only beside figures that divide meaningfully (not beside percentages)."""

from __future__ import annotations

import pytest

from processor.cli.demo import cards_for
from processor.cli.demo_report import LLM_RUNS, RUNS
from processor.cli.demo_report import report as _report
from processor.local.compare import CardFigures, RunFigures
from processor.sim.traces import TraceRecord


def _figures(engine: str, cards: list[str], scale: int) -> RunFigures:
    f = RunFigures(engine, "demo-20261203-tf", items=500, tokens=437_850 * scale, items_completed_once=500)
    f.audit_clean, f.makespan_s, f.completed_tokens = True, 13.5 * scale, 437_850
    f.prefix_tokens, f.latencies_ms = 390_348, [258, 1_058, 2_330 * scale]
    for n, name in enumerate(cards):
        f.cards[name] = CardFigures(
            16_384, batches=96 * scale, items=250, real_tokens=261_564, padded_tokens=2_615_640,
            shapes=5 + n, shape_switches=27 * scale, cached_prompt_tokens=110_000, prefill_tokens=151_564,
            output_tokens=343,
        )  # fmt: skip
    return f


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("engine", ["embed", "llm", "sim"])
def test_no_line_is_wider_than_the_terminal(engine: str, width: int) -> None:
    records = [TraceRecord(t_ms=0, model="default", shape=1, length=300, id="0", output_length=8, line=1)]
    cards = cards_for(records, engine)
    names = [c.name for c in cards]
    runs = LLM_RUNS if engine == "llm" else RUNS  # llm: the share-group queue too, slower than plain
    figures = {run: _figures(engine, names, scale) for run, scale in zip(runs, (1, 2, 3), strict=False)}
    codes = {run: dict.fromkeys(names, 0) for run in runs}
    text = _report("generative", records, figures, codes, engine, cards, width)
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text  # nothing cut short
    rows = {line.strip().split("  ")[0]: line for line in text.splitlines()}
    assert rows["makespan (s)"].rstrip().endswith("0.50x")  # times divide, by the better baseline's
    if engine == "llm":
        assert "cached / cacheable" in text and "padding waste" not in text and "share-queue:" in text
        assert rows["cached / cacheable"].rstrip().endswith("56.4%")  # a share: no ratio beside it
    else:
        assert rows["padding waste"].rstrip().endswith("90.0%")
