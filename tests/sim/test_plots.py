"""Charts: `simulate --plot` and the demo's chart are real PNG files built from simulation reports."""

from __future__ import annotations

from pathlib import Path

from processor.cli.demo import _plot
from processor.cli.tokenfabric import main
from processor.local.pipeline import DEFAULT_CARDS
from processor.sim.traces import read_shipped, shipped_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_simulate_plot_writes_a_png(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "chart.png"
    trace = shipped_trace("mooncake_synthetic")
    code = main(
        [
            "simulate",
            "--trace",
            str(trace),
            "--format",
            "mooncake",
            "--limit",
            "300",
            "--backlog",
            "--policy",
            "all",
            "--plot",
            str(out),
        ]
    )
    assert code == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert out.stat().st_size > 10_000  # four panels, not an empty canvas
    assert "padding waste" in capsys.readouterr().out


def test_the_demo_chart_compares_every_policy_on_its_trace(tmp_path: Path) -> None:
    out = tmp_path / "demo.png"
    _plot(read_shipped("azure_code", limit=200), DEFAULT_CARDS, "default", str(out))
    assert out.read_bytes()[:8] == PNG_MAGIC
